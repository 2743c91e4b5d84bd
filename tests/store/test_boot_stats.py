"""Boot statistics and the slow-host rule on PostgreSQL and SQLite: per (provider, GPU) and per
(queue, provider, GPU), the median and p90 of recent cold boots from the control plane's own
times (created_at -> ready_at), the newest 50 per key within 7 days; resumed machines, old boots
and machines not ready left out; the phases' store keeps the first report and expires."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import select

from autoscaler.control import machines
from autoscaler.lifecycle import InstanceState as S
from autoscaler.policy.boots import BootStat
from autoscaler.store import boot_phases, boots, instances
from autoscaler.store.db import transaction
from autoscaler.store.models import BootPhase, Instance, ScaleEvent

NOW = datetime(2026, 12, 3, 12, 0, tzinfo=UTC)
_n = iter(range(1_000_000))


def machine(
    *,
    seconds: float | None,
    queue: str = "q1",
    provider: str = "vast",
    gpu: str | None = "RTX 4090",
    ready_ago: timedelta = timedelta(hours=1),
    resumes: int = 0,
    host: str | None = "h",
    state: S = S.TERMINATED,
    launch_id: str | None = None,
) -> Instance:
    ready = NOW - ready_ago
    created = ready - timedelta(seconds=seconds) if seconds is not None else ready
    return Instance(
        launch_id=launch_id or f"m{next(_n)}",
        queue=queue,
        provider=provider,
        state=state,
        gpu=gpu,
        host_id=host,
        created_at=created,
        ready_at=ready if seconds is not None else None,
        resumes=resumes,
    )


def test_boot_stats_per_provider_gpu_and_per_queue(sessions):
    with transaction(sessions) as s:
        # vast / RTX 4090: 10 boots of 100..190 s over two queues
        for i in range(10):
            queue = "q1" if i < 6 else "q2"
            s.add(machine(seconds=100 + 10 * i, queue=queue, ready_ago=timedelta(minutes=i + 1)))
        # left out: resumed, older than 7 days, never ready, ready before its intent
        s.add(machine(seconds=9000, resumes=1))
        s.add(machine(seconds=9000, ready_ago=timedelta(days=8)))
        s.add(machine(seconds=None, state=S.BOOTING))
        s.add(machine(seconds=-50))
        # another GPU and another provider; a GPU nobody knows
        s.add(machine(seconds=30, gpu="A100"))
        s.add(machine(seconds=60, provider="runpod", gpu="A100", host="EU-RO-1"))
        s.add(machine(seconds=45, gpu=None))
    with transaction(sessions) as s:
        stats = boots.boot_stats(s, NOW)
        by_queue = boots.boot_stats_by_queue(s, NOW)
    assert stats == {
        # median of 100..190 = 145; p90 nearest rank: the 9th of 10 = 180
        ("vast", "RTX 4090"): BootStat(145.0, 180.0, 10),
        ("vast", "A100"): BootStat(30.0, 30.0, 1),
        ("runpod", "A100"): BootStat(60.0, 60.0, 1),
        ("vast", ""): BootStat(45.0, 45.0, 1),
    }
    assert by_queue[("q1", "vast", "RTX 4090")] == BootStat(125.0, 150.0, 6)
    assert by_queue[("q2", "vast", "RTX 4090")] == BootStat(175.0, 190.0, 4)
    assert set(by_queue) == {
        ("q1", "vast", "RTX 4090"),
        ("q2", "vast", "RTX 4090"),
        ("q1", "vast", "A100"),
        ("q1", "runpod", "A100"),
        ("q1", "vast", ""),
    }


def test_only_the_newest_50_per_key_count(sessions):
    with transaction(sessions) as s:
        # 50 recent boots of 60 s, and 20 older (still within 7 days) of an hour
        for i in range(50):
            s.add(machine(seconds=60, ready_ago=timedelta(minutes=i + 1)))
        for i in range(20):
            s.add(machine(seconds=3600, ready_ago=timedelta(days=2, minutes=i)))
        # a queue of its own whose few boots are older than the 50 newest of the key: its
        # own statistics keep them, the (provider, GPU) ones do not
        for i in range(3):
            s.add(machine(seconds=500, queue="rare", ready_ago=timedelta(days=3, minutes=i)))
    with transaction(sessions) as s:
        stats = boots.boot_stats(s, NOW)
        by_queue = boots.boot_stats_by_queue(s, NOW)
    assert stats == {("vast", "RTX 4090"): BootStat(60.0, 60.0, 50)}
    assert by_queue[("q1", "vast", "RTX 4090")] == BootStat(60.0, 60.0, 50)
    assert by_queue[("rare", "vast", "RTX 4090")] == BootStat(500.0, 500.0, 3)


def test_boot_estimates_keep_their_meaning_whatever_one_queue_holds(sessions):
    """The queue's estimate is still the longest of its last 5 cold boots of 30 days, and a
    queue with few boots is not crowded out by a busy one (one query either way)."""
    with transaction(sessions) as s:
        for i in range(80):  # newer than every boot of "quiet"
            s.add(machine(seconds=50, queue="busy", ready_ago=timedelta(seconds=i + 1)))
        for i, secs in enumerate((70, 80, 90, 100, 110, 999)):  # the 999 s one is the 6th newest
            s.add(machine(seconds=secs, queue="quiet", ready_ago=timedelta(hours=2 + i)))
        s.add(machine(seconds=5000, queue="quiet", resumes=2, ready_ago=timedelta(minutes=1)))
    with transaction(sessions) as s:
        assert boots.boot_estimates(s, ["busy", "quiet", "none"], NOW) == {
            "busy": 50.0,
            "quiet": 110.0,
        }


def _slow_setup(sessions, earlier: int, took: float, **booting: object) -> None:
    with transaction(sessions) as s:
        for i in range(earlier):
            s.add(machine(seconds=100 + i, host=f"h{i}", ready_ago=timedelta(hours=i + 1)))
        s.add(machine(seconds=50, gpu="A100", host="other"))  # another GPU: not its peers
        row = machine(seconds=None, state=S.BOOTING, launch_id="new", host="slowhost")
        row.created_at = NOW - timedelta(seconds=took)
        for k, v in booting.items():
            setattr(row, k, v)
        s.add(row)


def _mark(sessions) -> machines.Readied | None:
    with transaction(sessions) as s:
        return machines.mark_ready(s, "new", "q1", "vast", NOW, "its worker is up (test)")


def _events(sessions) -> list[ScaleEvent]:
    with transaction(sessions) as s:
        return list(s.scalars(select(ScaleEvent).where(ScaleEvent.action == "slow_host")))


def test_a_cold_boot_over_three_medians_names_its_host_with_an_event(sessions):
    _slow_setup(sessions, 5, 400.0)  # earlier 100..104 s, median 102 s: 400 > 306
    ready = _mark(sessions)
    assert ready is not None and not ready.resumed
    assert ready.slow_host is not None
    assert (ready.slow_host.provider, ready.slow_host.host_id) == ("vast", "slowhost")
    assert "400s" in ready.slow_host.reason and "median 102s" in ready.slow_host.reason
    (e,) = _events(sessions)
    assert (e.kind, e.queue, e.launch_id) == ("boot", "q1", "new")
    assert e.details == {
        "provider": "vast",
        "host": "slowhost",
        "gpu": "RTX 4090",
        "seconds": 400.0,
        "median_seconds": 102.0,
        "samples": 5,
        "factor": 3.0,
    }
    with transaction(sessions) as s:
        row = instances.get(s, "new")
        assert row is not None and row.state == S.READY and row.ready_at == NOW
    # the move is made once: a second caller gets nothing, and no second event
    assert _mark(sessions) is None and len(_events(sessions)) == 1


@pytest.mark.parametrize(
    ("earlier", "took", "booting"),
    [
        (4, 1000.0, {}),  # four earlier boots: too few to judge
        (5, 306.0, {}),  # exactly 3 × the median: not more
        (5, 1000.0, {"host_id": None}),  # no host to avoid
        (5, 1000.0, {"resumes": 1, "state": S.RESUMING}),  # a resume: a warm hit, not a boot
    ],
)
def test_nothing_is_judged_slow_without_reason(sessions, earlier, took, booting):
    _slow_setup(sessions, earlier, took, **booting)
    ready = _mark(sessions)
    assert ready is not None and ready.slow_host is None
    assert ready.resumed == (booting.get("resumes") == 1)
    assert _events(sessions) == []


def test_judge_false_moves_without_judging(sessions):
    _slow_setup(sessions, 5, 1000.0)
    with transaction(sessions) as s:
        ready = machines.mark_ready(s, "new", "q1", "vast", NOW, "drain", judge=False)
    assert ready is not None and ready.slow_host is None and _events(sessions) == []


def test_phases_first_report_wins_clamped_and_old_ones_expire(sessions):
    with transaction(sessions) as s:
        s.add(machine(seconds=None, state=S.BOOTING, launch_id="b1", host="h9"))
        s.add(machine(seconds=None, state=S.BOOTING, launch_id="old", host="h8"))
    with transaction(sessions) as s:
        row = instances.get(s, "b1")
        assert row is not None
        start = row.created_at
        kept = boot_phases.record(
            s,
            row,
            {"registered": start + timedelta(seconds=5), "started": start - timedelta(days=1)},
            NOW,
        )
        assert kept == ["started", "registered"]  # in the phases' order
        with pytest.raises(ValueError, match="not a boot phase"):
            boot_phases.record(s, row, {"rebooted": NOW}, NOW)
    with transaction(sessions) as s:
        row = instances.get(s, "b1")
        assert row is not None
        assert boot_phases.record(s, row, {"started": start + timedelta(seconds=1)}, NOW) == []
        got = {p.phase: p for p in boot_phases.of_launch(s, "b1")}
        assert got["started"].at == start and got["started"].received_at == NOW
        assert got["registered"].at == start + timedelta(seconds=5)
        assert (got["started"].provider, got["started"].gpu, got["started"].host_id) == (
            "vast",
            "RTX 4090",
            "h9",
        )
    # a month later, a new report forgets the phases received over KEEP ago
    later = NOW + boot_phases.KEEP + timedelta(minutes=1)
    with transaction(sessions) as s:
        row = instances.get(s, "old")
        assert row is not None
        assert boot_phases.record(s, row, {"started": later}, later) == ["started"]
    with transaction(sessions) as s:
        assert [p.launch_id for p in s.scalars(select(BootPhase))] == ["old"]


def test_the_boot_estimate_follows_the_provider_and_gpu_the_queue_rents_from_now(sessions):
    """A queue that moved from slow RunPod boots to fast Vast ones (placement across
    providers): its estimate is its Vast boots' longest, not the slow provider's; a queue whose
    newest pair has no other boot falls back to all of its boots."""
    with transaction(sessions) as s:
        for i in range(5):  # older, slow: RunPod
            s.add(
                machine(
                    seconds=600 + i,
                    queue="moved",
                    provider="pods",
                    ready_ago=timedelta(hours=3 + i),
                )
            )
        for i, secs in enumerate((60, 70, 80)):  # newer, fast: Vast
            s.add(
                machine(
                    seconds=secs, queue="moved", provider="vast", ready_ago=timedelta(hours=1 + i)
                )
            )
        s.add(machine(seconds=900, queue="mixed", provider="pods", ready_ago=timedelta(hours=2)))
        s.add(machine(seconds=100, queue="mixed", provider="vast", gpu="A100 80GB"))
    with transaction(sessions) as s:
        assert boots.boot_estimates(s, ["moved", "mixed"], NOW) == {"moved": 80.0, "mixed": 100.0}


def test_a_slow_boot_seen_through_remote_control_returns_its_host_to_avoid(sessions):
    """The remote-control path makes the same judgement and hands the host back, for its
    caller to avoid after the commit (`observe_celery_workers`)."""
    from autoscaler.control.observe import record_sightings
    from autoscaler.providers.labels import make_label

    _slow_setup(sessions, 5, 400.0)
    worker = f"{make_label('inst1', 'new')}@gpu-box"
    with transaction(sessions) as s:
        slow = record_sightings(s, {worker: (("q1",), 0)}, "inst1", NOW, "redis://x/0")
    assert [(h.provider, h.host_id) for h in slow] == [("vast", "slowhost")]
    with transaction(sessions) as s:
        row = instances.get(s, "new")
        assert row is not None and row.state == S.READY
