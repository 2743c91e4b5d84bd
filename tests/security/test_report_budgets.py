"""A machine's reports fill only its own bounded share of the store (#33, "Reports that flood
the store"), on PostgreSQL through the real app (TestClient: the budget is the store's, not the
transport's); the budget itself (`policy.reports`) tried by hypothesis.

The issue's probe: one machine wrote 400,000 finished jobs in 20 s (its queue's mean runtime
and `trace export` became its word) and 2,051 `crashed` events in 8 s. Now each reporter has a
budget, refilled by what it could have done (1 + its running jobs a second, banked up to one
heartbeat's 1,000, 50,000 a day; 30 events an hour), the rest dropped and said once.
"""

from __future__ import annotations

import re
import threading
import time
from datetime import UTC, datetime, timedelta

import psycopg
from hypothesis import given, settings
from hypothesis import strategies as st
from sqlalchemy import func, select

from autoscaler.policy import reports
from autoscaler.store.db import transaction
from autoscaler.store.models import JobRecord, ScaleEvent
from tests.api.apikit import make_world

T0 = datetime(2026, 12, 5, 12, tzinfo=UTC)


def jobs(prefix: str, n: int, runtime: float = 2.0) -> list[dict[str, object]]:
    start = time.time() - 60
    return [
        {"id": f"{prefix}-{i}", "started_at": start, "finished_at": start + runtime}
        for i in range(n)
    ]


def beat(world, launch: str, **body: object) -> None:
    r = world.client.post(
        f"/v1/worker/{launch}/heartbeat",
        json={"state": "busy", "running_tasks": 1, **body},
        headers=world.h(world.tokens[launch]),
    )
    assert r.status_code == 200, r.text


def rows_of(world, reporter: str) -> int:
    with transaction(world.rt.sessions) as s:
        return int(s.scalar(select(func.count()).where(JobRecord.reporter == reporter)) or 0)


def events_of(world, launch: str, action: str) -> list[ScaleEvent]:
    with transaction(world.rt.sessions) as s:
        found = s.scalars(
            select(ScaleEvent).where(ScaleEvent.launch_id == launch, ScaleEvent.action == action)
        ).all()
        s.expunge_all()
        return list(found)


def test_a_flood_of_finished_jobs_keeps_to_the_machines_budget(pg_url, tmp_path):
    world = make_world(pg_url, tmp_path)
    try:
        for k in range(20):  # 20,000 finished jobs claimed in a few seconds
            beat(world, "m1", jobs=jobs(f"flood{k}", 1000, runtime=0.0))
        beat(world, "m2", jobs=jobs("honest", 5))
        kept = rows_of(world, "m1")
        # one heartbeat's burst, and what 2 slots refill in the seconds the flood took
        assert 1000 <= kept < 1200, kept
        assert rows_of(world, "m2") == 5
        # said once, at the first drop (the second heartbeat's 1,000 less its refill); the
        # rest counted towards the next word, TELL_EVERY later
        told = events_of(world, "m1", "reports_dropped")
        assert len(told) == 1, [e.reason for e in told]
        said = re.search(r"dropped (\d+) finished jobs", told[0].reason)
        assert said is not None and 900 < int(said[1]) <= 1000, told[0].reason
        assert not events_of(world, "m2", "reports_dropped")
    finally:
        world.close()


def test_a_flood_of_registrations_and_crashes_writes_at_most_the_event_budget(pg_url, tmp_path):
    world = make_world(pg_url, tmp_path)
    try:
        for i in range(100):
            r = world.client.post(
                "/v1/worker/m1/register",
                json={"worker_name": f"w{i}"},
                headers=world.h(world.tokens["m1"]),
            )
            assert r.status_code == 200, r.text
        registered = events_of(world, "m1", "register")
        assert len(registered) == reports.EVENT_BURST
        (told,) = events_of(world, "m1", "reports_dropped")
        assert "dropped 1 events past 30 an hour" in told.reason, told.reason
        # another machine's events are its own budget's: untouched
        r = world.client.post(
            "/v1/worker/m2/register",
            json={"worker_name": "honest"},
            headers=world.h(world.tokens["m2"]),
        )
        assert r.status_code == 200
        assert len(events_of(world, "m2", "register")) == 1
    finally:
        world.close()


