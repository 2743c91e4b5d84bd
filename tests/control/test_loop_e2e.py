"""The control loop end to end: real `celery -A autoscaler worker` and `beat` processes, a real
watched Redis queue, real machines (the local provider's processes running a Celery worker of
`tests/control/e2eapp`) or the mock provider's, driven only through the operator's interface
(`autoscaler db upgrade`, `autoscaler apply`, `celery call`).

Short intervals everywhere (poll 2 s, idle timeouts of a few seconds) so each test ends within
about a minute and a half; every process started is stopped in the fixture's teardown, failure
or not.
"""

from __future__ import annotations

import copy
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from celery import Celery

from tests.control.loopchecks import check_invariants, first_event, local_machines, mock_machines
from tests.control.loopkit import Loop
from tests.control.loopprocs import CONTROL_BROKER
from tests.control.loopworld import Watched, local_command, mock_config, mock_queue


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


def states(loop: Loop, queue: str) -> list[str]:
    return [r["state"] for r in loop.instances(queue)]


def by_action(events: list[dict[str, Any]], kind: str, action: str) -> list[dict[str, Any]]:
    return [e for e in events if e["kind"] == kind and e["action"] == action]


# --------------------------------------------------------------------------- a. local provider


@pytest.mark.timeout(180)
def test_e2e_local_provider_runs_every_job_once_and_releases_its_machines(pg_url, make_loop):
    loop = make_loop(pg_url)
    watched = Watched(loop, "e2e-local")
    jobs = 6
    config = {
        "poll_interval": 2,
        "boot_timeout": 30,
        "heartbeat_timeout": 60,
        "providers": {"desk": {"kind": "local", "command": local_command(watched.queue)}},
        "queues": {
            watched.queue: {
                "metrics": watched.metrics,
                "autoscale": {
                    "provider": "desk",
                    "max_workers": 2,
                    "scale_up": [
                        {"trigger": "no_workers"},
                        {"trigger": "queue_depth", "target_per_worker": 2},
                    ],
                    "scale_down": [{"trigger": "idle", "timeout": "3s"}],
                    "instance": {"gpu": "RTX 4090", "max_price_per_hour": 1.0},
                },
            }
        },
    }
    loop.setup(config)
    loop.worker("w1", concurrency=3)
    loop.beat()
    published = time.time()
    ids = watched.publish(jobs, seconds=1.0)

    q = watched.queue
    loop.wait(lambda: len(loop.instances(q)) >= 1, 20, "a launch")
    loop.wait(lambda: any(r["state"] == "ready" for r in loop.instances(q)), 45, "a ready worker")
    loop.wait(
        lambda: sum(1 for e in watched.runs() if e["phase"] == "end") >= jobs, 60, "every job done"
    )
    loop.wait(
        lambda: loop.instances(q) and all(r["state"] == "terminated" for r in loop.instances(q)),
        60,
        "every machine drained and terminated",
    )
    done = time.time()

    rows = loop.instances(q)
    events = loop.events(q)
    runs = watched.runs()
    starts = Counter(e["job"] for e in runs if e["phase"] == "start")
    ends = Counter(e["job"] for e in runs if e["phase"] == "end")
    assert starts == Counter(ids) == ends, (starts, ends, loop.dump())
    # every job ran on one of our machines, named after its label
    labels = {f"asg-{loop.installation_id}-{r['launch_id']}": r for r in rows}
    for e in runs:
        label = e["worker"].rsplit("@", 1)[0]
        assert label in labels, (e, list(labels))
        row = labels[label]
        # no job outlived its machine's drain: the machine was destroyed idle
        assert e["at"] <= row["terminating_at"].timestamp() + 0.5, (e, row)
    assert 1 <= len(rows) <= 2
    assert all(r["ready_at"] is not None and r["drained_at"] is not None for r in rows)
    for r in rows:
        launch = first_event(events, "scale_up", "launch", r["launch_id"])
        assert launch is not None and launch["reason"]
        assert first_event(events, "scale_down", "drain", r["launch_id"]) is not None
        assert first_event(events, "drain", "drained", r["launch_id"]) is not None
        assert first_event(events, "terminate", "destroyed", r["launch_id"]) is not None
    # the launch followed the jobs within seconds (fast path), not a poll later
    first = min(r["created_at"] for r in rows).timestamp()
    assert first - published < 5, first - published
    # nothing left: no state file, no process carrying one of our labels
    loop.wait(lambda: not local_machines(loop, "desk"), 15, "no local machine left")
    check_invariants(loop, {q: 2}, local_machines(loop, "desk"))
    print(f"local e2e: {len(rows)} machine(s), {jobs} jobs, {done - published:.1f}s to released")


