"""The control loop under faults: duplicate schedulers and workers, workers SIGKILLed at the worst
moments, redelivered tasks, machines dying, a provider answering 5xx after creating.

Every test drives real `celery -A autoscaler` processes on PostgreSQL (state) and Redis
(control broker, database 13; watched queues, database 12) and ends with `check_invariants`
against the store and the provider. Where a fault must land between two statements of a task,
the test holds that task at the exact statement with a PostgreSQL trigger in the test's own
database (`pg_sleep` while a flag row exists), kills the worker while it waits there, then
terminates the orphaned backend and drops the flag: deterministic, no timing guesswork.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from autoscaler.config.machine_specs import InstanceSpec
from autoscaler.config.provider_options import MockOptions
from autoscaler.policy.reconcile import INTENT_STALE, ORPHAN_GRACE
from autoscaler.providers.base import LaunchSpec
from autoscaler.providers.mock import MockProvider
from autoscaler.store import events, intents
from autoscaler.store.db import transaction
from autoscaler.store.mock_machines import StoredMockMachines
from autoscaler.store.models import OrphanSighting
from tests.control.loopchecks import (
    AtProvider,
    check_invariants,
    first_event,
    local_machines,
    mock_machines,
)
from tests.control.loopkit import Loop
from tests.control.loopworld import POLL, Watched, local_command, mock_config, mock_queue
from tests.fakes.runpod_server import FakeRunPod


@pytest.fixture
def make_loop(tmp_path: Path) -> Iterator[Callable[..., Loop]]:
    """Loops made by the test; each is closed (processes, machines, keys) whatever happens."""
    made: list[Loop] = []

    def make(*args: Any, **kwargs: Any) -> Loop:
        made.append(Loop(tmp_path, *args, **kwargs))
        return made[-1]

    try:
        yield make
    finally:
        for loop in made:
            loop.close()


def launches(loop: Loop, queue: str) -> list[dict[str, Any]]:
    return [e for e in loop.events(queue) if (e["kind"], e["action"]) == ("scale_up", "launch")]


# --------------------------------------------------------------------------- holding a task


HOLD_SQL = """
CREATE TABLE chaos_hold (what text PRIMARY KEY);
CREATE FUNCTION chaos_hold_booting() RETURNS trigger AS $$
BEGIN
  IF OLD.state = 'creating' AND NEW.state = 'booting'
     AND EXISTS (SELECT 1 FROM chaos_hold WHERE what = 'booting') THEN
    PERFORM pg_sleep(120);
  END IF;
  RETURN NEW;
END $$ LANGUAGE plpgsql;
CREATE TRIGGER chaos_hold_booting BEFORE UPDATE ON instances
  FOR EACH ROW EXECUTE FUNCTION chaos_hold_booting();
CREATE FUNCTION chaos_hold_release() RETURNS trigger AS $$
BEGIN
  IF EXISTS (SELECT 1 FROM chaos_hold WHERE what = 'release')
     AND EXISTS (SELECT 1 FROM instances WHERE state = 'pending') THEN
    PERFORM pg_sleep(120);
  END IF;
  RETURN OLD;
END $$ LANGUAGE plpgsql;
CREATE TRIGGER chaos_hold_release BEFORE DELETE ON leases
  FOR EACH ROW EXECUTE FUNCTION chaos_hold_release();
"""
"""`booting`: a launch task waits at its write creating -> booting, after the provider made
the machine. `release`: an evaluation waits at its lease release, after its intents are
committed and before it enqueues their launch tasks."""


def install_holds(loop: Loop) -> None:
    with loop.engine.begin() as conn:
        conn.exec_driver_sql(HOLD_SQL)


def held_backends(loop: Loop) -> list[int]:
    """Backends of the store sleeping in a hold."""
    return [
        pid
        for (pid,) in loop.sql(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
            "AND wait_event = 'PgSleep'"
        )
    ]


def release_holds(loop: Loop, backends: list[int]) -> None:
    """The killed worker's backend would sleep on holding its row lock: end it, drop the flag."""
    loop.sql("DELETE FROM chaos_hold")
    for pid in backends:
        loop.sql("SELECT pg_terminate_backend(:pid)", pid=pid)
    loop.wait(lambda: not held_backends(loop), 10, "the held backend gone")


