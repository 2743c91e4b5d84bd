"""The pure reconcile(): one test per rule, at and around each boundary."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import yaml

from autoscaler.config import load_config_text
from autoscaler.config.models import Config
from autoscaler.lifecycle import FINAL_STATES, LIVE_STATES, InstanceState, MachineStatus
from autoscaler.policy.reconcile import (
    CREATE_GRACE,
    INTENT_STALE,
    ORPHAN_GRACE,
    SILENCE_CONFIRM,
    STEP_RETRY,
    DestroyOrphan,
    Listed,
    ProviderView,
    ReconcilePlan,
    Retry,
    Row,
    Transition,
    reconcile,
)

from .helpers import PROVIDERS

S = InstanceState
M = MachineStatus
NOW = datetime(2025, 6, 2, 12, 0, tzinfo=UTC)
HEARTBEAT = 300.0
BOOT = 900.0


def make_config(*, poll: float = 30.0, **queue_boot: float | None) -> Config:
    """Queues q (global boot timeout), fast (120 s) and slow (1800 s); global timeouts fixed."""

    def queue(boot: float | None) -> dict[str, Any]:
        auto: dict[str, Any] = {
            "provider": "gpu",
            "max_workers": 4,
            "instance": {"gpu": "RTX 4090", "max_price_per_hour": 0.6},
        }
        if boot is not None:
            auto["boot_timeout"] = boot
        return {"autoscale": auto}

    boots = {"q": None, "fast": 120.0, "slow": 1800.0, **queue_boot}
    doc = {
        "poll_interval": poll,
        "boot_timeout": BOOT,
        "heartbeat_timeout": HEARTBEAT,
        "drain_timeout": 3600,
        "queues": {name: queue(b) for name, b in boots.items()},
    }
    return load_config_text(yaml.safe_dump(doc), registered_providers=PROVIDERS)


CFG = make_config()


def ago(seconds: float) -> datetime:
    return NOW - timedelta(seconds=seconds)


def row(
    state: InstanceState,
    *,
    lid: str = "L1",
    queue: str = "q",
    provider: str = "gpu",
    since: float = 0.0,
    pid: str | None = None,
    host: str | None = None,
    seen: float | None = None,
    running: int = 0,
    remote: bool = False,
) -> Row:
    """`since` and `seen` are seconds before NOW."""
    return Row(
        remote_control=remote,
        launch_id=lid,
        queue=queue,
        provider=provider,
        state=state,
        since=ago(since),
        provider_instance_id=pid,
        host_id=host,
        last_seen_at=None if seen is None else ago(seen),
        running_tasks=running,
    )


def label(lid: str) -> str:
    return f"asg-inst1-{lid}"


def machine(
    lid: str = "L1", pid: str = "p1", status: MachineStatus = M.RUNNING, host: str | None = None
) -> Listed:
    return Listed(pid, lid, label(lid), status, host)


def view(*machines: Listed, provider: str = "gpu", listed: bool = True, mock: bool = False):
    return {provider: ProviderView(provider, listed, tuple(machines), ready_when_running=mock)}


FAILED_LIST = view(listed=False)
EMPTY_LIST = view()


def run(
    rows: tuple[Row, ...] | Row,
    providers: dict[str, ProviderView] | None = None,
    seen: dict[tuple[str, str], tuple[str, datetime]] | None = None,
    cfg: Config = CFG,
    now: datetime = NOW,
) -> ReconcilePlan:
    rows = rows if isinstance(rows, tuple) else (rows,)
    plan = reconcile(rows, EMPTY_LIST if providers is None else providers, seen or {}, cfg, now)
    # at most one action per row, whatever the rule
    acted = [t.launch_id for t in plan.transitions] + [r.launch_id for r in plan.retries]
    assert len(acted) == len(set(acted))
    return plan


def confirmed(
    rows: tuple[Row, ...] | Row, providers: dict[str, ProviderView] | None = None, **kw: Any
) -> ReconcilePlan:
    """The round after the one that first found the row silent, half a poll or more later:
    silence destroys only when two rounds find it (the first only notes it)."""
    r = rows if isinstance(rows, Row) else rows[0]
    first = run(rows, providers, **kw)
    assert [n.launch_id for n in first.silences] == [r.launch_id], first
    assert not [t for t in first.transitions if t.dst == S.TERMINATING], first
    poll = kw.get("cfg", CFG).poll_interval
    return run(replace(r, silence_noted_at=ago(SILENCE_CONFIRM * poll)), providers, **kw)


def only(plan: ReconcilePlan) -> Transition | Retry | None:
    """The single row action of a one-row plan (None when nothing is done)."""
    actions = [*plan.transitions, *plan.retries]
    assert len(actions) <= 1, actions
    return actions[0] if actions else None


def moved(plan: ReconcilePlan, dst: InstanceState, **expected: Any) -> Transition:
    act = only(plan)
    assert isinstance(act, Transition), f"expected a move to {dst}, got {act}"
    assert act.dst == dst, act
    for key, value in expected.items():
        assert getattr(act, key) == value, (key, getattr(act, key), value)
    assert act.reason
    return act


def retried(plan: ReconcilePlan, step: str) -> Retry:
    act = only(plan)
    assert isinstance(act, Retry), f"expected a {step} retry, got {act}"
    assert act.step == step and act.reason
    return act


# --------------------------------------------------------------------------- pending


@pytest.mark.parametrize("age", [0.0, INTENT_STALE - 1, INTENT_STALE - 0.001])
def test_a_fresh_intent_is_left_to_its_launch_task(age):
    assert only(run(row(S.PENDING, since=age))) is None


@pytest.mark.parametrize("age", [INTENT_STALE, INTENT_STALE + 1, 3600.0])
@pytest.mark.parametrize("providers", [EMPTY_LIST, FAILED_LIST], ids=["listed", "list-failed"])
def test_an_unclaimed_intent_is_launched_again(age, providers):
    r = retried(run(row(S.PENDING, since=age, queue="fast"), providers), "launch")
    assert (r.launch_id, r.queue) == ("L1", "fast")


# --------------------------------------------------------------------------- creating


@pytest.mark.parametrize("status", [M.STARTING, M.RUNNING])
@pytest.mark.parametrize("age", [0.0, CREATE_GRACE + 500])
def test_a_create_of_unknown_outcome_is_adopted_when_its_label_is_listed(status, age):
    plan = run(row(S.CREATING, since=age), view(machine(pid="p7", status=status, host="h3")))
    moved(plan, S.BOOTING, provider_instance_id="p7", host_id="h3", rental=None, src=S.CREATING)
    assert not plan.destroys and not plan.orphans  # its machine is no orphan


@pytest.mark.parametrize("age", [0.0, CREATE_GRACE - 1, CREATE_GRACE - 0.001])
def test_a_create_not_listed_is_awaited_within_the_grace(age):
    assert only(run(row(S.CREATING, since=age))) is None


@pytest.mark.parametrize("age", [CREATE_GRACE, CREATE_GRACE + 1, 86400.0])
def test_a_create_never_listed_fails_after_the_grace(age):
    moved(run(row(S.CREATING, since=age)), S.FAILED, rental="failed", src=S.CREATING)


def test_a_gone_machine_with_the_label_does_not_confirm_a_create():
    plan = run(row(S.CREATING, since=CREATE_GRACE), view(machine(status=M.GONE)))
    moved(plan, S.FAILED, rental="failed")
    plan = run(row(S.CREATING, since=CREATE_GRACE - 1), view(machine(status=M.GONE)))
    assert only(plan) is None


@pytest.mark.parametrize(
    "providers",
    [FAILED_LIST, {}, view(machine(), provider="other")],
    ids=["list-failed", "provider-unknown", "only-another-provider-listed"],
)
def test_a_create_is_never_failed_when_its_providers_list_was_not_read(providers):
    assert only(run(row(S.CREATING, since=100 * CREATE_GRACE), providers)) is None


# --------------------------------------------------------------------------- booting


@pytest.mark.parametrize("seen_after", [0.0, 0.5, 100.0])
def test_booting_becomes_ready_when_its_worker_is_seen_at_or_after_it_entered_booting(seen_after):
    r = row(S.BOOTING, since=200, seen=200 - seen_after, pid="p1")
    moved(run(r, view(machine())), S.READY, rental="ok", src=S.BOOTING)


def test_booting_becomes_ready_even_when_its_providers_list_failed():
    moved(run(row(S.BOOTING, since=200, seen=10), FAILED_LIST), S.READY, rental="ok")


@pytest.mark.parametrize("seen_before", [0.5, 1.0, 60.0])
def test_a_sign_of_life_from_before_booting_does_not_make_it_ready(seen_before):
    r = row(S.BOOTING, since=200, seen=200 + seen_before, pid="p1")
    assert only(run(r, view(machine()))) is None


def test_a_mock_machine_is_ready_when_running():
    r = row(S.BOOTING, since=20, pid="p1")
    moved(run(r, view(machine(status=M.RUNNING), mock=True)), S.READY, rental="ok")
    # still starting, or running at a provider whose machines have a worker to report: not yet
    assert only(run(r, view(machine(status=M.STARTING), mock=True))) is None
    assert only(run(r, view(machine(status=M.RUNNING)))) is None


@pytest.mark.parametrize(("queue", "timeout"), [("q", BOOT), ("fast", 120.0), ("slow", 1800.0)])
def test_no_worker_by_the_boot_timeout_terminates_and_counts_a_failed_rental(queue, timeout):
    def at(age: float) -> ReconcilePlan:
        r = row(S.BOOTING, queue=queue, since=age, pid="p1")
        return run(r, view(machine(status=M.STARTING, host="h1")))

    assert only(at(timeout - 1)) is None
    assert only(at(timeout - 0.001)) is None
    for age in (timeout, timeout + 1):
        moved(at(age), S.TERMINATING, rental="failed", avoid_host=True, host_id="h1")


@pytest.mark.parametrize(
    ("age", "terminated"),
    [(120.0, {"fast"}), (BOOT, {"fast", "q"}), (1800.0, {"fast", "q", "slow"})],
)
def test_a_queues_boot_timeout_overrides_the_global_one_both_ways(age, terminated):
    rows = tuple(
        row(S.BOOTING, lid=f"L-{q}", queue=q, since=age, pid=f"p-{q}")
        for q in ("q", "fast", "slow")
    )
    plan = run(
        rows, view(*(machine(f"L-{q}", f"p-{q}", M.STARTING) for q in ("q", "fast", "slow")))
    )
    assert {t.queue for t in plan.transitions if t.dst == S.TERMINATING} == terminated
    assert len(plan.transitions) == len(terminated) and not plan.retries


def test_the_boot_timeout_avoids_the_host_only_when_one_is_known():
    # known from the row while the list failed
    r = row(S.BOOTING, since=BOOT, pid="p1", host="h9")
    moved(run(r, FAILED_LIST), S.TERMINATING, rental="failed", avoid_host=True, host_id="h9")
    # known nowhere: still a failed rental, no host avoided
    r = row(S.BOOTING, since=BOOT, pid="p1")
    moved(
        run(r, view(machine(status=M.STARTING))),
        S.TERMINATING,
        rental="failed",
        avoid_host=False,
        host_id=None,
    )


def test_a_worker_seen_wins_over_the_boot_timeout():
    r = row(S.BOOTING, since=BOOT + 50, seen=10, pid="p1")
    moved(run(r, view(machine(host="h1"))), S.READY, rental="ok")


def test_booting_dead_at_the_provider_is_terminated_as_a_failed_rental_on_an_avoided_host():
    r = row(S.BOOTING, since=5, pid="p1")
    moved(
        run(r, view(machine(status=M.DEAD, host="h4"))),
        S.TERMINATING,
        rental="failed",
        avoid_host=True,
        host_id="h4",
    )


# --------------------------------------------------------------------------- dead, lost


@pytest.mark.parametrize("state", [S.READY, S.DRAINING])
@pytest.mark.parametrize("status", [M.DEAD, M.STOPPED])  # stopped by the provider: outbid
def test_a_serving_machine_dead_at_the_provider_is_terminated_and_its_jobs_handed_back(
    state, status
):
    r = row(state, since=5, seen=1, running=2, pid="p1")
    moved(
        run(r, view(machine(status=status, host="h4"))),
        S.TERMINATING,
        rental=None,
        avoid_host=False,
        src=state,
        handback=True,
    )


@pytest.mark.parametrize("state", [S.BOOTING, S.READY, S.DRAINING, S.DRAINED])
@pytest.mark.parametrize("listing", [(), (machine(status=M.GONE),), (machine("L2", "p2"),)])
def test_a_machine_missing_at_the_provider_is_lost(state, listing):
    r = row(state, since=5, seen=1, pid="p1")
    rental = "failed" if state == S.BOOTING else None
    # its jobs go back only where its worker may hold some (booting: not started; drained:
    # finished them)
    handback = state in (S.READY, S.DRAINING)
    moved(run(r, view(*listing)), S.LOST, rental=rental, src=state, handback=handback)


def test_a_silent_machine_its_provider_still_runs_never_has_its_jobs_handed_back():
    """Silence is no proof the jobs stopped running: only the provider's word is."""
    cfg = CFG
    noted = row(S.READY, since=3600, seen=3000, pid="p1")
    noted = replace(noted, silence_noted_at=ago(600))
    plan = run(noted, view(machine(status=M.RUNNING)), cfg=cfg)
    act = only(plan)
    assert isinstance(act, Transition) and act.dst == S.TERMINATING and not act.handback