# --------------------------------------------------------------------------- b. embedded


@pytest.mark.timeout(150)
def test_e2e_embedded_defaults_mock_provider_from_jobs_to_terminated(make_loop):
    # No PostgreSQL, no Redis for the control plane: AUTOSCALER_HOME only.
    loop = make_loop(None, broker_url=None, result_backend=None)
    watched = Watched(loop, "e2e-embedded")
    q = watched.queue
    loop.setup(
        mock_config(
            {
                q: mock_queue(
                    watched, max_workers=2, scale_down=[{"trigger": "idle", "timeout": "4s"}]
                )
            }
        )
    )
    assert (loop.home / "state.db").is_file() and (loop.home / "broker.db").is_file()
    loop.worker("w1", concurrency=2)
    loop.beat()
    watched.publish(3, seconds=1.0)

    loop.wait(lambda: loop.instances(q), 20, "a launch")
    ready = loop.wait(lambda: loop.rows_in(q, "ready"), 30, "the mock machine ready")
    emptied = datetime.now(UTC)
    watched.empty()
    loop.wait(lambda: states(loop, q) == ["terminated"], 40, "drained and terminated")

    rows = loop.instances(q)
    assert len(rows) == 1, "one machine for the load, no second launch"
    row = rows[0]
    assert row["launch_id"] == ready[0]["launch_id"]
    assert row["draining_at"] >= emptied, "drained only once the queue was empty"
    events = loop.events(q)
    launch = first_event(events, "scale_up", "launch", row["launch_id"])
    assert launch is not None and launch["reason"].startswith("no_workers"), launch
    assert first_event(events, "terminate", "destroyed", row["launch_id"]) is not None
    assert not mock_machines(loop)
    check_invariants(loop, {q: 2}, mock_machines(loop))


# --------------------------------------------------------------------------- c. schedule


def _seconds_into_minute() -> float:
    now = datetime.now(UTC)
    return now.second + now.microsecond / 1e6


@pytest.mark.timeout(180)
def test_e2e_schedule_prewarms_on_the_minute_and_drains_after_the_window(pg_url, make_loop):
    loop = make_loop(pg_url)
    watched = Watched(loop, "e2e-cron")
    q = watched.queue
    window = 20
    config = mock_config(
        {
            q: mock_queue(
                watched,
                max_workers=1,
                scale_up=[
                    {"trigger": "schedule", "cron": "* * * * *", "workers": 1, "duration": window}
                ],
                scale_down=[{"trigger": "idle", "timeout": "3s"}],
            )
        }
    )
    # Processes first, with the queue's autoscaling off, so their start overlaps the wait.
    disabled = copy.deepcopy(config)
    disabled["queues"][q]["autoscale"]["enabled"] = False
    loop.setup(disabled)
    loop.worker("w1", concurrency=3)
    loop.beat("beat")
    # Apply when no window is open (seconds 20-50) and the next firing is ≥10 s away, so the
    # machine can only come from the next minute's firing, and beat has reloaded by then.
    loop.wait(lambda: 21 <= _seconds_into_minute() <= 50, 65, "a moment between windows", 0.1)
    applied = datetime.now(UTC)
    loop.apply(config)
    boundary = applied.replace(second=0, microsecond=0).timestamp() + 60

    loop.wait(lambda: loop.instances(q), 75, "the scheduled launch")
    rows = loop.instances(q)
    launch = first_event(loop.events(q), "scale_up", "launch", rows[0]["launch_id"])
    assert launch is not None
    delay = launch["at"].timestamp() - boundary
    assert 0 <= delay < 5, f"launched {delay:.1f}s after the minute ({launch['reason']})"
    assert "schedule" in launch["reason"], launch["reason"]
    beat = next(p for p in loop.procs if p.name == "beat")
    assert f"Sending due task schedule:{q}:up0" in beat.text(), "the cron entry fired"
    loop.wait(lambda: loop.rows_in(q, "ready"), 20, "the pre-warmed machine ready")
    loop.wait(
        lambda: any(r["state"] == "terminated" for r in loop.instances(q)),
        boundary + window + 20 - time.time(),
        "the pre-warmed machine drained after the window",
    )
    rows = loop.instances(q)
    first = rows[0]
    assert first["draining_at"].timestamp() >= boundary + window, (
        "drained while the window was open"
    )
    drain = first_event(loop.events(q), "scale_down", "drain", first["launch_id"])
    assert drain is not None and drain["reason"].startswith("idle"), drain
    check_invariants(loop, {q: 1}, mock_machines(loop))