# --------------------------------------------------------------------------- a. duplicates


@pytest.mark.timeout(150)
def test_chaos_two_beats_and_two_workers_launch_once_for_one_load(pg_url, make_loop):
    loop = make_loop(pg_url)
    watched = Watched(loop, "chaos-dup")
    q = watched.queue
    loop.setup(
        mock_config(
            {
                q: mock_queue(
                    watched,
                    max_workers=5,
                    scale_up=[
                        {"trigger": "no_workers"},
                        {"trigger": "queue_depth", "target_per_worker": 2},
                    ],
                    scale_down=[],
                )
            }
        )
    )
    workers = [loop.worker("w1", concurrency=3), loop.worker("w2", concurrency=3)]
    beats = [loop.beat("beat1"), loop.beat("beat2")]
    watched.publish(6)  # no worker takes them: one evaluation wants ceil(6 / 2) = 3 machines

    loop.wait(lambda: len(loop.instances(q)) >= 3, 30, "three launches")
    loop.wait(lambda: len(loop.rows_in(q, "ready")) == 3, 30, "three ready")
    time.sleep(8)  # four more polls and eight fast paths from each beat: nothing more

    rows = loop.instances(q)
    assert len(rows) == 3, loop.dump()
    assert len(launches(loop, q)) == 3
    assert len(mock_machines(loop)) == 3
    assert all(r["attempts"] == 1 for r in rows)
    # both beats and both workers really took part
    for beat in beats:
        assert "Sending due task autoscaler-tick" in beat.text()
    for worker in workers:
        assert "autoscaler.tick" in worker.text() or "autoscaler.fast_path" in worker.text()
    check_invariants(loop, {q: 5}, mock_machines(loop))


# --------------------------------------------------------------------------- b. killed mid-launch


@pytest.mark.timeout(150)
def test_chaos_worker_killed_between_create_and_booting_is_adopted_not_duplicated(
    pg_url, make_loop
):
    loop = make_loop(pg_url)
    watched = Watched(loop, "chaos-kill")
    q = watched.queue
    loop.setup(mock_config({q: mock_queue(watched, max_workers=1, scale_down=[])}))
    install_holds(loop)
    loop.sql("INSERT INTO chaos_hold VALUES ('booting')")
    worker = loop.worker("w1", concurrency=3)
    loop.beat()
    watched.publish(2)

    backends = loop.wait(lambda: held_backends(loop), 30, "the launch held before booting")
    row = loop.instances(q)[0]
    assert row["state"] == "creating"
    made = mock_machines(loop)
    assert len(made) == 1 and made[0].label.endswith(row["launch_id"]), made
    loop.kill(worker)  # SIGKILL the worker's whole process group mid-launch
    release_holds(loop, backends)
    assert [r["state"] for r in loop.instances(q)] == ["creating"]

    loop.worker("w2", concurrency=3)
    adopted = loop.wait(
        lambda: first_event(loop.events(q), "reconcile", "creating->booting"),
        30,
        "reconcile adopting the machine by its label",
    )
    assert "create confirmed" in adopted["reason"], adopted
    loop.wait(lambda: loop.rows_in(q, "ready"), 20, "the adopted machine ready")
    rows = loop.instances(q)
    assert len(rows) == 1 and rows[0]["provider_instance_id"] == made[0].machine_id
    assert len(mock_machines(loop)) == 1
    check_invariants(loop, {q: 1}, mock_machines(loop))


# --------------------------------------------------------------------------- c. redelivery