@pytest.mark.parametrize("state", [S.BOOTING, S.READY, S.DRAINING, S.DRAINED, S.TERMINATING])
@pytest.mark.parametrize("providers", [FAILED_LIST, {}], ids=["list-failed", "no-view"])
def test_nothing_is_lost_or_closed_when_the_list_failed(state, providers):
    plan = run(row(state, since=5, seen=1, pid="p1"), providers)
    assert not any(t.dst in (S.LOST, S.TERMINATED, S.FAILED) for t in plan.transitions)


# --------------------------------------------------------------------------- silence


@pytest.mark.parametrize("state", [S.READY, S.DRAINING])
@pytest.mark.parametrize("running", [0])
def test_a_silent_worker_is_terminated_at_the_heartbeat_timeout_not_a_second_before(state, running):
    def at(silent: float, **kw: Any):
        return run(
            row(state, since=4000, seen=silent, running=running, pid="p1", **kw), view(machine())
        )

    for silent in (0.0, HEARTBEAT - 1, HEARTBEAT - 0.001):
        act = only(at(silent))
        assert not (isinstance(act, Transition) and act.dst == S.TERMINATING), (silent, act)
    for silent in (HEARTBEAT, HEARTBEAT + 1, 10 * HEARTBEAT):
        r = row(state, since=4000, seen=silent, running=running, pid="p1")
        moved(
            confirmed(r, view(machine())), S.TERMINATING, rental=None, avoid_host=False, src=state
        )


