"""Queue metrics against real Celery deployments: real producers, real worker processes, real
Redis and RabbitMQ. Every number is checked against what the broker and the workers hold.

- running jobs come from the workers (early acks hide them from the broker), late acks too;
- in flight follows kombu's routing (direct exchanges with their own routing keys, topics);
- jobs scheduled for later (countdown) are counted apart, not as demand, with priorities and a
  custom separator; workers holding ETA jobs on RabbitMQ move them out of in flight;
- unstamped ages keep growing while a queue drains (Redis) and exist at all on RabbitMQ;
- the worker probe is built from the same `metrics:` block as the reader.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import amqp
import pytest
import redis
from celery import Celery

from autoscaler.brokers.rabbitmq.celery_rabbitmq import CeleryRabbitMQReader
from autoscaler.brokers.redis.celery_redis import CeleryRedisReader
from autoscaler.brokers.redis.keys import CeleryRedisLayout
from autoscaler.brokers.workers import CeleryWorkerProbe
from autoscaler.config.metrics_sources import CelerySource
from autoscaler.control.observe import observe_celery_workers
from autoscaler.control.runtime import Runtime, utc_now
from autoscaler.control.tick.read import read_metrics
from autoscaler.control.tick.snapshot import build_snapshot
from autoscaler.policy import triggers
from autoscaler.policy.decide import decide
from autoscaler.policy.plan import Plan
from autoscaler.policy.snapshot import Snapshot
from autoscaler.settings import Settings
from tests.brokers.deploykit import Deployment, clear_redis, runtime_with, wait_for
from tests.conftest import AMQP_URL, REDIS_URL

WATCHED = f"{REDIS_URL}/4"

CONFIG = """
poll_interval: 10s
providers:
  sandbox: {{kind: mock, boot_delay: 0s, price_per_hour: 0.1}}
queues:
  {queue}:
    metrics: {{source: celery, url: "{url}", global_keyprefix: "{prefix}"}}
    autoscale:
      provider: sandbox
      max_workers: 20
      scale_up: [{{trigger: no_workers}}, {{trigger: queue_depth, target_per_worker: 1}}]
      instance: {{gpu: "RTX 4090", max_price_per_hour: 0.5}}
"""


@pytest.fixture
def prefix() -> Iterator[str]:
    p = f"dep-{uuid.uuid4().hex[:10]}:"
    yield p
    clear_redis(WATCHED, p)


def worker_holds(app: Celery, node: str) -> tuple[int, int]:
    """(running, prefetched) jobs of one worker, as Celery's own remote control reports them."""
    insp = app.control.inspect(destination=[node], timeout=1.0)
    active = (insp.active() or {}).get(node)
    reserved = (insp.reserved() or {}).get(node)
    assert isinstance(active, list) and isinstance(reserved, list), (active, reserved)
    return len(active), len(reserved)


def look(rt: Runtime, now: datetime | None = None) -> tuple[Snapshot, Plan]:
    """What one reconcile and one tick see: the worker-status port, every source, the snapshot
    the decision reads, and the plan."""
    now = now or utc_now()
    with rt.transaction() as session:
        loaded = rt.load(session)
    assert loaded is not None
    observe_celery_workers(rt, loaded, utc_now())
    metrics = read_metrics(rt, loaded, list(loaded.autoscaled))
    with rt.transaction() as session:
        snapshot = build_snapshot(session, rt, loaded, metrics, now)
    return snapshot, decide(snapshot, loaded.config, now)


# --------------------------------------------------------------------------- running jobs