@pytest.mark.timeout(150)
def test_chaos_redelivered_launches_and_ticks_make_one_machine(pg_url, make_loop):
    loop = make_loop(pg_url)
    watched = Watched(loop, "chaos-redeliver")
    spare = Watched(loop, "chaos-spare")
    q, q2 = watched.queue, spare.queue
    loop.setup(
        mock_config(
            {
                q: mock_queue(watched, max_workers=3, scale_down=[]),
                q2: mock_queue(spare, max_workers=3, scale_down=[]),
            }
        )
    )
    loop.worker("w1", concurrency=4)  # no beat: only the test sends tasks
    watched.publish(3)

    # Two ticks in the same second (a second beat, a redelivered message).
    client = loop.client()
    ticks = [client.send_task("autoscaler.tick") for _ in range(2)]
    results = [t.get(timeout=30) for t in ticks]
    assert sum(len(r["launched"]) for r in results) == 1, results
    row = loop.wait(lambda: loop.rows_in(q, "booting"), 20, "the launch done")[0]

    # The same launch delivered twice more, by `celery call`.
    calls = [loop.celery_call("autoscaler.launch", [row["launch_id"]]) for _ in range(2)]
    answers = [loop.result(c) for c in calls]
    assert all(a.startswith("not pending") for a in answers), answers
    rows = loop.instances(q)
    assert len(rows) == 1 and rows[0]["attempts"] == 1

    # Two deliveries racing for one fresh intent (as a tick writes it).
    launch_id = "redelivered" + datetime.now(UTC).strftime("%H%M%S%f")
    with transaction(loop.sessions) as session:
        now = datetime.now(UTC)
        intents.add_intents(session, [(launch_id, q2, "sandbox", "test: an intent")], now)
        events.record(
            session,
            [events.event("scale_up", "launch", "test: an intent", queue=q2, launch_id=launch_id)],
            now,
        )
    racing = [client.send_task("autoscaler.launch", args=[launch_id]) for _ in range(2)]
    raced = sorted(r.get(timeout=30) for r in racing)
    assert raced[0].startswith("booting") and raced[1].startswith("not pending"), raced
    label = f"asg-{loop.installation_id}-{launch_id}"
    assert [m.label for m in mock_machines(loop)].count(label) == 1
    created = [e for e in loop.events(q2) if (e["kind"], e["action"]) == ("launch", "created")]
    assert len(created) == 1

    reconciled = loop.result(loop.celery_call("autoscaler.reconcile", []))
    assert reconciled["transitions"] >= 1
    assert len(mock_machines(loop)) == 2
    check_invariants(loop, {q: 3, q2: 3}, mock_machines(loop))


# --------------------------------------------------------------------------- d. lost enqueue


@pytest.mark.timeout(150)
def test_chaos_worker_killed_between_tick_and_launch_leaves_an_intent_reconcile_enqueues(
    pg_url, make_loop
):
    loop = make_loop(pg_url)
    watched = Watched(loop, "chaos-intent")
    q = watched.queue
    loop.setup(mock_config({q: mock_queue(watched, max_workers=2, scale_down=[])}))
    install_holds(loop)
    loop.sql("INSERT INTO chaos_hold VALUES ('release')")
    worker = loop.worker("w1", concurrency=3)
    loop.beat()
    watched.publish(2)

    backends = loop.wait(lambda: held_backends(loop), 30, "an evaluation held after its intent")
    rows = loop.instances(q)
    assert [r["state"] for r in rows] == ["pending"], rows
    intent = rows[0]
    loop.kill(worker)  # the launch task was never sent
    release_holds(loop, backends)

    loop.worker("w2", concurrency=3)
    row = loop.wait(
        lambda: [r for r in loop.instances(q) if r["state"] not in ("pending",)],
        60,
        "reconcile re-enqueueing the stale intent",
    )[0]
    assert row["launch_id"] == intent["launch_id"]
    waited = row["creating_at"] - intent["pending_at"]
    stale = min(INTENT_STALE, 3 * POLL)  # three polls, 30 s at most
    assert waited.total_seconds() >= stale, "re-enqueued only once the intent is stale"
    loop.wait(lambda: loop.rows_in(q, "ready"), 20, "the machine ready")
    rows = loop.instances(q)
    assert len(rows) == 1, "no second launch while the intent waited"
    assert len(mock_machines(loop)) == 1
    check_invariants(loop, {q: 2}, mock_machines(loop))


