"""The mock provider on both databases: boot delay, failures, capacity, prices, shared state,
and stop/start (their delays, resume failures, storage price)."""

from __future__ import annotations

import random
import uuid
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import Engine
from sqlalchemy.orm import Session, sessionmaker

from autoscaler.config.provider_options import MockOptions
from autoscaler.providers import (
    CapacityError,
    LaunchSpec,
    MachineStatus,
    NotOwnedError,
    ResumeRefusedError,
    create_on_first_offer,
)
from autoscaler.providers.mock import MockProvider
from autoscaler.store import mock_machines
from autoscaler.store.db import make_engine, session_factory, transaction
from autoscaler.store.mock_machines import StoredMockMachines
from tests.providers.conftest import INSTALLATION, OTHER_INSTALLATION, spec

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


def mock(
    sessions: sessionmaker[Session],
    now: list[datetime],
    installation: str = INSTALLATION,
    seed: int = 1,
    **cfg: object,
) -> MockProvider:
    config = MockOptions.model_validate({"kind": "mock", **cfg})
    return MockProvider(
        "demo",
        config,
        installation,
        StoredMockMachines(sessions),
        rng=random.Random(seed),
        clock=lambda: now[0],
    )


def launch(installation: str = INSTALLATION) -> LaunchSpec:
    return LaunchSpec.new(installation, uuid.uuid4().hex, {"QUEUE": "q"})


def test_boot_delay_then_running_then_destroyed(sessions: sessionmaker[Session]) -> None:
    now = [T0]
    p = mock(sessions, now, boot_delay=30, price_per_hour=0.25)
    offers = p.find_offers(spec())
    assert [o.price_per_hour for o in offers] == [0.25]
    m = p.create(offers[0], launch())
    assert m.status is MachineStatus.STARTING and m.price_per_hour == 0.25
    now[0] += timedelta(seconds=29)
    assert p.get(m.provider_instance_id).status is MachineStatus.STARTING  # type: ignore[union-attr]
    now[0] += timedelta(seconds=2)
    assert p.get(m.provider_instance_id).status is MachineStatus.RUNNING  # type: ignore[union-attr]
    p.destroy(m.provider_instance_id)
    assert p.get(m.provider_instance_id) is None and p.list_owned() == []
    p.destroy(m.provider_instance_id)  # already gone: success


def test_state_is_shared_through_the_database(db_url: str, engine: Engine) -> None:
    """Two providers on two engines (two processes, as far as the DB can tell) agree."""
    now = [T0]
    a = mock(session_factory(engine), now, boot_delay=0)
    other_engine = make_engine(db_url)
    try:
        b = mock(session_factory(other_engine), now, boot_delay=0)
        m = a.create(a.find_offers(spec())[0], launch())
        assert [x.provider_instance_id for x in b.list_owned()] == [m.provider_instance_id]
        b.destroy(m.provider_instance_id)
        assert a.list_owned() == []
    finally:
        other_engine.dispose()


def test_boot_failures_capacity_errors_and_price_cap(sessions: sessionmaker[Session]) -> None:
    now = [T0]
    failing = mock(sessions, now, boot_delay=1, boot_failure_rate=1.0)
    m = failing.create(failing.find_offers(spec())[0], launch())
    now[0] += timedelta(seconds=2)
    assert failing.get(m.provider_instance_id).status is MachineStatus.DEAD  # type: ignore[union-attr]
    full = mock(sessions, now, capacity_error_rate=1.0)
    with pytest.raises(CapacityError):
        create_on_first_offer(full, full.find_offers(spec()), launch())
    dear = mock(sessions, now, price_per_hour=0.9)
    assert dear.find_offers(spec(max_price_per_hour=0.6)) == []


def test_capacity_rate_is_a_rate(sessions: sessionmaker[Session]) -> None:
    now = [T0]
    p = mock(sessions, now, capacity_error_rate=0.5, seed=7)
    offer = p.find_offers(spec())[0]
    refused = 0
    for _ in range(40):
        try:
            p.create(offer, launch())
        except CapacityError:
            refused += 1
    assert 8 <= refused <= 32
    assert len(p.list_owned()) == 40 - refused