@pytest.mark.parametrize("acks_late", [False, True], ids=["early-acks", "acks-late"])
def test_running_jobs_are_counted_from_the_workers_with_early_and_late_acks(
    prefix, tmp_path, acks_late
):
    """Two jobs running on a 2-process worker, then six more queued behind them: the load the
    triggers use is every unfinished job, whatever the acks mode. With Celery's default early
    acks the broker's unacked hash holds only the prefetched jobs (in flight 2 with 2 running
    and 4 waiting; 0/0 once the queue is drained while 2 still run)."""
    dep = Deployment(WATCHED, transport={"global_keyprefix": prefix})
    queue = f"gpu-{dep.run}"
    rt = runtime_with(CONFIG.format(queue=queue, url=WATCHED, prefix=prefix), tmp_path)
    broker = redis.Redis.from_url(WATCHED)
    try:
        with dep.worker(queue, concurrency=2, acks_late=acks_late) as node:
            app = dep.producer()

            def held() -> tuple[int, int, int, int]:
                """(waiting in the list, unacked, running, prefetched) as the broker and
                Celery's own inspect say."""
                return (
                    broker.llen(prefix + queue),
                    broker.hlen(prefix + "unacked"),
                    *worker_holds(app, node),
                )

            for sent in (2, 8):
                dep.send(app, sent - (0 if sent == 2 else 2), "hold", queue=queue)
                waiting = sent - 2 - (0 if acks_late else min(2, sent - 2))

                def settled(c: tuple[int, int, int, int], w: int = waiting) -> bool:
                    # early acks: a started job is acked, unacked = prefetched; late: all
                    return c[0] == w and c[2] == 2 and c[1] == c[3] + (c[2] if acks_late else 0)

                counts = wait_for(held, settled)
                llen, unacked, running, reserved = counts
                assert (llen, running) == (waiting, 2), counts

                snapshot, plan = look(rt)
                assert held() == counts  # nothing moved while the control plane looked
                qs = snapshot.queue(queue)
                assert qs is not None and qs.metrics is not None
                m = qs.metrics
                # target 1 per worker, one (hand-made) worker serving: every job not finished
                # needs a worker, so the rest are rented
                assert qs.manual_workers == 1
                assert len(plan.launches) == sent - 1, plan.describe()
                view = triggers.make_view(m, qs.machines, qs.manual_workers)
                assert view.load == sent
                # the broker's numbers, as a person counts them on the broker
                assert m.pending == llen
                assert m.in_flight == unacked
                if not acks_late:  # early acks: a running job is acked, so unacked = prefetched
                    assert m.in_flight == reserved
                # running and prefetched jobs, as the worker itself reports them
                assert (m.running, m.reserved) == (running, reserved)
    finally:
        broker.close()
        dep.close()
        rt.close()


# --------------------------------------------------------------------------- routing keys


def test_in_flight_follows_kombu_routing_for_custom_routing_keys_and_topics(prefix):
    """task_queues whose routing keys differ from the queue names: a direct exchange with its own
    key and a topic exchange. Each worker runs one job and holds one prefetched (unacked)."""
    dep = Deployment(
        WATCHED,
        transport={"global_keyprefix": prefix},
        queues=[
            ("gpu-work", "jobsx", "direct", "work.gpu"),
            ("gpu-topic", "tasks", "topic", "gpu.#"),
        ],
    )
    broker = redis.Redis.from_url(WATCHED)
    try:
        with (
            dep.worker("gpu-work", concurrency=1) as a,
            dep.worker("gpu-topic", concurrency=1) as b,
        ):
            app = dep.producer()
            dep.send(app, 3, "hold", exchange="jobsx", routing_key="work.gpu")
            dep.send(app, 3, "hold", queue="gpu-topic", routing_key="gpu.fast")
            depth = wait_for(
                lambda: (
                    broker.llen(prefix + "gpu-work"),
                    broker.llen(prefix + "gpu-topic"),
                    broker.hlen(prefix + "unacked"),
                ),
                lambda d: d == (1, 1, 2),
            )
            assert depth == (1, 1, 2)
            reader = CeleryRedisReader(WATCHED, layout=CeleryRedisLayout(global_keyprefix=prefix))
            got = reader.read(["gpu-work", "gpu-topic"])
            reader.close()
            for queue, node in (("gpu-work", a), ("gpu-topic", b)):
                assert worker_holds(app, node) == (1, 1)  # one running, one prefetched
                assert got[queue].pending == 1
                assert got[queue].in_flight == 1, got[queue]
            # and the worker-status port attributes each worker's jobs to its queue
            probe = CeleryWorkerProbe(WATCHED, transport_options={"global_keyprefix": prefix})
            try:
                status = probe.status()
            finally:
                probe.close()
            for queue, node in (("gpu-work", a), ("gpu-topic", b)):
                load = (status[node].loads or {})[queue]
                assert (load.running, load.reserved) == (1, 1)
    finally:
        broker.close()
        dep.close()