@pytest.mark.parametrize("state", [S.READY, S.DRAINING])
def test_a_silent_worker_last_seen_busy_on_a_running_machine_gets_the_drain_timeout(state):
    """A busy `--pool solo` worker cannot answer remote control: its last "busy" holds while
    the provider still runs its machine (or cannot say), up to drain_timeout; then it goes."""
    drain = 3600.0

    def at(silent: float, providers: Any) -> Any:
        return run(row(state, since=9000, seen=silent, running=2, pid="p1"), providers)

    for providers in (view(machine()), FAILED_LIST):
        for silent in (HEARTBEAT, 10 * HEARTBEAT, drain - 1):
            act = only(at(silent, providers))
            assert not (isinstance(act, Transition) and act.dst == S.TERMINATING), (silent, act)
        r = row(state, since=9000, seen=drain, running=2, pid="p1")
        moved(confirmed(r, providers), S.TERMINATING, src=state)


@pytest.mark.parametrize("state", [S.READY, S.DRAINING])
def test_a_worker_only_remote_control_sees_is_not_judged_by_silence_while_its_machine_runs(state):
    """Last seen idle, then silent: a `--pool solo` worker that took a job right after that
    sighting answers nothing until the job ends. While the provider lists its machine as
    running it gets drain_timeout; a machine the list does not show running (list failed:
    nothing known) is judged as before, and an agent's silence is the agent's own."""
    drain = 3600.0

    def at(silent: float, providers: Any, remote: bool = True) -> Any:
        r = row(state, since=9000, seen=silent, running=0, pid="p1", remote=remote)
        return run(r, providers)

    for silent in (HEARTBEAT, 10 * HEARTBEAT, drain - 1):
        act = only(at(silent, view(machine())))
        assert not (isinstance(act, Transition) and act.dst == S.TERMINATING), (silent, act)

    def silent(seconds: float, remote: bool = True) -> Row:
        return row(state, since=9000, seen=seconds, running=0, pid="p1", remote=remote)

    moved(confirmed(silent(drain), view(machine())), S.TERMINATING, src=state)
    moved(confirmed(silent(HEARTBEAT), FAILED_LIST), S.TERMINATING, src=state)
    moved(confirmed(silent(HEARTBEAT, False), view(machine())), S.TERMINATING, src=state)


