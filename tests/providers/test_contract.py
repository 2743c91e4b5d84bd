"""One contract for every provider kind (`providers.base`), run against each: the mock on both
databases, local processes, RunPod and Vast.ai against their fakes, containers on a real Podman.
Stop and start (warm pools) are in it too: every kind can stop, and a stopped machine is the
same machine, still ours, started again by `start`.

A kind registered in `PROVIDER_KINDS` without a case here fails this suite: add its case to
`CASES` (a builder of a `Case`: the provider, the same backend seen by another installation,
an instance spec it can serve, and where it can, a machine made by hand and a failing create).
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from sqlalchemy.orm import Session, sessionmaker

from autoscaler.config.machine_specs import InstanceSpec
from autoscaler.config.provider_options import PROVIDER_KINDS, LocalOptions, MockOptions
from autoscaler.providers import (
    LaunchSpec,
    MachineStatus,
    NotOwnedError,
    Provider,
    ProviderError,
    ProviderMachine,
    ResumeRefusedError,
    create_on_first_offer,
)
from autoscaler.providers.local import LocalProvider
from autoscaler.providers.mock import MockProvider
from autoscaler.store.db import make_engine, session_factory
from autoscaler.store.mock_machines import StoredMockMachines
from autoscaler.store.models import Base
from tests.containers import engine as kit
from tests.providers.conftest import (
    INSTALLATION,
    OTHER_INSTALLATION,
    assert_no_secret,
    make_container,
    make_runpod,
    make_vast,
    spec,
)

TOKEN = "wtk_SECRET_2b7e61c0d9f4_worker_token"
GONE = (MachineStatus.GONE, MachineStatus.DEAD)


@dataclass
class Case:
    provider: Provider
    other: Provider
    """The same backend as seen by another installation: its machines are foreign to us."""
    spec: InstanceSpec
    hand_made: Callable[[], str] | None = None
    """Make a machine as a human would (no label of ours); returns its id."""
    fail_next_create: Callable[[], None] | None = None
    """Make the next create fail (echoing the request where the backend can)."""

    @property
    def installation(self) -> str:
        return self.provider.installation_id

    def launch(self, installation: str | None = None) -> LaunchSpec:
        env = {"AUTOSCALER_QUEUE": "contract", "AUTOSCALER_WORKER_TOKEN": TOKEN}
        return LaunchSpec.new(installation or self.installation, uuid.uuid4().hex, env)

    def create(self, launch: LaunchSpec | None = None) -> ProviderMachine:
        launch = launch or self.launch()
        return create_on_first_offer(self.provider, self.provider.find_offers(self.spec), launch)

    def create_foreign(self) -> ProviderMachine:
        launch = self.launch(self.other.installation_id)
        return create_on_first_offer(self.other, self.other.find_offers(self.spec), launch)


def settle(
    p: Provider, machine_id: str, want: MachineStatus, timeout: float = 15.0
) -> ProviderMachine:
    """`get` polled until it reports `want`: stop and start are asynchronous at most providers
    (every case here settles at once or within its own stop grace)."""
    deadline = time.monotonic() + timeout
    while True:
        got = p.get(machine_id)
        if got is not None and got.status is want:
            return got
        assert time.monotonic() < deadline, f"{machine_id} never read {want}: {got}"
        time.sleep(0.02)


def _destroy_all(*providers: Provider) -> Callable[[], None]:
    def clean() -> None:
        for p in providers:
            for m in p.list_owned():
                p.destroy(m.provider_instance_id)

    return clean


def _mock(request: pytest.FixtureRequest, db: str) -> Case:
    # The `sessions` fixture's databases (SQLite and PostgreSQL), made as it makes them: a
    # parametrized fixture cannot be asked for from inside another parametrization.
    url = str(request.getfixturevalue("sqlite_url" if db == "sqlite" else "pg_url"))
    engine = make_engine(url)
    Base.metadata.create_all(engine)
    request.addfinalizer(engine.dispose)
    sessions: sessionmaker[Session] = session_factory(engine)
    config = MockOptions(
        kind="mock", boot_delay=0, stop_delay=0, start_delay=0, price_per_hour=0.25
    )
    p = MockProvider("demo", config, INSTALLATION, StoredMockMachines(sessions))
    other = MockProvider("demo", config, OTHER_INSTALLATION, StoredMockMachines(sessions))

    def fail() -> None:
        p.config = config.model_copy(update={"capacity_error_rate": 1.0})

    return Case(p, other, spec(), fail_next_create=fail)


def _local(request: pytest.FixtureRequest) -> Case:
    state: Path = request.getfixturevalue("tmp_path") / "state"
    config = LocalOptions(kind="local", command="exec sleep 300", price_per_hour=0.30)
    p = LocalProvider("here", config, INSTALLATION, state, grace=1.0)
    other = LocalProvider("here", config, OTHER_INSTALLATION, state, grace=1.0)
    request.addfinalizer(_destroy_all(p, other))
    return Case(p, other, spec())


def _runpod(request: pytest.FixtureRequest) -> Case:
    fake = request.getfixturevalue("fake_runpod")
    p, other = make_runpod(fake), make_runpod(fake, installation=OTHER_INSTALLATION)

    def fail() -> None:
        fake.refuse_create = True
        fake.echo_request_in_errors = True  # the refusal quotes our request, env included

    return Case(
        p,
        other,
        spec(gpu="RTX A5000"),
        hand_made=lambda: fake.add_pod("hand-made"),
        fail_next_create=fail,
    )


def _vast(request: pytest.FixtureRequest) -> Case:
    fake = request.getfixturevalue("fake_vast")
    sessions = request.getfixturevalue("sqlite_sessions")
    p = make_vast(fake, sessions)
    other = make_vast(fake, sessions, installation=OTHER_INSTALLATION)

    def fail() -> None:
        fake.fail_with_contract = 100  # every offer: made, refused, destroyed

    return Case(
        p,
        other,
        spec(),
        hand_made=lambda: str(fake.add_instance("hand-made")),
        fail_next_create=fail,
    )


def _container(request: pytest.FixtureRequest) -> Case:
    engine = request.getfixturevalue("podman_engine")
    fresh = request.getfixturevalue("installations")
    p = make_container(engine, fresh(), max_machines=5)
    other = make_container(engine, fresh(), max_machines=5)

    def by_hand() -> str:
        return kit.run_by_hand(engine.image, f"hand-{uuid.uuid4().hex[:10]}")

    def fail() -> None:  # a GPU asked of this GPU-less engine: refused, nothing left
        p.config = p.config.model_copy(update={"gpus": 1})

    return Case(p, other, spec(image=engine.image), hand_made=by_hand, fail_next_create=fail)


CASES: dict[str, Callable[[pytest.FixtureRequest], Case]] = {
    "mock-sqlite": lambda r: _mock(r, "sqlite"),
    "mock-postgresql": lambda r: _mock(r, "postgresql"),
    "local": _local,
    "runpod": _runpod,
    "vast": _vast,
    "container": _container,
}


def _kind(case_id: str) -> str:
    return case_id.split("-", 1)[0]


CASE_IDS = [
    case_id
    for kind in PROVIDER_KINDS
    for case_id in ([c for c in CASES if _kind(c) == kind] or [kind])
]


@pytest.fixture(params=CASE_IDS)
def case(request: pytest.FixtureRequest) -> Case:
    builder = CASES.get(request.param)
    if builder is None:
        pytest.fail(f"provider kind {request.param!r} has no contract case: add it to CASES")
    return builder(request)


def test_every_provider_kind_has_a_contract_case() -> None:
    assert {_kind(c) for c in CASES} == set(PROVIDER_KINDS)


def test_find_offers_respects_the_price_cap(case: Case) -> None:
    offers = case.provider.find_offers(case.spec)
    assert offers, "the case's spec must find an offer"
    assert all(o.price_per_hour <= case.spec.max_price_per_hour for o in offers)
    assert all(o.provider == case.provider.name and o.spec == case.spec for o in offers)
    cheapest = min(o.price_per_hour for o in offers)
    assert cheapest > 0, "give the case a price, or the cap cannot be tested"
    below = InstanceSpec.model_validate(
        {**case.spec.model_dump(), "max_price_per_hour": round(cheapest * 0.5, 6)}
    )
    assert case.provider.find_offers(below) == []


def test_create_returns_our_labelled_machine_and_every_read_finds_it(case: Case) -> None:
    p = case.provider
    launch = case.launch()
    m = case.create(launch)
    assert m.label == launch.label and p.owns(m.label) and m.launch_id == launch.launch_id
    got = p.get(m.provider_instance_id)
    assert got is not None and got.label == launch.label
    assert got.provider_instance_id == m.provider_instance_id
    found = p.find_by_label(launch.label)
    assert found is not None and found.provider_instance_id == m.provider_instance_id
    assert m.provider_instance_id in [x.provider_instance_id for x in p.list_owned()]


def test_list_owned_lists_nothing_foreign(case: Case) -> None:
    p = case.provider
    mine = case.create()
    theirs = case.create_foreign()
    hand = case.hand_made() if case.hand_made else None
    owned = p.list_owned()
    assert [m.provider_instance_id for m in owned] == [mine.provider_instance_id]
    assert all(p.owns(m.label) for m in owned)
    assert p.get(theirs.provider_instance_id) is None
    assert p.find_by_label(theirs.label) is None
    if hand is not None:
        assert p.get(hand) is None


def test_a_second_create_for_the_same_launch_makes_no_second_machine(case: Case) -> None:
    p = case.provider
    launch = case.launch()
    first = case.create(launch)
    again = case.create(launch)
    assert again.provider_instance_id == first.provider_instance_id
    same = [m for m in p.list_owned() if m.label == launch.label]
    assert [m.provider_instance_id for m in same] == [first.provider_instance_id]


def test_destroy_makes_it_gone_and_destroying_again_is_success(case: Case) -> None:
    p = case.provider
    m = case.create()
    p.destroy(m.provider_instance_id)
    after = p.get(m.provider_instance_id)
    assert after is None or after.status in GONE
    listed = [x for x in p.list_owned() if x.provider_instance_id == m.provider_instance_id]
    assert all(x.status in GONE for x in listed)
    p.destroy(m.provider_instance_id)


def test_destroy_of_a_foreign_machine_is_refused_and_it_lives_on(case: Case) -> None:
    p = case.provider
    theirs = case.create_foreign()
    with pytest.raises(NotOwnedError):
        p.destroy(theirs.provider_instance_id)
    still = case.other.get(theirs.provider_instance_id)
    assert still is not None and still.status not in GONE
    if case.hand_made is not None:
        hand = case.hand_made()
        with contextlib.suppress(NotOwnedError):  # refused, or nothing done: left alone
            p.destroy(hand)
        assert p.get(hand) is None


def test_no_worker_token_in_any_error_text(case: Case, all_logs: pytest.LogCaptureFixture) -> None:
    p = case.provider
    errors: list[ProviderError] = []
    offers = p.find_offers(case.spec)
    with pytest.raises(NotOwnedError) as refused:  # a launch of another installation
        p.create(offers[0], case.launch(case.other.installation_id))
    errors.append(refused.value)
    theirs = case.create_foreign()
    with pytest.raises(NotOwnedError) as foreign:
        p.destroy(theirs.provider_instance_id)
    errors.append(foreign.value)
    if case.fail_next_create is not None:
        case.fail_next_create()
        launch = case.launch()
        with pytest.raises(ProviderError) as failed:
            create_on_first_offer(p, p.find_offers(case.spec) or offers, launch)
        errors.append(failed.value)
        leftover = p.find_by_label(launch.label)
        assert leftover is None or leftover.status in GONE
    assert_no_secret(all_logs, p, *errors, secret=TOKEN)


# ---------------------------------------------------------------- stop and start (warm pools)


def test_every_kind_can_stop_and_says_what_a_stopped_machine_bills(case: Case) -> None:
    assert case.provider.can_stop
    m = case.create()
    assert m.storage_price_per_hour is None or m.storage_price_per_hour >= 0
    got = case.provider.get(m.provider_instance_id)
    assert got is not None and got.storage_price_per_hour is not None
    assert got.storage_price_per_hour >= 0


def test_stop_keeps_the_machine_and_start_resumes_the_same_one(case: Case) -> None:
    p = case.provider
    m = case.create()
    mid = m.provider_instance_id
    settle(p, mid, MachineStatus.RUNNING)
    p.stop(mid)
    stopped = settle(p, mid, MachineStatus.STOPPED)
    assert stopped.label == m.label and stopped.provider_instance_id == mid
    listed = {x.provider_instance_id: x.status for x in p.list_owned()}
    assert listed == {mid: MachineStatus.STOPPED}  # still ours, still listed: not gone
    assert p.find_by_label(m.label) is not None
    p.stop(mid)  # stopping a stopped machine: success, nothing changes
    assert settle(p, mid, MachineStatus.STOPPED).provider_instance_id == mid
    p.start(mid)
    again = settle(p, mid, MachineStatus.RUNNING)
    assert again.label == m.label
    p.start(mid)  # starting a running machine: success, it runs on
    assert settle(p, mid, MachineStatus.RUNNING).provider_instance_id == mid
    assert [x.provider_instance_id for x in p.list_owned()] == [mid]  # no second machine


def test_stop_twice_in_a_row_is_success(case: Case) -> None:
    p = case.provider
    mid = case.create().provider_instance_id
    settle(p, mid, MachineStatus.RUNNING)
    p.stop(mid)
    p.stop(mid)  # whether the first is done yet or not
    settle(p, mid, MachineStatus.STOPPED)


def test_stop_and_start_of_a_machine_not_ours_are_refused_and_change_nothing(
    case: Case,
) -> None:
    p, other = case.provider, case.other
    theirs = case.create_foreign().provider_instance_id
    settle(other, theirs, MachineStatus.RUNNING)
    with pytest.raises(NotOwnedError):
        p.stop(theirs)
    with pytest.raises(NotOwnedError):
        p.start(theirs)
    assert other.get(theirs).status is MachineStatus.RUNNING  # type: ignore[union-attr]
    other.stop(theirs)  # stopped by its owner: we still may not start it
    settle(other, theirs, MachineStatus.STOPPED)
    with pytest.raises(NotOwnedError):
        p.start(theirs)
    assert other.get(theirs).status is MachineStatus.STOPPED  # type: ignore[union-attr]
    if case.hand_made is not None:
        hand = case.hand_made()
        for call in (p.stop, p.start):
            with pytest.raises(NotOwnedError):
                call(hand)


def test_stop_of_a_gone_machine_is_success_and_start_is_refused(case: Case) -> None:
    p = case.provider
    mid = case.create().provider_instance_id
    p.destroy(mid)
    p.stop(mid)  # nothing runs, as asked
    with pytest.raises(ResumeRefusedError):
        p.start(mid)
    after = p.get(mid)
    assert after is None or after.status in GONE
