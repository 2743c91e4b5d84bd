"""A machine's word about jobs moves no job (issue: "hand-back that trusts no machine's word").

Replayed on real Redis and real Celery worker processes, on SQLite and PostgreSQL: each attack
worked on the hand-back that restored the task ids a machine's heartbeats named.

- **A job run twice by naming it**: a rented machine names the id of a job that another worker
  (a hand-made one: its heartbeat names nothing) is running, then is lost. The hand-back used
  to push that job back onto its queue while the other worker still ran it.
- **A job restored once per step**: hand-back steps racing for one lost machine, with another
  worker waiting on the queue; the job ran a third time.
- **A job kept from the hand-back by naming it**: a live machine names a lost victim's job; the
  victim's hand-back used to skip it ("held elsewhere"). No claim is consulted now: the
  victim's outcome is the same with or without the claim.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from autoscaler.control.runtime import utc_now
from autoscaler.control.steps import handback
from autoscaler.control.steps.frame import run_step
from autoscaler.lifecycle import InstanceState as S
from autoscaler.store.models import Instance
from tests.control.test_handback import QUEUE, Broker, _events, _lost_machine, _runtime


@pytest.fixture
def late(tmp_path: Path) -> Iterator[Broker]:
    b = Broker(tmp_path, "late")
    try:
        yield b
    finally:
        b.close()


@pytest.mark.timeout(120)
def test_naming_a_job_another_worker_runs_never_brings_it_back(tmp_path, db_url, late):
    rt = _runtime(tmp_path, db_url, late)
    late.worker("honest")  # a hand-made worker: no row, no heartbeat naming its jobs
    late.publish("job-x", 4.0)
    late.wait_for(("start", "honest", "job-x"))
    _lost_machine(rt, "liar", ["job-x"], acks_late=True)  # it names the honest worker's job
    run_step(handback.STEP, rt, "liar")
    assert late.waiting() == 0 and late.unacked() == 1  # still the honest worker's only
    late.worker("other")  # would take a restored copy at once
    late.wait_for(("end", "honest", "job-x"))
    time.sleep(1.0)
    assert late.marks_of() == [("start", "honest", "job-x"), ("end", "honest", "job-x")]


@pytest.mark.timeout(120)
def test_racing_hand_back_steps_never_run_a_job_a_third_time(tmp_path, db_url, late):
    rt = _runtime(tmp_path, db_url, late)
    first = late.worker("a")
    late.publish("job-1", 2.0)
    late.wait_for(("start", "a", "job-1"))
    late.kill(first)
    late.worker("b", visibility=2)  # kombu's own restore brings it back, once
    _lost_machine(rt, "m1", ["job-1"], acks_late=True)
    racers = [threading.Thread(target=run_step, args=(handback.STEP, rt, "m1")) for _ in range(4)]
    for t in racers:
        t.start()
    late.wait_for(("end", "b", "job-1"))
    for t in racers:
        t.join(60)
    for _ in range(3):  # reconcile sends the step every round until it is done
        run_step(handback.STEP, rt, "m1")
    time.sleep(3.0)  # two sweeps of b's restore: nothing left to run again
    starts = [m for m in late.marks_of() if m[0] == "start"]
    assert starts == [("start", "a", "job-1"), ("start", "b", "job-1")]
    assert late.unacked() == 0 and late.waiting() == 0
    assert len(_events(rt, "left")) == 1


@pytest.mark.timeout(120)
def test_a_live_machines_claim_keeps_no_lost_machines_job_from_coming_back(tmp_path, db_url, late):
    rt = _runtime(tmp_path, db_url, late)
    victim = late.worker("victim")
    late.publish("job-v", 2.0)
    late.wait_for(("start", "victim", "job-v"))
    late.kill(victim)
    with rt.transaction() as session:  # a live machine's heartbeat names the victim's job
        session.add(
            Instance(
                launch_id="claimer",
                queue=QUEUE,
                provider="gpu",
                state=S.READY,
                created_at=utc_now(),
                tasks=["job-v"],
            )
        )
    _lost_machine(rt, "victim", ["job-v"], acks_late=True)
    run_step(handback.STEP, rt, "victim")
    (event,) = _events(rt, "left")
    assert event.details == {"said_held": 1, "left_to_the_visibility_timeout": True}
    late.worker("b", visibility=2)  # the broker's own redelivery is not kept back either
    late.wait_for(("end", "b", "job-v"))