def test_naming_another_machines_job_never_stands_in_for_its_row(pg_url, tmp_path):
    """m1 reports m2's job first, as taking no time; m2's own report of it is still kept, as
    m2's, with m2's runtime."""
    world = make_world(pg_url, tmp_path)
    try:
        beat(world, "m1", jobs=jobs("shared", 1, runtime=0.0))
        beat(world, "m2", jobs=jobs("shared", 1, runtime=30.0))
        with transaction(world.rt.sessions) as s:
            got = dict(
                s.execute(
                    select(JobRecord.reporter, JobRecord.runtime_s).where(
                        JobRecord.task_id == "shared-0"
                    )
                ).all()
            )
        assert got == {"m1": 0.0, "m2": 30.0}
        beat(world, "m2", jobs=jobs("shared", 1, runtime=30.0))  # a retried heartbeat: one row
        assert rows_of(world, "m2") == 1
    finally:
        world.close()


def test_a_heartbeats_job_rows_never_hold_its_instance_row(pg_url, tmp_path):
    """A heartbeat whose job rows wait (here on another transaction's uncommitted row of the same
    job) holds no lock on its machine's instance row meanwhile: reconcile and the tick can
    move the machine. The row's UPDATE came first, and held it for the whole write, before."""
    world = make_world(pg_url, tmp_path)
    dsn = pg_url.replace("+psycopg", "")
    blocker = psycopg.connect(dsn)
    other = psycopg.connect(dsn)
    try:
        report = jobs("slow", 1)
        started = datetime.fromtimestamp(float(report[0]["started_at"]), UTC)  # type: ignore[arg-type]
        blocker.execute(
            "INSERT INTO job_records (queue, task_id, worker, reporter, started_at, finished_at,"
            " runtime_s) VALUES ('q1', 'slow-0', 'x', 'm1', %s, %s, 2)",
            (started, started + timedelta(seconds=2)),
        )
        done = threading.Event()
        thread = threading.Thread(target=lambda: (beat(world, "m1", jobs=report), done.set()))
        thread.start()
        try:
            waiting = False
            for _ in range(200):  # until the heartbeat waits on the blocker's row
                n = other.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                    " AND datname = current_database()"
                ).fetchone()
                other.rollback()
                if n and n[0] > 0:
                    waiting = True
                    break
                time.sleep(0.05)
            assert waiting and not done.is_set()
            other.execute("SET lock_timeout = '3s'")
            other.execute("UPDATE instances SET state_reason = 'moved' WHERE launch_id = 'm1'")
            other.commit()
        finally:
            blocker.rollback()
            thread.join(30)
        assert done.is_set()
        assert rows_of(world, "m1") == 1
    finally:
        blocker.close()
        other.close()
        world.close()


STEPS = st.lists(
    st.tuples(
        st.floats(min_value=0, max_value=7200, allow_nan=False),  # seconds since the last
        st.integers(min_value=0, max_value=5000),  # jobs claimed
        st.integers(min_value=-5, max_value=100_000),  # running claimed
        st.integers(min_value=0, max_value=50),  # events wanted
    ),
    max_size=60,
)


@settings(max_examples=300, deadline=None)
@given(STEPS)
def test_no_sequence_of_reports_writes_more_than_the_machine_could_have_done(steps):
    budget = None
    now = T0
    granted_jobs = granted_events = wanted_jobs = wanted_events = told_jobs = told_events = 0
    bound = float(reports.JOB_BURST)
    event_bound = float(reports.EVENT_BURST)
    per_day: dict[str, int] = {}
    for dt, n, running, events in steps:
        now += timedelta(seconds=dt)
        span = min(dt, reports.BANK_AT_MOST.total_seconds())
        bound += span * (1 + min(max(running, 0), reports.MAX_RUNNING))
        event_bound += span * reports.EVENTS_PER_HOUR / 3600
        g, budget = reports.grant(budget, reports.Want(jobs=n, events=events, running=running), now)
        assert 0 <= g.jobs <= n and 0 <= g.events <= events
        granted_jobs += g.jobs
        granted_events += g.events
        wanted_jobs += n
        wanted_events += events
        day = now.date().isoformat()
        per_day[day] = per_day.get(day, 0) + g.jobs
        assert per_day[day] <= reports.JOBS_PER_DAY
        assert granted_jobs <= bound + 1e-6
        assert granted_events <= event_bound + 1e-6
        if g.tell is not None:
            told_jobs += _count(g.tell, "finished jobs")
            told_events += _count(g.tell, "events past")
    # nothing dropped goes unsaid: what was told plus what waits to be told is what was dropped
    assert budget is None or (
        told_jobs + budget.dropped_jobs == wanted_jobs - granted_jobs
        and told_events + budget.dropped_events == wanted_events - granted_events
    )


def _count(tell: str, what: str) -> int:
    said = re.search(rf"(\d+) {what}", tell)
    return int(said[1]) if said else 0
