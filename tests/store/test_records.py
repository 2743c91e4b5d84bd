"""What the store hands out is plain frozen data, never an ORM row: one machine's row (`get`,
the API's worker token), the admin API's list, config versions; and every conditional write of
an instance row goes through `moves.update_rows`, on SQLite and PostgreSQL."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta

import pytest

from autoscaler.access import keys
from autoscaler.lifecycle import InstanceState as S
from autoscaler.store import config_versions, instances, moves, views
from autoscaler.store.db import transaction
from autoscaler.store.instances import STATE_SINCE, InstanceDetails
from autoscaler.store.models import Base, Instance

T0 = datetime(2026, 12, 5, 12, 0, tzinfo=UTC)


def test_a_machines_record_carries_every_column_of_its_row():
    names = {f.name for f in dataclasses.fields(InstanceDetails)} - {"since"}
    assert names == set(Instance.__table__.columns.keys())


def test_every_state_names_the_column_a_move_into_it_stamps():
    assert set(STATE_SINCE) == set(S)
    assert set(STATE_SINCE.values()) <= set(Instance.__table__.columns.keys())


def _machine(s, lid: str = "m1", **kw) -> None:
    s.add(
        Instance(
            launch_id=lid,
            queue="q",
            provider="p",
            state=kw.pop("state", S.BOOTING),
            created_at=T0,
            booting_at=T0 + timedelta(seconds=5),
            worker_token_hash=keys.digest(f"token-{lid}"),
            tasks=["j1"],
            **kw,
        )
    )


def test_get_and_the_worker_token_give_frozen_records_read_fresh(sessions):
    with transaction(sessions) as s:
        _machine(s)
    with transaction(sessions) as s:
        row = instances.get(s, "m1")
        assert isinstance(row, InstanceDetails) and not isinstance(row, Base)
        assert (row.state, row.since, row.tasks) == (S.BOOTING, T0 + timedelta(seconds=5), ["j1"])
        with pytest.raises(dataclasses.FrozenInstanceError):
            row.broker_user = "someone"  # type: ignore[misc]
        token = keys.instance_of_token(s, "token-m1")
        assert isinstance(token, InstanceDetails) and token.launch_id == "m1"
        assert keys.instance_of_token(s, "token-other") is None
        # a write after the read is in the next read, not in the record already handed out
        assert moves.move(s, "m1", S.BOOTING, S.READY, T0 + timedelta(seconds=9), "up")
        again = instances.get(s, "m1")
        assert again is not None and again.state == S.READY and row.state == S.BOOTING
        assert again.since == T0 + timedelta(seconds=9) == getattr(again, STATE_SINCE[S.READY])
        assert instances.get(s, "nobody") is None
        (listed,) = views.instance_rows(s)
        assert isinstance(listed, InstanceDetails) and listed.launch_id == "m1"


def test_config_versions_are_frozen_records(sessions):
    with transaction(sessions) as s:
        first = config_versions.record(s, {"queues": {}}, "alice", T0, "why")
        assert first is not None and first.version == 1
        assert config_versions.record(s, {"queues": {}}, "bob", T0) is None
    with transaction(sessions) as s:
        latest = config_versions.latest(s)
        assert latest == first == config_versions.get(s, 1)
        assert list(config_versions.history(s)) == [first]
        with pytest.raises(dataclasses.FrozenInstanceError):
            latest.document = {}  # type: ignore[misc,union-attr]


def test_update_rows_writes_only_where_every_condition_holds(sessions):
    with transaction(sessions) as s:
        _machine(s, "a")
        _machine(s, "b", state=S.READY)
    with transaction(sessions) as s:
        booting = [Instance.state == S.BOOTING]
        assert moves.update_rows(s, booting, {"running_tasks": 3}) == 1
        assert moves.update_rows(s, [Instance.launch_id == "zz"], {"running_tasks": 3}) == 0
        ids = moves.update_rows(s, [Instance.queue == "q"], {"gpu": "A100"}, Instance.launch_id)
        assert sorted(ids) == ["a", "b"]
    with transaction(sessions) as s:
        a, b = instances.get(s, "a"), instances.get(s, "b")
        assert a is not None and b is not None
        assert (a.running_tasks, b.running_tasks, a.gpu, b.gpu) == (3, 0, "A100", "A100")