def test_machine_dying_and_idempotent_create(sessions: sessionmaker[Session]) -> None:
    now = [T0]
    p = mock(sessions, now, boot_delay=0)
    lx = launch()
    offer = p.find_offers(spec())[0]
    m = p.create(offer, lx)
    assert p.create(offer, lx).provider_instance_id == m.provider_instance_id  # same launch
    assert p.kill(m.provider_instance_id)
    assert p.get(m.provider_instance_id).status is MachineStatus.DEAD  # type: ignore[union-attr]
    assert len(p.list_owned()) == 1


def test_hand_made_and_foreign_machines_are_not_ours(sessions: sessionmaker[Session]) -> None:
    now = [T0]
    p = mock(sessions, now)
    other = mock(sessions, now, installation=OTHER_INSTALLATION)
    theirs = other.create(other.find_offers(spec())[0], launch(OTHER_INSTALLATION))
    with transaction(sessions) as s:
        hand, _ = mock_machines.insert(
            s,
            provider="demo",
            label="by-hand",
            env={},
            gpu="RTX 4090",
            price_per_hour=1.0,
            boots_at=T0,
            will_fail=False,
            now=T0,
        )
        hand_id = f"mock-{hand.id}"
    mine = p.create(p.find_offers(spec())[0], launch())
    assert [m.provider_instance_id for m in p.list_owned()] == [mine.provider_instance_id]
    for pid in (theirs.provider_instance_id, hand_id):
        assert p.get(pid) is None
        with pytest.raises(NotOwnedError):
            p.destroy(pid)
    assert len(other.list_owned()) == 1
    with transaction(sessions) as s:
        assert {r.label for r in mock_machines.list_live(s, "demo")} >= {"by-hand"}


def test_a_worker_token_never_sits_in_clear_in_the_mock_machines_table(
    sessions: sessionmaker[Session],
) -> None:
    from sqlalchemy import select

    from autoscaler.store.models import MockMachine

    p = mock(sessions, [T0])
    secret = "tok-" + uuid.uuid4().hex
    lid = uuid.uuid4().hex
    spec_ = LaunchSpec.new(INSTALLATION, lid, {"QUEUE": "q", "AUTOSCALER_WORKER_TOKEN": secret})
    p.create(p.find_offers(spec())[0], spec_)
    with sessions() as s:
        row = s.scalar(select(MockMachine).where(MockMachine.label == spec_.label))
        assert row is not None
        assert row.env["QUEUE"] == "q" and row.env["AUTOSCALER_WORKER_TOKEN"] == "***"
        assert secret not in str(row.env)


# ---------------------------------------------------------------- stop / start (warm pools)


def running(
    sessions: sessionmaker[Session], now: list[datetime], **cfg: object
) -> tuple[MockProvider, str]:
    p = mock(sessions, now, boot_delay=0, **cfg)
    m = p.create(p.find_offers(spec())[0], launch())
    assert p.get(m.provider_instance_id).status is MachineStatus.RUNNING  # type: ignore[union-attr]
    return p, m.provider_instance_id


def status(p: MockProvider, machine_id: str) -> MachineStatus:
    got = p.get(machine_id)
    assert got is not None
    return got.status


def test_stop_and_start_take_their_delays(sessions: sessionmaker[Session]) -> None:
    now = [T0]
    p, mid = running(sessions, now, stop_delay=10, start_delay=20, storage_price_per_hour=0.03)
    p.stop(mid)
    assert status(p, mid) is MachineStatus.RUNNING  # stopping: its worker may still run
    assert p.get(mid).raw_status == "stopping"  # type: ignore[union-attr]
    now[0] += timedelta(seconds=5)
    p.stop(mid)  # a second stop keeps the first one's time
    now[0] += timedelta(seconds=5)
    assert status(p, mid) is MachineStatus.STOPPED
    assert p.get(mid).storage_price_per_hour == 0.03  # type: ignore[union-attr]
    p.start(mid)
    now[0] += timedelta(seconds=19)
    assert status(p, mid) is MachineStatus.STARTING
    p.start(mid)  # starting already: the start's time stands
    now[0] += timedelta(seconds=1)
    assert status(p, mid) is MachineStatus.RUNNING
    assert [m.provider_instance_id for m in p.list_owned()] == [mid]


