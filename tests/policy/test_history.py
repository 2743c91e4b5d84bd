"""The queue's history and the rules that use it: quiet gaps, the learned idle timeout, the
burst rule; alone (properties) and through decide()."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

from hypothesis import given, settings
from hypothesis import strategies as st

from autoscaler.policy.decide import decide
from autoscaler.policy.history import (
    GAPS_KEPT,
    LEARNED_MAX_FACTOR,
    MIN_GAPS,
    MIN_JOBS,
    QueueHistory,
    burst_limit,
    learned_idle_timeout,
    observe_load,
)
from autoscaler.policy.snapshot import QueueSnapshot, Snapshot
from tests.policy.helpers import NOW, config, metrics, ready


def _cost(gaps: list[float], timeout: float, boot: float) -> float:
    return sum(g if g <= timeout else timeout + boot for g in gaps)


# --------------------------------------------------------------------------- quiet gaps


def test_a_gap_runs_from_the_first_quiet_reading_to_the_first_busy_one() -> None:
    h = QueueHistory()
    h = observe_load(h, 3, NOW)
    h = observe_load(h, 0, NOW + timedelta(seconds=10))
    h = observe_load(h, 0, NOW + timedelta(seconds=40))  # still the same quiet period
    h = observe_load(h, 1, NOW + timedelta(seconds=100))
    h = observe_load(h, 2, NOW + timedelta(seconds=130))  # busy: no new gap
    assert h.quiet_gaps == (90.0,)
    assert h.quiet_since is None


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.floats(0, 3600)), max_size=200))
def test_gaps_are_never_negative_bounded_in_number_and_within_the_time_observed(
    readings: list[tuple[int, float]],
) -> None:
    h, t = QueueHistory(), NOW
    for load, step in readings:
        t += timedelta(seconds=step)
        h = observe_load(h, load, t)
    assert len(h.quiet_gaps) <= GAPS_KEPT
    assert all(g >= 0 for g in h.quiet_gaps)
    assert sum(h.quiet_gaps) <= (t - NOW).total_seconds() + 1e-6


def test_a_reading_older_than_the_quiet_start_records_nothing() -> None:
    h = observe_load(QueueHistory(), 0, NOW)
    assert observe_load(h, 5, NOW - timedelta(seconds=5)) == h


# --------------------------------------------------------------------------- learned idle


def test_too_few_gaps_learn_nothing() -> None:
    assert learned_idle_timeout([600.0] * (MIN_GAPS - 1), 180.0, 300.0) is None


def test_gaps_much_longer_than_a_boot_destroy_at_once() -> None:
    # a job every 11 minutes, boots of 3: waiting 11 minutes costs more than a boot
    got = learned_idle_timeout([660.0] * 20, 180.0, 300.0)
    assert got is not None and got[0] == 0.0


def test_gaps_shorter_than_a_boot_keep_the_machine_through_them() -> None:
    # jobs 6-7 minutes apart, boots of 10: keep the machine past the configured 5 minutes
    gaps = [360.0, 400.0, 380.0, 420.0] * 3
    got = learned_idle_timeout(gaps, 600.0, 300.0)
    assert got is not None and got[0] >= max(gaps)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.floats(0, 20_000), min_size=MIN_GAPS, max_size=64),
    st.floats(1, 1800),
    st.floats(1, 3600),
)
def test_the_learned_timeout_never_costs_more_than_the_configured_one_and_stays_in_bounds(
    gaps: list[float], boot: float, configured: float
) -> None:
    got = learned_idle_timeout(gaps, boot, configured)
    assert got is not None
    timeout, why = got
    assert 0 <= timeout <= configured * LEARNED_MAX_FACTOR + 1e-9
    assert _cost(gaps, timeout, boot) <= _cost(gaps, configured, boot) + 1e-6
    assert f"{len(gaps)} gaps" in why


def _sparse(**over: object) -> Snapshot:
    """One idle machine, 6 minutes idle after a job, on a queue that showed 11-minute gaps."""
    history = QueueHistory(quiet_gaps=(660.0,) * 20)
    qs = QueueSnapshot(
        "q",
        metrics(pending=0),
        (ready("m1", idle_for=60.0),),
        boot_estimate=180.0,
        history=history,
    )
    return Snapshot((replace(qs, **over),))  # type: ignore[arg-type]


def test_decide_drains_an_idle_machine_at_the_learned_timeout() -> None:
    cfg = config([{"trigger": "no_workers"}], [{"trigger": "idle", "timeout": "5m"}])
    qp = decide(_sparse(), cfg, NOW).for_queue("q")
    assert qp is not None
    assert [d.launch_id for d in qp.drains] == ["m1"]
    assert "learned timeout" in qp.drains[0].reason
    assert any(
        n.startswith("idle timeout 0s instead of 300s: learned from 20 gaps") for n in qp.notes
    )


def test_a_machine_jobs_wait_for_is_never_judged_by_a_learned_timeout() -> None:
    # ready 3 s ago, its job not picked up yet: a learned 0 s must not drain it (and rent again)
    cfg = config(
        [{"trigger": "no_workers"}, {"trigger": "queue_depth", "target_per_worker": 1}],
        [{"trigger": "idle", "timeout": "5m"}],
    )
    just_ready = replace(
        ready("m1", created_ago=183.0), ready_at=NOW - timedelta(seconds=3), last_task_at=None
    )
    world = _sparse(metrics=metrics(pending=1, oldest=2.0), machines=(just_ready,))
    qp = decide(world, cfg, NOW).for_queue("q")
    assert qp is not None and qp.drains == () and qp.launches == ()
    # the same machine once nothing waits: the learned timeout judges it
    qp = decide(_sparse(machines=(just_ready,)), cfg, NOW).for_queue("q")
    assert qp is not None and [d.launch_id for d in qp.drains] == ["m1"]


def test_learn_false_keeps_the_configured_timeout() -> None:
    cfg = config(
        [{"trigger": "no_workers"}], [{"trigger": "idle", "timeout": "5m", "learn": False}]
    )
    qp = decide(_sparse(), cfg, NOW).for_queue("q")
    assert qp is not None and qp.drains == ()


def test_without_enough_gaps_the_configured_timeout_holds() -> None:
    cfg = config([{"trigger": "no_workers"}], [{"trigger": "idle", "timeout": "5m"}])
    few = QueueHistory(quiet_gaps=(660.0,) * (MIN_GAPS - 1))
    qp = decide(_sparse(history=few), cfg, NOW).for_queue("q")
    assert qp is not None and qp.drains == ()


def test_a_busy_machine_is_never_drained_by_a_learned_timeout() -> None:
    cfg = config([{"trigger": "no_workers"}], [{"trigger": "idle", "timeout": "5m"}])
    busy = (ready("m1", idle_for=600.0, running=1),)
    qp = decide(_sparse(machines=busy), cfg, NOW).for_queue("q")
    assert qp is not None and qp.drains == ()


# --------------------------------------------------------------------------- burst rule


def test_burst_needs_a_trusted_runtime_a_serving_machine_and_a_known_young_age() -> None:
    args = dict(
        pending=30,
        oldest_age=5.0,
        serving=1,
        booting_ages=(),
        job_seconds=10.0,
        jobs_seen=MIN_JOBS,
        boot_s=180.0,
    )
    assert burst_limit(**args) is not None  # type: ignore[arg-type]
    for over in (
        {"jobs_seen": MIN_JOBS - 1},
        {"job_seconds": None},
        {"serving": 0},
        {"oldest_age": None},
        {"oldest_age": 191.0},
        {"pending": 0},
        {"boot_s": 0.0},  # instant boots: never too late (and no division by a zero boot)
    ):
        assert burst_limit(**{**args, **over}) is None, over  # type: ignore[arg-type]


def test_short_jobs_the_fleet_starts_before_a_boot_rent_nothing() -> None:
    # 30 jobs of 10 s: one machine starts them all in 300 s; a new one would take 180 s
    got = burst_limit(30, 5.0, 2, (), 10.0, 100, 180.0)
    assert got is not None and got[0] == 0
    assert "at most 0 new" in got[1]


@settings(max_examples=300, deadline=None)
@given(
    st.integers(1, 500),
    st.integers(1, 16),
    st.lists(st.floats(0, 600), max_size=4),
    st.floats(0.1, 3600),
    st.floats(0.001, 900),
)
def test_burst_allows_what_the_work_left_after_a_boot_needs(
    pending: int, serving: int, booting: list[float], runtime: float, boot: float
) -> None:
    got = burst_limit(pending, 0.0, serving, booting, runtime, MIN_JOBS, boot)
    assert got is not None
    allowed = got[0]
    left = pending * runtime - serving * boot - sum(min(boot, a) for a in booting)
    # the fewest machines that each find no more than a boot's worth of the work left
    tol = 1e-6 * max(1.0, abs(left))
    assert allowed >= 0 and allowed * boot >= left - tol
    assert allowed == 0 or (allowed - 1) * boot < left + tol
    # more waiting work never allows fewer machines
    more = burst_limit(pending + 1, 0.0, serving, booting, runtime, MIN_JOBS, boot)
    assert more is not None and more[0] >= allowed


def _burst_world(oldest: float) -> Snapshot:
    history = QueueHistory(job_seconds=10.0, jobs_seen=100)
    qs = QueueSnapshot(
        "q",
        metrics(pending=15, oldest=oldest),
        (ready("m1", running=1),),
        boot_estimate=180.0,
        history=history,
    )
    return Snapshot((qs,))


def test_decide_rents_nothing_for_a_burst_the_serving_machine_clears_first() -> None:
    cfg = config([{"trigger": "queue_depth", "target_per_worker": 2}], max_workers=16)
    qp = decide(_burst_world(oldest=5.0), cfg, NOW).for_queue("q")
    assert qp is not None and qp.launches == ()
    assert any(n.startswith("burst:") for n in qp.notes)


def test_decide_rents_again_once_the_oldest_job_has_waited_past_a_boot_and_a_job() -> None:
    cfg = config([{"trigger": "queue_depth", "target_per_worker": 2}], max_workers=16)
    qp = decide(_burst_world(oldest=200.0), cfg, NOW).for_queue("q")
    assert qp is not None and len(qp.launches) == 7  # ceil((15 + 1) / 2) - 1


def test_the_burst_rule_never_holds_the_queue_below_its_floor() -> None:
    cfg = config(
        [{"trigger": "queue_depth", "target_per_worker": 2}], max_workers=16, min_workers=4
    )
    qp = decide(_burst_world(oldest=5.0), cfg, NOW).for_queue("q")
    assert qp is not None and len(qp.launches) == 3


def test_booting_machines_count_toward_the_work_done_before_a_boot() -> None:
    alone = burst_limit(60, 1.0, 1, (), 10.0, MIN_JOBS, 180.0)
    helped = burst_limit(60, 1.0, 1, (170.0,), 10.0, MIN_JOBS, 180.0)
    assert alone is not None and helped is not None and helped[0] < alone[0]


def test_a_boot_of_a_few_microseconds_never_overflows_the_burst_limit():
    """Found by hypothesis (a boot estimate of 5e-324 s made the work left per boot infinite)."""
    from autoscaler.policy.history import burst_limit

    got = burst_limit(
        pending=5,
        job_seconds=1e300,
        jobs_seen=1000,
        serving=1,
        booting_ages=(),
        boot_s=5e-324,
        oldest_age=0.0,
    )
    assert got is not None and got[0] == 5