@pytest.mark.parametrize("state", [S.READY, S.DRAINING])
def test_a_worker_that_never_reported_is_silent_since_it_entered_its_state(state):
    r = row(state, since=HEARTBEAT - 1, pid="p1")
    act = only(run(r, view(machine())))
    assert not (isinstance(act, Transition) and act.dst == S.TERMINATING)
    moved(confirmed(row(state, since=HEARTBEAT, pid="p1"), view(machine())), S.TERMINATING)


def test_a_silent_worker_is_terminated_even_when_the_list_failed():
    """Silence is the worker's own signal, not the provider's list."""
    r = row(S.READY, since=4000, seen=HEARTBEAT, pid="p1")
    moved(confirmed(r, FAILED_LIST), S.TERMINATING)


@pytest.mark.parametrize("state", [S.READY, S.DRAINING])
def test_silence_destroys_only_when_two_rounds_apart_find_it(state):
    """One reading of one clock never destroys a machine: the first round that finds it silent
    notes it; a round racing that one (less than half a poll later) does nothing; a later one
    destroys it — unless the worker spoke in between, which starts the count again."""
    r = row(state, since=4000, seen=HEARTBEAT, pid="p1")
    first = run(r, view(machine()))
    assert [n.launch_id for n in first.silences] == ["L1"] and not first.transitions
    poll = CFG.poll_interval
    racing = run(replace(r, silence_noted_at=ago(SILENCE_CONFIRM * poll - 0.001)), view(machine()))
    assert not racing.transitions and not racing.silences
    moved(
        run(replace(r, silence_noted_at=ago(SILENCE_CONFIRM * poll)), view(machine())),
        S.TERMINATING,
        src=state,
    )
    spoke = replace(r, silence_noted_at=ago(HEARTBEAT + 10))  # noted before it was last seen
    again = run(spoke, view(machine()))
    assert [n.launch_id for n in again.silences] == ["L1"] and not again.transitions
    future = replace(r, silence_noted_at=NOW + timedelta(seconds=60))  # a clock that ran ahead
    assert [n.launch_id for n in run(future, view(machine())).silences] == ["L1"]