# --------------------------------------------------------------------------- e. machines dying


@pytest.mark.timeout(150)
def test_chaos_a_dead_machine_is_terminated_and_replaced_while_load_remains(pg_url, make_loop):
    loop = make_loop(pg_url)
    watched = Watched(loop, "chaos-dies")
    q = watched.queue
    loop.setup(mock_config({q: mock_queue(watched, max_workers=1, scale_down=[])}))
    loop.worker("w1", concurrency=3)
    loop.beat()
    watched.publish(3)
    first = loop.wait(lambda: loop.rows_in(q, "ready"), 30, "a ready machine")[0]

    provider = MockProvider(
        "sandbox",
        MockOptions.model_validate({"kind": "mock"}),
        loop.installation_id,
        StoredMockMachines(loop.sessions),
    )
    assert provider.kill(first["provider_instance_id"])

    loop.wait(
        lambda: any(
            r["launch_id"] == first["launch_id"] and r["state"] == "terminated"
            for r in loop.instances(q)
        ),
        30,
        "the dead machine terminated",
    )
    replacement = loop.wait(
        lambda: [r for r in loop.rows_in(q, "ready") if r["launch_id"] != first["launch_id"]],
        30,
        "a replacement ready",
    )[0]
    events = loop.events(q)
    dead = first_event(events, "reconcile", "ready->terminating", first["launch_id"])
    assert dead is not None and "dead at the provider" in dead["reason"], dead
    assert first_event(events, "terminate", "destroyed", first["launch_id"]) is not None
    again = first_event(events, "scale_up", "launch", replacement["launch_id"])
    assert again is not None and again["reason"].startswith("no_workers"), again
    rows = loop.instances(q)
    assert len(rows) == 2
    assert replacement["created_at"] >= next(
        r["terminated_at"] for r in rows if r["launch_id"] == first["launch_id"]
    ), "the replacement waited for the dead machine to stop billing (max_workers 1)"
    check_invariants(loop, {q: 1}, mock_machines(loop))


# --------------------------------------------------------------------------- f. 5xx after create

RUNPOD_KEY = "rpa_LOOPTEST_4f9c2e7b1d_not_a_real_key"


