"""chaos: the state store drops every connection, again and again, while the loop works.

What a PostgreSQL restart looks like from our side (every connection killed mid-statement),
done with `pg_terminate_backend` on the test's own database so nothing else is disturbed.
Ticks, launches and reconciles fail part-way at random; afterwards a few clean rounds must
finish what was started: no duplicate machine, nothing leaked, never above max_workers.
"""

from __future__ import annotations

import threading
import time
import uuid
from datetime import timedelta

import psycopg
import redis
from sqlalchemy import select
from sqlalchemy.exc import DBAPIError

from autoscaler.config import load_config_text
from autoscaler.control import reconciler
from autoscaler.control.runtime import Runtime, utc_now
from autoscaler.control.steps import drain, launch, terminate
from autoscaler.control.steps.frame import run_step
from autoscaler.control.tick.evaluate import evaluate
from autoscaler.lifecycle import LIVE_STATES
from autoscaler.settings import Settings
from autoscaler.store import config_versions, migrate
from autoscaler.store.models import Instance, MockMachine
from tests.conftest import PG_ADMIN_DSN, REDIS_URL
from tests.control.outbox import RecordingOutbox

CONFIG = """
poll_interval: 1s
providers:
  sandbox: {{kind: mock, boot_delay: 0s, price_per_hour: 0.1}}
queues:
  jobs:
    metrics: {{source: celery, url: "{redis}/12", queue: "{queue}"}}
    autoscale:
      provider: sandbox
      max_workers: 3
      scale_up: [{{trigger: no_workers}}, {{trigger: queue_depth, target_per_worker: 1}}]
      scale_down: [{{trigger: idle, timeout: 1s}}]
      instance: {{gpu: "RTX 4090", max_price_per_hour: 0.5}}
"""


def _killer(dbname: str, stop: threading.Event) -> None:
    with psycopg.connect(PG_ADMIN_DSN, autocommit=True) as conn:
        while not stop.is_set():
            conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE datname = %s AND pid <> pg_backend_pid()",
                (dbname,),
            )
            time.sleep(0.03)


def _round(rt: Runtime, now_shift: float = 0.0) -> int:
    """One pass of everything the loop does; returns how many steps failed on the store."""
    failures = 0
    outbox = RecordingOutbox()
    steps = {"launch": launch.STEP, "drain": drain.STEP, "terminate": terminate.STEP}
    later = utc_now() + timedelta(seconds=now_shift)
    for call in (
        lambda: evaluate(rt, outbox, trigger="chaos", now=later),
        lambda: reconciler.run_reconcile(rt, outbox, later),
    ):
        try:
            call()
        except DBAPIError:
            failures += 1
        for step, launch_id in list(outbox.sent):
            outbox.sent.remove((step, launch_id))
            try:
                run_step(steps[step], rt, str(launch_id))
            except DBAPIError:
                failures += 1
    return failures


def test_chaos_store_connections_killed_mid_tick_leave_state_a_restart_finishes(pg_url, tmp_path):
    migrate.upgrade(pg_url)
    queue = f"chaos-{uuid.uuid4().hex[:8]}"
    watched = redis.Redis.from_url(f"{REDIS_URL}/12")
    watched.lpush(queue, *[f'{{"headers": {{"id": "j{i}"}}}}' for i in range(5)])
    settings = Settings.from_env(
        {"AUTOSCALER_HOME": str(tmp_path), "AUTOSCALER_DATABASE_URL": pg_url}
    )
    rt = Runtime(settings, env={})
    try:
        config = load_config_text(CONFIG.format(redis=REDIS_URL, queue=queue))
        with rt.transaction() as session:
            config_versions.record(session, config.model_dump(mode="json"), "test", utc_now())

        stop = threading.Event()
        killer = threading.Thread(target=_killer, args=(pg_url.rsplit("/", 1)[1], stop))
        killer.start()
        failures = 0
        try:
            deadline = time.monotonic() + 6
            while time.monotonic() < deadline:
                failures += _round(rt)
        finally:
            stop.set()
            killer.join()
        assert failures > 0, "the killer never hit the loop: the test proves nothing"

        # The store is back: a few clean rounds (time moved on past every grace) finish it.
        for shift in (0, 60, 200, 400, 400):
            assert _round(rt, shift) == 0
        with rt.transaction() as session:
            rows = session.scalars(select(Instance)).all()
            live = [r for r in rows if r.state in LIVE_STATES]
            machines = session.scalars(
                select(MockMachine).where(MockMachine.destroyed_at.is_(None))
            ).all()
        assert 1 <= len(live) <= 3, [(r.launch_id, r.state) for r in rows]
        ids = [r.provider_instance_id for r in live]
        assert None not in ids and len(set(ids)) == len(ids), "a machine owned twice"
        # every machine still up at the provider belongs to a live row: nothing leaked
        assert sorted(f"mock-{m.id}" for m in machines) == sorted(ids)
        assert all(r.state.value in ("ready", "booting") for r in live)

        # the queue empties: everything is released, nothing left at the provider
        watched.delete(queue)
        deadline = time.monotonic() + 20
        while True:
            time.sleep(0.5)
            # the clock stays where the clean rounds moved it (rows carry those times)
            assert _round(rt, 400) == 0
            with rt.transaction() as session:
                left = session.scalars(
                    select(Instance).where(Instance.state.in_(LIVE_STATES))
                ).all()
                up = session.scalars(
                    select(MockMachine).where(MockMachine.destroyed_at.is_(None))
                ).all()
            if not (left or up) or time.monotonic() > deadline:
                break
        assert left == [] and up == []
    finally:
        watched.delete(queue)
        rt.close()