# --------------------------------------------------------------------------- scheduled jobs


def test_countdown_jobs_are_scheduled_not_demand_with_priorities_and_a_custom_separator(
    prefix, tmp_path
):
    """No worker, a custom separator and priority steps: jobs due in 10 minutes are counted
    apart (not pending), so no_workers rents nothing for them now - and pre-warms a machine one
    boot time before they fall due. A due job among them is pending as usual."""
    transport = {"global_keyprefix": prefix, "sep": ":p:", "priority_steps": [0, 2, 5]}
    dep = Deployment(WATCHED, transport=transport)
    queue = f"gpu-{dep.run}"
    config = CONFIG.format(queue=queue, url=WATCHED, prefix=prefix).replace(
        'global_keyprefix: "', 'sep: ":p:", priority_steps: [0, 2, 5], global_keyprefix: "'
    )
    rt = runtime_with(config, tmp_path)
    broker = redis.Redis.from_url(WATCHED)
    try:
        app = dep.producer()
        sent_at = datetime.now(UTC)
        for pri in (0, 2, 5, 5):
            app.send_task("t.hold", args=["x"], queue=queue, priority=pri, countdown=600)
        lists = {k.decode(): broker.llen(k) for k in broker.keys(f"{prefix}{queue}*")}
        assert sum(lists.values()) == 4 and len(lists) == 3  # three priority lists

        snapshot, plan = look(rt)
        m = snapshot.queue(queue).metrics
        assert plan.launches == (), "no machine for jobs due in 10 minutes"
        assert (m.pending, m.in_flight) == (0, 0)
        assert m.oldest_pending_age is None
        assert m.scheduled == 4
        assert m.next_due_at is not None
        assert abs(m.next_due_at - (sent_at.timestamp() + 600)) < 5
        # one boot time (300 s by default, none booted yet) before they fall due: pre-warm
        _, early = look(rt, now=sent_at + timedelta(seconds=600 - 300 - 30))
        assert early.launches == ()
        _, warm = look(rt, now=sent_at + timedelta(seconds=600 - 300 + 5))
        assert [a.trigger for a in warm.launches] == ["no_workers"]

        app.send_task("t.hold", args=["x"], queue=queue, priority=2)  # due now
        snapshot, plan = look(rt)
        m = snapshot.queue(queue).metrics
        assert (m.pending, m.scheduled) == (1, 4)
        assert [a.trigger for a in plan.launches] == ["no_workers"]
    finally:
        broker.close()
        dep.close()
        rt.close()


def test_eta_jobs_held_by_a_redis_worker_are_scheduled_not_in_flight(prefix):
    """A worker fetches countdown jobs at once and holds them (unacked) until due: they are
    scheduled, not in flight, and not counted as waiting."""
    dep = Deployment(WATCHED, transport={"global_keyprefix": prefix})
    queue = f"gpu-{dep.run}"
    broker = redis.Redis.from_url(WATCHED)
    try:
        with dep.worker(queue, concurrency=1):
            app = dep.producer()
            for _ in range(3):
                app.send_task("t.hold", args=["x"], queue=queue, countdown=900)
            held = wait_for(
                lambda: (broker.llen(prefix + queue), broker.hlen(prefix + "unacked")),
                lambda d: d == (0, 3),
            )
            assert held == (0, 3)
            reader = CeleryRedisReader(WATCHED, layout=CeleryRedisLayout(global_keyprefix=prefix))
            m = reader.read([queue])[queue]
            reader.close()
            assert (m.pending, m.in_flight) == (0, 0)
            assert (m.scheduled, m.scheduled_held) == (3, 3)
    finally:
        broker.close()
        dep.close()