# --------------------------------------------------------------------------- draining, drained


@pytest.mark.parametrize(("poll", "every"), [(30.0, 30.0), (10.0, 10.0), (60.0, STEP_RETRY)])
def test_a_drain_is_retried_after_min_of_step_retry_and_the_poll_interval(poll, every):
    cfg = make_config(poll=poll)

    def at(age: float) -> ReconcilePlan:
        return run(
            row(S.DRAINING, since=age, seen=1, running=1, pid="p1"), view(machine()), cfg=cfg
        )

    assert only(at(every - 1)) is None
    assert only(at(every - 0.001)) is None
    retried(at(every), "drain")
    retried(at(every + 1), "drain")
    retried(at(HEARTBEAT * 50), "drain")  # past the drain timeout, busy: still only waiting


@pytest.mark.parametrize("providers", [view(machine()), FAILED_LIST], ids=["listed", "failed"])
def test_a_drained_machine_is_terminated(providers):
    moved(run(row(S.DRAINED, since=0, pid="p1"), providers), S.TERMINATING, src=S.DRAINED)


# --------------------------------------------------------------------------- terminating


@pytest.mark.parametrize("listing", [(), (machine(status=M.GONE),), (machine("L2", "p2"),)])
@pytest.mark.parametrize("age", [0.0, 1000.0])
def test_terminating_is_terminated_once_the_provider_no_longer_lists_it(listing, age):
    plan = run(row(S.TERMINATING, since=age, pid="p1"), view(*listing))
    moved(plan, S.TERMINATED, src=S.TERMINATING)


