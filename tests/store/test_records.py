"""What the store hands out is plain frozen data, never an ORM row: one machine's row (`get`,
the API's worker token), the admin API's list, config versions, worker sightings, providers,
chart samples, evaluations, keys, mock machines, boot phases — and no public function of a
store module says it returns an ORM class; and every conditional write of an instance row goes
through `moves.update_rows`, on SQLite and PostgreSQL."""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import pkgutil
import typing
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

import autoscaler.store
from autoscaler.access import keys
from autoscaler.lifecycle import InstanceState as S
from autoscaler.store import (
    api_keys,
    boot_phases,
    config_versions,
    instances,
    machine_views,
    mock_machines,
    moves,
    providers,
    queue_samples,
    queue_status,
    worker_sightings,
)
from autoscaler.store.db import transaction
from autoscaler.store.instances import STATE_SINCE, InstanceDetails
from autoscaler.store.models import Base, BootPhase, Instance, MockMachine

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
        (listed,) = machine_views.instance_rows(s)
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


# ------------------------------------------------------------------ no ORM row leaves store/

NOT_REPOSITORIES = {"models", "db", "migrate"}
"""Store modules whose public names may speak of ORM classes: the models themselves, the engine
and session helpers, the migrations."""


def public_store_functions() -> Iterator[tuple[str, Callable[..., Any]]]:
    """Every public function of every store module (but NOT_REPOSITORIES), and every public
    method of the classes they define, by qualified name."""
    for info in pkgutil.iter_modules(autoscaler.store.__path__):
        if info.name in NOT_REPOSITORIES:
            continue
        module = importlib.import_module(f"autoscaler.store.{info.name}")
        for name, obj in vars(module).items():
            if name.startswith("_") or getattr(obj, "__module__", None) != module.__name__:
                continue
            if inspect.isfunction(obj):
                yield f"{module.__name__}.{name}", obj
            elif inspect.isclass(obj):
                for attr, member in vars(obj).items():
                    if not attr.startswith("_") and inspect.isfunction(member):
                        yield f"{module.__name__}.{name}.{attr}", member


def orm_classes_named(hint: Any) -> list[str]:
    """The ORM classes a type names, however deep: `Instance`, `Instance | None`,
    `list[Instance]`, `tuple[MockMachine, bool]`, `dict[str, QueueStatus]`, `type[Instance]` …"""
    if isinstance(hint, type) and issubclass(hint, Base):
        return [hint.__name__]
    return [name for arg in typing.get_args(hint) for name in orm_classes_named(arg)]


def orm_returns(functions: typing.Iterable[tuple[str, Callable[..., Any]]]) -> list[str]:
    """`name -> ORM class` for each function whose return annotation names an ORM class (a
    function without a return annotation is named too: it could return anything)."""
    out = []
    for name, fn in functions:
        hints = typing.get_type_hints(fn)
        if "return" not in hints:
            out.append(f"{name} -> (no return annotation)")
        elif named := orm_classes_named(hints["return"]):
            out.append(f"{name} -> {', '.join(named)}")
    return out


def test_no_public_store_function_returns_an_orm_row():
    functions = dict(public_store_functions())
    # the walk reaches the repositories and the views, not only a few of them
    for name in (
        "autoscaler.store.worker_sightings.recent",
        "autoscaler.store.providers.get_provider",
        "autoscaler.store.queue_samples.since",
        "autoscaler.store.queue_status.evaluations",
        "autoscaler.store.machine_views.instances",
        "autoscaler.store.mock_machines.StoredMockMachines.get",
    ):
        assert name in functions
    assert orm_returns(functions.items()) == []


def test_the_check_names_every_way_of_returning_an_orm_row():
    def one(session: Any) -> Instance | None: ...
    def many(session: Any) -> list[Instance]: ...
    def pair(session: Any) -> tuple[MockMachine, bool]: ...
    def mapping(session: Any) -> dict[str, typing.Sequence[BootPhase]]: ...
    def record(session: Any) -> InstanceDetails | None: ...
    def unsaid(session: Any): ...  # type: ignore[no-untyped-def]

    assert orm_returns([(f.__name__, f) for f in (one, many, pair, mapping, record, unsaid)]) == [
        "one -> Instance",
        "many -> Instance",
        "pair -> MockMachine",
        "mapping -> BootPhase",
        "unsaid -> (no return annotation)",
    ]


def _frozen(record: Any) -> None:
    assert not isinstance(record, Base)
    field = record._fields[0] if isinstance(record, tuple) else dataclasses.fields(record)[0].name
    with pytest.raises((AttributeError, dataclasses.FrozenInstanceError)):
        setattr(record, field, None)


def test_what_the_tick_the_api_and_the_dashboard_read_are_frozen_records(sessions):
    with transaction(sessions) as s:
        _machine(s)
        worker_sightings.record_enrolled(s, "desk", ["q"], "key-1", 2, T0)
        added = providers.add_provider(s, "gpu", "mock", {"boot_delay": 1}, b"sealed")
        queue_samples.record(s, [{"queue": "q", "at": T0, "pending": 3, "workers": 1}], T0)
        queue_status.record(s, [{"queue": "q", "desired": 2}], 7, T0)
        key = api_keys.add(s, keys.ADMIN, "ops", "digest-1", T0, None)
        mock, created = mock_machines.insert(
            s,
            provider="gpu",
            label="asg-x",
            env={"TOKEN": "t"},
            gpu="g",
            price_per_hour=0.1,
            boots_at=T0,
            will_fail=False,
            now=T0,
        )
        row = instances.get(s, "m1")
        assert row is not None and created
        boot_phases.record(
            s, row, {"started": T0 + timedelta(seconds=6)}, T0 + timedelta(seconds=9)
        )
    with transaction(sessions) as s:
        (seen,) = worker_sightings.recent(s, T0 - timedelta(minutes=1))
        assert (seen.domain, seen.worker, seen.running) == ("", "agent@desk", 2)
        assert seen.queues == {"queues": ["q"], "enrolled_by": "key-1"}
        got = providers.get_provider(s, "gpu")
        assert got == added and got is not None and got.credentials_encrypted == b"sealed"
        assert "sealed" not in repr(got)
        assert providers.list_providers(s) == [got] and providers.get_provider(s, "x") is None
        (sample,) = queue_samples.since(s, T0)
        assert (sample.queue, sample.pending, sample.workers, sample.running) == ("q", 3, 1, None)
        evaluation = queue_status.evaluations(s)["q"]
        assert (evaluation.config_version, evaluation.status["desired"]) == (7, 2)
        assert api_keys.all_keys(s) == [key] == [api_keys.by_hash(s, "digest-1", keys.ADMIN)]
        (revoked,) = api_keys.revoke(s, key.id, T0 + timedelta(hours=1))
        assert revoked.revoked_at is not None and key.revoked_at is None
        assert mock_machines.get(s, "gpu", mock.id) == mock == mock_machines.by_label(s, "asg-x")
        assert mock_machines.list_live(s, "gpu") == [mock]
        (phase,) = boot_phases.of_launch(s, "m1")
        assert (phase.phase, phase.provider, phase.boot) == ("started", "p", 0)
        for record in (seen, got, sample, evaluation, key, revoked, mock, phase):
            _frozen(record)
        providers.remove_provider(s, "gpu")
        assert providers.list_providers(s) == []