# --------------------------------------------------------------------------- d. manual


class ReceivedTasks(threading.Thread):
    """What Flower shows of each task: the workers' `task-received` events, captured live."""

    def __init__(self, prefix: str) -> None:
        super().__init__(daemon=True)
        self.app = Celery("loop-events", broker=CONTROL_BROKER, set_as_current=False)
        self.app.conf.broker_transport_options = {"global_keyprefix": prefix}
        self.seen: dict[str, dict[str, Any]] = {}
        self.ready = threading.Event()
        self.receiver: Any = None

    def run(self) -> None:
        with self.app.connection_for_read() as conn:
            self.receiver = self.app.events.Receiver(conn, handlers={"task-received": self._got})
            self.ready.set()
            self.receiver.capture(limit=None, timeout=None, wakeup=False)

    def _got(self, event: dict[str, Any]) -> None:
        self.seen[event["uuid"]] = event

    def close(self) -> None:
        if self.receiver is not None:
            self.receiver.should_stop = True
        self.join(5)
        self.app.close()


@pytest.mark.timeout(150)
def test_e2e_manual_scale_by_celery_call_up_to_two_then_down_to_zero(pg_url, make_loop):
    loop = make_loop(pg_url)
    watched = Watched(loop, "e2e-manual")
    q = watched.queue
    loop.setup(mock_config({q: mock_queue(watched, max_workers=3, scale_down=[])}))
    loop.worker("w1", concurrency=3, events=True)  # task events: what Flower shows
    loop.beat()

    flower = ReceivedTasks(loop.control_prefix)
    flower.start()
    assert flower.ready.wait(10)
    time.sleep(1.0)  # the receiver's queue is bound before the first call
    try:
        up = loop.celery_call("autoscaler.scale", [q, 2])
        answer = loop.result(up, timeout=30)
        assert "celery call pinned" in answer and f"{q} at 2" in answer, answer
        loop.wait(lambda: len(loop.rows_in(q, "ready")) == 2, 30, "two mock machines ready")
        assert watched.pending() == 0, "no job was needed"
        down = loop.celery_call("autoscaler.scale", [q, 0])
        assert "at 0" in loop.result(down, timeout=30)
        loop.wait(
            lambda: states(loop, q) == ["terminated", "terminated"], 40, "both drained and gone"
        )
        loop.wait(lambda: up in flower.seen and down in flower.seen, 10, "task-received events")
    finally:
        flower.close()

    # What Flower shows of these tasks: the queue and the number, nothing else.
    received = flower.seen
    assert received[up]["name"] == "autoscaler.scale"
    assert received[up]["args"] == repr([q, 2]) and received[up]["kwargs"] == "{}"
    assert received[down]["args"] == repr([q, 0]) and received[down]["kwargs"] == "{}"

    events = loop.events(q)
    manual = by_action(events, "manual", "scale")
    assert [e["details"]["workers"] for e in manual] == [2, 0]
    assert all("celery call" in e["reason"] for e in manual)
    rows = loop.instances(q)
    for r in rows:
        launch = first_event(events, "scale_up", "launch", r["launch_id"])
        assert launch is not None and "set by celery call" in launch["reason"], launch
        drain = first_event(events, "scale_down", "drain", r["launch_id"])
        assert drain is not None and "manual target 0" in drain["reason"], drain
    assert len(by_action(events, "scale_up", "launch")) == 2
    check_invariants(loop, {q: 3}, mock_machines(loop))