@pytest.mark.parametrize("status", [M.RUNNING, M.DEAD, M.STARTING])
@pytest.mark.parametrize("poll", [30.0, 10.0])
def test_terminating_still_listed_is_retried_after_the_step_retry(status, poll):
    cfg = make_config(poll=poll)
    every = min(STEP_RETRY, poll)

    def at(age: float, providers: dict[str, ProviderView]) -> ReconcilePlan:
        return run(row(S.TERMINATING, since=age, pid="p1"), providers, cfg=cfg)

    listed = view(machine(status=status))
    assert only(at(every - 1, listed)) is None
    retried(at(every, listed), "terminate")
    # an unread list retries too, and never closes the row
    assert only(at(every - 1, FAILED_LIST)) is None
    retried(at(every, FAILED_LIST), "terminate")
    retried(at(5000, FAILED_LIST), "terminate")


# --------------------------------------------------------------------------- orphans


def destroyed(plan: ReconcilePlan) -> set[tuple[str, str]]:
    return {(d.provider, d.provider_instance_id) for d in plan.destroys}


@pytest.mark.parametrize(
    "owner",
    [
        None,
        row(S.TERMINATED, lid="L9", pid="p9"),
        row(S.FAILED, lid="L9"),
        row(S.LOST, lid="L9", pid="p9"),
        row(S.READY, lid="L9", provider="other", pid="p9", seen=1),
        row(S.READY, lid="L9", pid="p1", seen=1),  # a second machine for the same launch
    ],
    ids=["no-row", "terminated", "failed", "lost", "other-provider", "second-machine"],
)
def test_an_orphan_is_destroyed_only_after_the_grace_from_its_first_sighting(owner):
    rows = () if owner is None else (owner,)
    listing = [machine("L9", "p9", host="h1")]
    if owner is not None and owner.provider_instance_id == "p1":
        listing.append(machine("L9", "p1"))
    providers = view(*listing)
    if owner is not None and owner.provider == "other":
        providers |= view(machine("L9", "p9"), provider="other")
    key = ("gpu", "p9")

    # first sighting: remembered from now, nothing destroyed
    plan = run(rows, providers)
    assert plan.orphans == {key: (label("L9"), NOW)}
    assert not plan.destroys
    # seen before, but not long enough
    for first in (1.0, ORPHAN_GRACE - 1, ORPHAN_GRACE - 0.001):
        plan = run(rows, providers, {key: (label("L9"), ago(first))})
        assert not plan.destroys, first
        assert plan.orphans == {key: (label("L9"), ago(first))}  # not reset
    # grace reached: destroyed, the sighting kept until it is gone
    for first in (ORPHAN_GRACE, ORPHAN_GRACE + 1, 86400.0):
        plan = run(rows, providers, {key: (label("L9"), ago(first))})
        assert plan.destroys == (DestroyOrphan("gpu", "p9", label("L9"), plan.destroys[0].reason),)
        assert plan.destroys[0].reason
        assert plan.orphans == {key: (label("L9"), ago(first))}


def test_the_first_sighting_survives_a_failed_list_and_the_grace_is_not_restarted():
    key = ("gpu", "p9")
    first = ago(ORPHAN_GRACE - 100)
    seen = {key: (label("L9"), first), ("other", "p5"): (label("L5"), ago(10))}
    providers = FAILED_LIST | view(machine("L5", "p5"), provider="other")
    later = NOW + timedelta(seconds=10_000)
    plan = run((), providers, seen, now=later)
    # unknown now: never destroyed, however old; the provider that was listed is not held back
    assert destroyed(plan) == {("other", "p5")}
    assert plan.orphans is not None
    assert plan.orphans[key] == (label("L9"), first)
    # once listed again, its age counts from the first sighting, not from the failed list
    plan = run((), view(machine("L9", "p9")), dict(plan.orphans), now=later)
    assert destroyed(plan) == {key}