@pytest.mark.timeout(150)
def test_chaos_provider_5xx_after_create_is_found_by_label_and_the_loop_carries_on(
    pg_url, make_loop
):
    fake = FakeRunPod(RUNPOD_KEY)
    try:
        loop = make_loop(pg_url, extra_env={"LOOP_RUNPOD_KEY": RUNPOD_KEY})
        watched = Watched(loop, "chaos-5xx")
        q = watched.queue
        queue = mock_queue(watched, max_workers=2, scale_down=[], provider="pods")
        queue["autoscale"]["boot_timeout"] = 12
        queue["autoscale"]["instance"]["max_price_per_hour"] = 0.8
        config = mock_config({q: queue})
        config["providers"]["pods"] = {
            "kind": "runpod",
            "api_key_env": "LOOP_RUNPOD_KEY",
            "base_url": fake.url,
            "gpu_types": ["NVIDIA GeForce RTX 4090"],
        }
        loop.setup(config)
        fake.fail_after_create = 1
        loop.worker("w1", concurrency=3)
        loop.beat()
        watched.publish(2)

        row = loop.wait(lambda: loop.rows_in(q, "booting"), 30, "the launch through a 5xx")[0]
        assert fake.fail_after_create == 0, "the create was answered 500 after making the pod"
        assert len(fake.calls("POST", "/v2/pods")) == 1, "created once, never blind twice"
        pods = fake.live_pods()
        assert len(pods) == 1 and row["provider_instance_id"] == pods[0]["id"]
        assert pods[0]["name"] == f"asg-{loop.installation_id}-{row['launch_id']}"

        # It never gets a worker: the boot timeout ends it, and the load launches again.
        gone = loop.wait(
            lambda: first_event(loop.events(q), "terminate", "destroyed", row["launch_id"]),
            40,
            "the silent pod destroyed after the boot timeout",
        )
        assert gone is not None
        second = loop.wait(
            lambda: [r for r in loop.rows_in(q, "booting") if r["launch_id"] != row["launch_id"]],
            30,
            "the loop launching again",
        )[0]
        assert len(fake.calls("POST", "/v2/pods")) == 2
        watched.empty()
        pods = fake.live_pods()
        assert [p["id"] for p in pods] == [second["provider_instance_id"]]
        check_invariants(
            loop,
            {q: 2},
            [AtProvider("pods", p["id"], p["name"]) for p in fake.live_pods()],
        )
        assert RUNPOD_KEY not in "".join(p.text() for p in loop.procs)
    finally:
        fake.close()
    assert fake.spec_violations == [], fake.spec_violations


# --------------------------------------------------------------------------- g. orphans


@pytest.mark.timeout(120)
def test_chaos_orphans_are_destroyed_after_their_grace_and_not_before(pg_url, make_loop):
    loop = make_loop(pg_url)
    watched = Watched(loop, "chaos-orphan")
    q = watched.queue
    loop.setup(mock_config({q: mock_queue(watched, max_workers=2, scale_down=[])}))
    provider = MockProvider(
        "sandbox",
        MockOptions.model_validate({"kind": "mock"}),
        loop.installation_id,
        StoredMockMachines(loop.sessions),
    )
    spec = InstanceSpec(gpu="RTX 4090", max_price_per_hour=1.0)
    offer = provider.find_offers(spec)[0]
    # Two machines with our label and no row (a launch whose row was lost), one seen long ago.
    old = provider.create(offer, LaunchSpec.new(loop.installation_id, "orphanold", {}))
    new = provider.create(offer, LaunchSpec.new(loop.installation_id, "orphannew", {}))
    with transaction(loop.sessions) as session:
        session.add(
            OrphanSighting(
                provider="sandbox",
                provider_instance_id=old.provider_instance_id,
                label=old.label,
                first_seen_at=datetime.now(UTC) - timedelta(seconds=ORPHAN_GRACE + 1),
            )
        )
    loop.worker("w1", concurrency=3)
    loop.beat()

    loop.wait(
        lambda: old.provider_instance_id not in {m.machine_id for m in mock_machines(loop)},
        20,
        "the old orphan destroyed",
    )
    destroyed = [e for e in loop.events() if e["action"] == "destroy_orphan"]
    assert len(destroyed) == 1 and old.label in destroyed[0]["reason"], destroyed
    time.sleep(2 * 2)  # two more reconciles: the young orphan is kept (its grace runs)
    assert new.provider_instance_id in {m.machine_id for m in mock_machines(loop)}
    with transaction(loop.sessions) as session:
        kept = session.get(OrphanSighting, ("sandbox", new.provider_instance_id))
        assert kept is not None, "the young orphan's first sighting is kept for its grace"
    check_invariants(
        loop, {q: 2}, [m for m in mock_machines(loop) if m.machine_id != new.provider_instance_id]
    )


# --------------------------------------------------------------------------- h. busy and silent