def test_a_drained_worker_holding_a_countdown_job_is_busy_not_idle(prefix):
    """The drain's idle check counts jobs a worker holds for later (ETA / countdown): Celery
    lists them under `scheduled`, not `active` or `reserved`, and a warm shutdown of the worker
    would leave them for a machine that is about to be destroyed."""
    dep = Deployment(WATCHED, transport={"global_keyprefix": prefix})
    queue = f"gpu-{dep.run}"
    broker = redis.Redis.from_url(WATCHED)
    try:
        with dep.worker(queue, concurrency=1) as node:
            app = dep.producer()
            app.send_task("t.hold", args=["x"], queue=queue, countdown=900)
            wait_for(lambda: broker.hlen(prefix + "unacked"), lambda n: n == 1)
            probe = CeleryWorkerProbe(WATCHED, transport_options=dep.transport, timeout=1.0)
            try:
                probe.cancel_consumer(node, queue)
                state = wait_for(
                    lambda: probe.worker_state(node), lambda s: s is not None and queue not in s[0]
                )
            finally:
                probe.close()
            assert state is not None
            assert state[1] == 1
    finally:
        broker.close()
        dep.close()


def _rabbit_queue() -> str:
    return f"dep-{uuid.uuid4().hex[:10]}"


def _delete_queues(*names: str) -> None:
    conn = amqp.Connection("127.0.0.1:5672", userid="guest", password="guest")
    conn.connect()
    try:
        for name in names:
            conn.channel().queue_delete(name)
    finally:
        conn.close()


def test_eta_jobs_held_by_a_rabbitmq_worker_move_from_in_flight_to_scheduled(tmp_path):
    """RabbitMQ counts ETA jobs a worker holds as unacknowledged; the worker's own report says
    they are scheduled, so the snapshot has them apart and no load for them."""
    queue = _rabbit_queue()
    dep = Deployment(AMQP_URL)
    config = f"""
poll_interval: 10s
providers:
  sandbox: {{kind: mock, boot_delay: 0s, price_per_hour: 0.1}}
queues:
  {queue}:
    metrics: {{source: celery, url: "{AMQP_URL}", management_url: "http://127.0.0.1:15672"}}
    autoscale:
      provider: sandbox
      max_workers: 20
      scale_up: [{{trigger: queue_depth, target_per_worker: 1}}]
      instance: {{gpu: "RTX 4090", max_price_per_hour: 0.5}}
"""
    rt = runtime_with(config, tmp_path)
    try:
        with dep.worker(queue, concurrency=1):
            app = dep.producer()
            for _ in range(3):
                app.send_task("t.hold", args=["x"], queue=queue, countdown=900)
            reader = CeleryRabbitMQReader(AMQP_URL, management_url="http://127.0.0.1:15672")
            raw = wait_for(
                lambda: reader.read([queue])[queue],
                lambda m: (m.pending, m.in_flight) == (0, 3),
                timeout=20,
            )
            reader.close()
            assert (raw.pending, raw.in_flight) == (0, 3)  # the broker: 3 unacknowledged

            snapshot, plan = look(rt)
            m = snapshot.queue(queue).metrics
            assert plan.launches == ()  # one hand-made worker, no load: nothing to rent
            assert (m.pending, m.in_flight) == (0, 0)
            assert (m.scheduled, m.running) == (3, 0)
            assert m.next_due_at is not None
    finally:
        dep.close()
        rt.close()
        _delete_queues(queue)


# --------------------------------------------------------------------------- unstamped ages


class Later:
    """A clock running `offset` seconds ahead of the real one (so minutes pass in a test)."""

    def __init__(self) -> None:
        self.offset = 0.0

    def __call__(self) -> datetime:
        return datetime.now(UTC) + timedelta(seconds=self.offset)