def test_stop_and_start_are_seen_by_every_process(db_url: str, engine: Engine) -> None:
    now = [T0]
    a = mock(session_factory(engine), now, boot_delay=0, stop_delay=0, start_delay=0)
    other_engine = make_engine(db_url)
    try:
        b = mock(session_factory(other_engine), now, boot_delay=0, stop_delay=0, start_delay=0)
        mid = a.create(a.find_offers(spec())[0], launch()).provider_instance_id
        a.stop(mid)
        assert status(b, mid) is MachineStatus.STOPPED
        b.start(mid)
        assert status(a, mid) is MachineStatus.RUNNING
    finally:
        other_engine.dispose()


def test_resume_failures_are_refused_and_leave_it_stopped(
    sessions: sessionmaker[Session],
) -> None:
    now = [T0]
    p, mid = running(sessions, now, stop_delay=0, resume_failure_rate=1.0)
    p.stop(mid)
    with pytest.raises(ResumeRefusedError, match="GPU was rented"):
        p.start(mid)
    assert status(p, mid) is MachineStatus.STOPPED


def test_resume_failure_rate_is_a_rate_and_follows_the_seed(
    sessions: sessionmaker[Session],
) -> None:
    def outcomes(seed: int) -> list[bool]:
        now = [T0]
        p = mock(
            sessions,
            now,
            seed=seed,
            boot_delay=0,
            stop_delay=0,
            start_delay=0,
            resume_failure_rate=0.5,
        )
        out = []
        for _ in range(40):
            mid = p.create(p.find_offers(spec())[0], launch()).provider_instance_id
            p.stop(mid)
            try:
                p.start(mid)
                out.append(True)
            except ResumeRefusedError:
                out.append(False)
        return out

    first = outcomes(11)
    assert 8 <= first.count(False) <= 32
    assert outcomes(11) == first  # the same seed, the same failures


def test_dead_and_gone_machines(sessions: sessionmaker[Session]) -> None:
    now = [T0]
    p, mid = running(sessions, now, stop_delay=0)
    assert p.kill(mid)
    p.stop(mid)  # nothing runs: success
    assert status(p, mid) is MachineStatus.DEAD
    with pytest.raises(ResumeRefusedError, match="dead"):
        p.start(mid)
    stopped_then_killed = running(sessions, now, stop_delay=0)[1]
    p.stop(stopped_then_killed)
    assert p.kill(stopped_then_killed)  # a stopped machine's host can die too
    with pytest.raises(ResumeRefusedError):
        p.start(stopped_then_killed)
    p.destroy(mid)
    p.stop(mid)
    with pytest.raises(ResumeRefusedError, match="gone"):
        p.start(mid)
    with pytest.raises(ResumeRefusedError):
        p.start("mock-999999")


def test_a_booting_machine_that_was_to_fail_boots_on_a_resume(
    sessions: sessionmaker[Session],
) -> None:
    """A boot failure belongs to its boot: stopped before it failed, a resume starts clean."""
    now = [T0]
    p = mock(sessions, now, boot_delay=10, boot_failure_rate=1.0, stop_delay=0, start_delay=0)
    mid = p.create(p.find_offers(spec())[0], launch()).provider_instance_id
    p.stop(mid)
    now[0] += timedelta(seconds=20)
    assert status(p, mid) is MachineStatus.STOPPED
    p.start(mid)
    assert status(p, mid) is MachineStatus.RUNNING


def test_stop_and_start_of_machines_not_ours(sessions: sessionmaker[Session]) -> None:
    now = [T0]
    p = mock(sessions, now, stop_delay=0)
    other = mock(sessions, now, installation=OTHER_INSTALLATION, boot_delay=0, stop_delay=0)
    theirs = other.create(other.find_offers(spec())[0], launch(OTHER_INSTALLATION))
    for call in (p.stop, p.start):
        with pytest.raises(NotOwnedError):
            call(theirs.provider_instance_id)
    assert status(other, theirs.provider_instance_id) is MachineStatus.RUNNING