@pytest.mark.timeout(150)
def test_chaos_a_busy_worker_that_cannot_answer_is_not_destroyed(pg_url, make_loop):
    """A solo-pool Celery worker (common on GPUs) runs its task on the thread that answers
    remote control: while a job runs it is silent, not dead. Its machine must not be destroyed
    under the job (ARCHITECTURE.md: "no reply does not prove it dead")."""
    loop = make_loop(pg_url)
    watched = Watched(loop, "chaos-solo")
    q = watched.queue
    command = local_command(q).replace("--pool prefork -c 1", "--pool solo")
    config = mock_config(
        {
            q: mock_queue(
                watched,
                max_workers=1,
                scale_down=[{"trigger": "idle", "timeout": 60}],
                provider="desk",
            )
        },
        heartbeat_timeout=6,
    )
    config["providers"]["desk"] = {"kind": "local", "command": command}
    loop.setup(config)
    loop.worker("w1", concurrency=3)
    loop.beat()
    watched.publish(1, seconds=0.2, prefix="warmup")
    loop.wait(lambda: loop.rows_in(q, "ready"), 45, "the solo worker ready")
    loop.wait(lambda: any(e["phase"] == "end" for e in watched.runs()), 20, "the warm-up job")
    watched.publish(1, seconds=20, prefix="long")

    loop.wait(
        lambda: (
            any(e["job"] == "long-0" and e["phase"] == "end" for e in watched.runs())
            or any(r["state"] == "terminated" for r in loop.instances(q))
        ),
        40,
        "the long job to end (or its machine to be destroyed)",
    )
    time.sleep(1)
    runs = watched.runs()
    rows = loop.instances(q)
    gone = [
        (r["state"].value, f"{r['terminating_at']:%H:%M:%S}", r["state_reason"])
        for r in rows
        if r["state"] in ("terminating", "terminated")
    ]
    long_job = [
        (e["phase"], f"{datetime.fromtimestamp(e['at'], UTC):%H:%M:%S}")
        for e in runs
        if e["job"] == "long-0"
    ]
    assert not gone and [p for p, _ in long_job] == ["start", "end"], (
        f"the machine running job long-0 was destroyed for silence: {gone}; "
        f"job long-0: {long_job}\n{loop.dump()}"
    )
    check_invariants(loop, {q: 1}, local_machines(loop, "desk"))


# --------------------------------------------------------------------------- i. retries audited


@pytest.mark.timeout(90)
def test_chaos_a_re_enqueued_intent_is_audited(pg_url, make_loop):
    """Reconcile re-sends the launch of an intent nobody claimed (INTENT_STALE): that action
    has a reason ("intent unclaimed for 31s") and belongs in the audit trail like any other."""
    loop = make_loop(pg_url)
    watched = Watched(loop, "chaos-audit")
    q = watched.queue
    loop.setup(mock_config({q: mock_queue(watched, max_workers=1, scale_down=[])}))
    launch_id = "lostenqueue" + datetime.now(UTC).strftime("%H%M%S%f")
    with transaction(loop.sessions) as session:
        then = datetime.now(UTC) - timedelta(seconds=31)  # a tick 31 s ago whose task was lost
        intents.add_intents(session, [(launch_id, q, "sandbox", "test: an intent")], then)
        events.record(
            session,
            [events.event("scale_up", "launch", "test: an intent", queue=q, launch_id=launch_id)],
            then,
        )
    loop.worker("w1", concurrency=3)  # no beat: one reconcile, by hand
    assert loop.result(loop.celery_call("autoscaler.reconcile", []))["retries"] == 1
    loop.wait(lambda: loop.rows_in(q, "booting"), 20, "the re-sent launch done")
    said = [e for e in loop.events(q) if e["launch_id"] == launch_id]
    assert any(e["kind"] == "reconcile" and "unclaimed" in e["reason"] for e in said), (
        "reconcile re-sent the launch without an audit event: "
        f"{[(e['kind'], e['action'], e['reason']) for e in said]}"
    )