def test_unstamped_age_keeps_growing_while_a_real_worker_drains_the_queue(prefix):
    """A one-process worker takes unstamped jobs one by one. The age of the oldest waiting job
    is bounded from when it was first seen *anywhere* near the head, not at the head: it does not
    fall back to zero on every pop."""
    dep = Deployment(WATCHED, transport={"global_keyprefix": prefix})
    queue = f"gpu-{dep.run}"
    broker = redis.Redis.from_url(WATCHED)
    clock = Later()
    reader = CeleryRedisReader(
        WATCHED, layout=CeleryRedisLayout(global_keyprefix=prefix), clock=clock
    )
    try:
        with dep.worker(queue, concurrency=1):
            app = dep.producer()
            for i in range(8):
                app.send_task("t.hold", args=[dep.key(f"job{i}")], queue=queue)
            wait_for(lambda: broker.llen(prefix + queue), lambda n: n == 6)  # 1 runs, 1 held
            first = clock()
            assert reader.read([queue])[queue].oldest_pending_age == pytest.approx(0, abs=1)
            for i in range(3):  # a job ends every 60 s; the next one waited since the first look
                clock.offset += 60
                dep.open(f"job{i}")
                wait_for(lambda i=i: broker.llen(prefix + queue), lambda n, i=i: n == 5 - i)
                m = reader.read([queue])[queue]
                assert m.pending == 5 - i
                waited = (clock() - first).total_seconds()
                assert m.oldest_pending_age is not None
                assert waited - 2 <= m.oldest_pending_age <= waited + 1, (i, m)
    finally:
        reader.close()
        broker.close()
        dep.close()


def test_rabbitmq_bounds_unstamped_ages_from_its_delivery_counters(tmp_path):
    """No stamp, no peeking: having seen 4 ready jobs, while fewer than 4 have been delivered
    one of them still waits, so the oldest is at least as old as that sighting - also after a
    worker took two."""
    queue = _rabbit_queue()
    dep = Deployment(AMQP_URL)
    clock = Later()
    reader = CeleryRabbitMQReader(AMQP_URL, management_url="http://127.0.0.1:15672", clock=clock)
    try:
        app = dep.producer()
        dep.send(app, 4, "hold", queue=queue)
        published = datetime.now(UTC)
        m = wait_for(
            lambda: reader.read([queue])[queue],
            lambda m: m.pending == 4 and m.oldest_pending_age is not None,
            timeout=20,
        )
        assert m.pending == 4 and m.oldest_pending_age == pytest.approx(0, abs=1)
        first = clock()
        clock.offset += 120
        m = reader.read([queue])[queue]
        assert m.oldest_pending_age == pytest.approx((clock() - first).total_seconds(), abs=1)
        with dep.worker(queue, concurrency=1):  # runs one, holds one: 2 delivered, 2 ready
            m = wait_for(
                lambda: reader.read([queue])[queue],
                lambda m: (m.pending, m.in_flight) == (2, 1),
                timeout=20,
            )
            assert (m.pending, m.in_flight) == (2, 1)
            truth = (clock() - published).total_seconds()
            waited = (clock() - first).total_seconds()
            assert m.oldest_pending_age is not None
            assert waited - 1 <= m.oldest_pending_age <= truth + 1
            dep.open("hold")  # everything runs and ends: nothing waits, no age
            m = wait_for(
                lambda: reader.read([queue])[queue],
                lambda m: (m.pending, m.in_flight) == (0, 0),
                timeout=20,
            )
            assert m.oldest_pending_age is None
    finally:
        reader.close()
        dep.close()
        _delete_queues(queue)


# --------------------------------------------------------------------------- the worker probe


def test_the_worker_probe_is_built_from_the_same_metrics_block_as_the_reader(tmp_path):
    """A worker whose transport uses its own separator and priority steps without 0: its
    remote-control replies land in a priority list a default probe never polls."""
    prefix = f"dep-{uuid.uuid4().hex[:10]}:"
    url = f"{REDIS_URL}/5"
    transport = {"global_keyprefix": prefix, "sep": ":p:", "priority_steps": [1, 5]}
    dep = Deployment(url, transport=transport)
    rt = Runtime(Settings.from_env({"AUTOSCALER_HOME": str(tmp_path)}), env={})
    try:
        with dep.worker("jobs", concurrency=1) as node:
            source = CelerySource(
                url=url, global_keyprefix=prefix, sep=":p:", priority_steps=(1, 5)
            )
            probe = rt.worker_probe(source)
            assert probe is not None
            assert wait_for(probe.poll, lambda r: node in r, timeout=5) == {node: ("jobs",)}
    finally:
        dep.close()
        rt.close()
        clear_redis(url, prefix)
