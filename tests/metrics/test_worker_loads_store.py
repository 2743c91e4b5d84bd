"""What the worker-status port keeps of each worker's load, and what the tick sums from it
(SQLite and PostgreSQL)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from autoscaler.control.observe import read_sightings, record_sightings
from autoscaler.metrics.workers import QueueLoad, WorkerStatus
from autoscaler.store.db import transaction

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def test_loads_of_every_worker_process_are_summed_per_queue(sessions):
    seen = {
        # two worker processes on one hand-made host: different tasks, both count
        "w1@desk": WorkerStatus(("gpu",), 2, {"gpu": QueueLoad(2, 1, 0, None)}),
        "w2@desk": WorkerStatus(("gpu", "cpu"), 1, {"gpu": QueueLoad(1, 0, 2, 50.0),
                                                    "cpu": QueueLoad()}),
        # answered active_queues only: alive, load unknown (not a zero)
        "w3@busy": WorkerStatus(("gpu",), 1),
        # the older form of a sighting still records
        "w4@old": (("cpu",), 0),
    }
    with transaction(sessions) as s:
        record_sightings(s, seen, "inst", T0)
    with transaction(sessions) as s:
        hand_made, loads, reported = read_sightings(s, "inst", set(), T0, 30)
    assert loads == {"gpu": QueueLoad(3, 1, 2, 50.0), "cpu": QueueLoad()}
    assert reported == {"w1@desk", "w2@desk"}
    assert hand_made == {"gpu": ("w1@desk", "w3@busy"), "cpu": ("w2@desk", "w4@old")}
    # past the window every sighting is forgotten, loads with it
    with transaction(sessions) as s:
        assert read_sightings(s, "inst", set(), T0 + timedelta(seconds=31), 30) == ({}, {}, set())
