"""What the worker-status port keeps of each worker's load, and what the tick sums from it
(SQLite and PostgreSQL)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from autoscaler.brokers.workers import QueueLoad, WorkerStatus, host_of
from autoscaler.control.observe import read_sightings, record_sightings
from autoscaler.providers.labels import make_label
from autoscaler.store.db import transaction

T0 = datetime(2026, 1, 1, tzinfo=UTC)
DOMAIN = "redis://127.0.0.1:6379/0"


def test_loads_of_every_worker_process_are_summed_per_queue(sessions):
    seen = {
        # two worker processes on one hand-made host: different tasks, both count
        "w1@desk": WorkerStatus(("gpu",), 2, {"gpu": QueueLoad(2, 1, 0, None)}),
        "w2@desk": WorkerStatus(
            ("gpu", "cpu"), 1, {"gpu": QueueLoad(1, 0, 2, 50.0), "cpu": QueueLoad()}
        ),
        # answered active_queues only: alive, load unknown (not a zero)
        "w3@busy": WorkerStatus(("gpu",), 1),
        # the older form of a sighting still records
        "w4@old": (("cpu",), 0),
    }
    with transaction(sessions) as s:
        record_sightings(s, seen, "inst", T0, DOMAIN)
    with transaction(sessions) as s:
        hand_made, loads, reported = read_sightings(s, "inst", set(), T0, 30)
    assert loads == {"gpu": QueueLoad(3, 1, 2, 50.0), "cpu": QueueLoad()}
    assert reported == {"w1@desk", "w2@desk"}
    assert hand_made == {"gpu": ("w1@desk", "w3@busy"), "cpu": ("w2@desk", "w4@old")}
    # past the window every sighting is forgotten, loads with it
    with transaction(sessions) as s:
        assert read_sightings(s, "inst", set(), T0 + timedelta(seconds=31), 30) == ({}, {}, set())


def test_a_host_counts_once_and_a_worker_of_ours_is_never_hand_made(sessions):
    """Our machines and broker-seen workers count each host once: a worker on the host of one
    of our machines, or named after one of our launches, is ours and never hand-made capacity;
    two workers on one hand-made host are one machine."""
    seen = {
        "celery@gpu-a": WorkerStatus(("q",), 0),  # the worker of our machine on host gpu-a
        f"{make_label('inst', 'l1')}@box": WorkerStatus(("q",), 0),  # named after our launch
        "celery@desk": WorkerStatus(("q",), 1),  # the GPU under the desk
        "other@DESK": WorkerStatus(("q",), 0),  # a second worker on that host
    }
    with transaction(sessions) as s:
        record_sightings(s, seen, "inst", T0, DOMAIN)
    with transaction(sessions) as s:
        hand_made, _, _ = read_sightings(s, "inst", {"gpu-a", "gpu-b"}, T0, 30)
    assert list(hand_made) == ["q"] and len(hand_made["q"]) == 1
    assert host_of(hand_made["q"][0]) == "desk"


def test_one_worker_name_heard_in_two_domains_is_two_sightings_each_scoped(sessions):
    """`celery@gpu` of two applications (two prefixes) are two workers: neither overwrites the
    other, and a scope that keeps each domain's queues counts each where it was heard."""
    other = DOMAIN + " prefix 'b:'"
    with transaction(sessions) as s:
        record_sightings(s, {"celery@gpu": WorkerStatus(("jobs",), 1)}, "inst", T0, DOMAIN)
        record_sightings(s, {"celery@gpu": WorkerStatus(("jobs",), 0)}, "inst", T0, other)
    homes = {(DOMAIN, "jobs"): ["a"], (other, "jobs"): ["b"]}
    with transaction(sessions) as s:
        hand_made, _, _ = read_sightings(
            s, "inst", set(), T0, 30, lambda d, q, _seen: homes.get((d, q), ())
        )
    assert hand_made == {"a": ("celery@gpu",), "b": ("celery@gpu",)}


def test_a_queues_boot_time_is_the_longest_of_its_last_five_boots(sessions):
    from autoscaler.lifecycle import InstanceState
    from autoscaler.store.boots import boot_estimates
    from autoscaler.store.models import Instance

    boots = [300, 40, 90, 60, 70, 50]  # seconds from intent to ready, oldest first
    with transaction(sessions) as s:
        for i, secs in enumerate(boots):
            created = T0 - timedelta(hours=len(boots) - i)
            s.add(
                Instance(
                    launch_id=f"l{i}",
                    queue="gpu",
                    provider="p",
                    state=InstanceState.TERMINATED,
                    created_at=created,
                    ready_at=created + timedelta(seconds=secs),
                )
            )
        s.add(
            Instance(
                launch_id="never",
                queue="cpu",
                provider="p",
                state=InstanceState.FAILED,
                created_at=T0,
            )
        )
    with transaction(sessions) as s:
        assert boot_estimates(s, ["gpu", "cpu"], T0) == {"gpu": 90.0}
        assert boot_estimates(s, [], T0) == {}


def test_a_booting_machine_seen_through_remote_control_is_ready_at_once(sessions):
    """The first sight of one of our workers moves its row booting -> ready in the same write
    as the sighting (the event and the cleared backoff reconcile would give), once; rows of
    another installation, or already ready, are not moved."""
    from sqlalchemy import select

    from autoscaler.config.models import Backoff
    from autoscaler.control import machines
    from autoscaler.lifecycle import InstanceState as S
    from autoscaler.store import backoffs
    from autoscaler.store.models import Instance, ScaleEvent

    with transaction(sessions) as s:
        for lid, state in (("boot1", S.BOOTING), ("ready1", S.READY)):
            s.add(
                Instance(
                    launch_id=lid,
                    queue="gpu",
                    provider="p",
                    state=state,
                    created_at=T0,
                    booting_at=T0,
                )
            )
        machines.rental_failed(s, "gpu", "p", T0, Backoff(base=30, jitter=0), "boom")
    seen = {
        "asg-inst-boot1@gpu-host": WorkerStatus(("gpu",), 0),
        "asg-inst-ready1@gpu-host2": WorkerStatus(("gpu",), 1),
        "asg-other-boot1@elsewhere": WorkerStatus(("gpu",), 0),  # another installation's
    }
    for at in (T0 + timedelta(seconds=5), T0 + timedelta(seconds=10)):
        with transaction(sessions) as s:
            record_sightings(s, seen, "inst", at, DOMAIN)
    with transaction(sessions) as s:
        rows = {r.launch_id: r for r in s.scalars(select(Instance))}
        assert rows["boot1"].state == S.READY
        assert rows["boot1"].ready_at == T0 + timedelta(seconds=5)
        assert rows["boot1"].last_heartbeat_at == T0 + timedelta(seconds=10)
        assert rows["ready1"].ready_at is None  # was ready already: not moved again
        events = [(e.kind, e.action, e.launch_id) for e in s.scalars(select(ScaleEvent))]
        assert events == [("lifecycle", "booting->ready", "boot1")]
        assert backoffs.by_queue(s) == {}  # the rental worked