def test_a_failed_list_keeps_only_its_own_providers_sightings():
    seen = {("gpu", "p9"): (label("L9"), ago(50)), ("other", "p5"): (label("L5"), ago(10))}
    plan = run((), FAILED_LIST | view(provider="other"), seen)
    assert plan.orphans == {("gpu", "p9"): (label("L9"), ago(50))}  # other: listed, p5 gone


def test_an_orphan_no_longer_listed_is_forgotten():
    seen = {("gpu", "p9"): (label("L9"), ago(10 * ORPHAN_GRACE))}
    for listing in ((), (machine("L9", "p9", status=M.GONE),)):
        plan = run((), view(*listing), seen)
        assert not plan.destroys and plan.orphans == {}


@pytest.mark.parametrize("state", list(LIVE_STATES))
@pytest.mark.parametrize("pid", ["p1", None])
def test_a_machine_listed_for_a_live_row_is_never_an_orphan(state, pid):
    """The caller passes only machines under our label; the one a live row owns stays."""
    r = row(state, since=10, seen=1, pid=pid)
    seen = {("gpu", "p1"): (label("L1"), ago(100 * ORPHAN_GRACE))}  # even if once thought one
    for status in (M.STARTING, M.RUNNING, M.DEAD):
        plan = run(r, view(machine(status=status)), seen)
        assert not plan.destroys
        assert plan.orphans == {}


@pytest.mark.parametrize("state", sorted(FINAL_STATES))
def test_a_final_row_takes_no_action(state):
    plan = run(row(state, since=99_999, pid="p1"))
    assert only(plan) is None


def test_reconcile_refuses_a_naive_now():
    with pytest.raises(ValueError):
        reconcile((), {}, {}, CFG, datetime(2025, 6, 2, 12, 0))


def test_every_row_is_judged_on_its_own_provider():
    rows = (
        row(S.READY, lid="A", pid="pa", seen=1),
        row(S.READY, lid="B", provider="other", pid="pb", seen=1),
        row(S.CREATING, lid="C", provider="other", since=CREATE_GRACE),
    )
    providers = view(machine("A", "pa")) | view(provider="other", listed=False)
    plan = run(rows, providers)
    assert plan.transitions == () and plan.retries == ()
    providers = view() | view(machine("B", "pb"), machine("C", "pc"), provider="other")
    plan = run(rows, providers)
    assert {(t.launch_id, t.dst) for t in plan.transitions} == {
        ("A", S.LOST),
        ("C", S.BOOTING),
    }


# --------------------------------------------------------------------------- bugs found


@pytest.mark.parametrize("state", [S.BOOTING, S.READY, S.DRAINING])
@pytest.mark.parametrize("second", [M.DEAD, M.GONE, M.STARTING])
def test_a_second_machine_for_the_launch_does_not_decide_the_fate_of_the_rows_own(state, second):
    """The row owns p1 (running, its worker busy and seen a second ago); a second machine p2
    carries the same label. reconcile() already calls p2 an orphan ("a second machine for
    launch L1"), so p2's status must not be read as the row's: a dead p2 must not send the busy
    worker on p1 to TERMINATING (the only ways a busy worker is destroyed are its own machine
    dead or its worker silent)."""
    r = row(state, since=60, seen=1, running=2, pid="p1")
    plan = run(r, view(machine(pid="p1", status=M.RUNNING), machine(pid="p2", status=second)))
    alone = run(r, view(machine(pid="p1", status=M.RUNNING)))
    assert plan.transitions == alone.transitions
    assert plan.retries == alone.retries
    assert not any(t.dst == S.TERMINATING for t in plan.transitions)


def test_a_mock_machine_is_not_judged_silent_from_a_list_that_failed():
    """A mock machine has no worker: its provider's list is its only sign of life
    (`ready_when_running`). When that list fails, nothing is known, and missing data must never
    destroy anything; today the machine is read as silent since it became ready."""
    r = row(S.READY, since=3600, pid="p1")
    listed = run(r, view(machine(status=M.RUNNING), mock=True))
    assert only(listed) is None  # running at its provider: alive
    failed = run(r, view(listed=False, mock=True))
    assert not any(t.dst == S.TERMINATING for t in failed.transitions), failed.transitions
