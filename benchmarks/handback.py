"""A machine lost mid-job: how long until its job runs on another machine, today and with the
hand-back (`control.steps.handback`), on Redis and RabbitMQ with `task_acks_late`.

    python benchmarks/handback.py [--trials 2] [--visibility-timeout 20] [--restore-interval 10]
                                  [--heartbeat 10]

Real servers (Redis, RabbitMQ with its management API), real Celery worker processes
(tests/control/handback_app.py: acks late, prefetch 1, solo pool), each RabbitMQ worker under a
broker user of its own as a rented machine is given. Per case, on a queue of its own: worker a
takes a long job, worker b waits on the queue, then a's machine is lost; measured is the time
from the loss to b's start of the job (the marks file, polled every 10 ms).

  Redis, killed      a's process group gets SIGKILL (Redis has no connection-bound acks: a
                     frozen machine is the same). kombu restores the message from its `unacked`
                     hash only once its delivery is `visibility_timeout` old (3600 s by
                     default), at some consumer's `restore_visible` sweep (every
                     `unacked_restore_interval` x `unacked_restore_throttle` = 10 x 10 s by
                     default): measured with `--visibility-timeout` on b's app and the sweep
                     every 10 s (throttle 1), so the run stays short. The hand-back changes
                     nothing here: the hash records no consumer and every machine of the domain
                     may write it, so no machine's word restores a job (`control.steps.handback`).
  RabbitMQ, frozen   a's process group gets SIGSTOP: a host that vanished, its TCP connection
                     open. Today the broker requeues when the AMQP heartbeat gives up: measured
                     with `--heartbeat` as a's `broker_heartbeat`; Celery asks for 120 s, which
                     RabbitMQ (server default 60 s) negotiates down to the smaller. With the
                     hand-back: the handback step closes the connections of a's user through the
                     management API right after the freeze.
  RabbitMQ, killed   SIGKILL: the kernel closes the socket and the broker requeues at once, even
                     today (a process that died on a machine that is still up; a destroyed host
                     sends nothing, which is the frozen case).

In the control loop the step does not run at the loss itself: reconcile sees the provider say
the machine is gone at its next poll (up to `poll_interval`, 30 s by default), then waits
`control.steps.handback.GRACE` (5 s); the budget is printed beside the measured step.

Measured on this 2-core machine (2 trials, medians; visibility timeout 20 s with a sweep
every 10 s, heartbeat 10 s; RabbitMQ 3.10 granting 60 s to Celery's 120 s, kombu 5.7; 105 s
in all):

    case                today (measured)              with the hand-back   today / with
    Redis, killed       20.00 s (visibility 20 s*)    (the same)           1x
    RabbitMQ, frozen    29.65 s (heartbeat 10 s)      0.01 s               2322x
    RabbitMQ, killed    0.01 s                        (at once already)    -

    at the defaults     today                         with (loop budget)   today / with
    Redis, killed       ~3600 s (<= 3700 s)           (the same)           1x
    RabbitMQ, frozen    ~178 s (3.0 x 60 s)           <= 35.01 s           ~5.1x

The hand-back step itself took 0.013 s on RabbitMQ; the job started on b within 10 ms of it.
On Redis it restores nothing (kombu's unacked hash does not say whose a delivery is: a
machine's word would be all there is). (*) Redis is the visibility timeout counted from the
delivery (a was killed 0.3 s into the job, once b was up) plus the wait for b's next sweep; at
the defaults, an hour less the time the job had run, plus up to 100 s. A frozen RabbitMQ
connection lasted 3.0 heartbeat timeouts: RabbitMQ's heartbeat receiver checks once per
timeout and gives up after two checks with nothing new, 2 to 3 timeouts after the last byte it
received; the default row scales the measured multiple to the 60 s granted (120-180 s). In the
loop, the hand-back's worst case is dominated by reconcile's poll: a shorter `poll_interval`
shortens it, the step itself does not matter.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any
from urllib.parse import quote

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import redis  # noqa: E402
import requests  # noqa: E402
from celery import Celery  # noqa: E402
from kombu.connection import Connection  # noqa: E402

from autoscaler.brokers.rabbitmq import users as rabbit_users  # noqa: E402
from autoscaler.brokers.users import create_user, plan_for  # noqa: E402
from autoscaler.config import load_config_text  # noqa: E402
from autoscaler.config.metrics_sources import CelerySource  # noqa: E402
from autoscaler.config.models import Config  # noqa: E402
from autoscaler.control.runtime import Runtime, utc_now  # noqa: E402
from autoscaler.control.steps.frame import Kind, run_step  # noqa: E402
from autoscaler.control.steps.handback import GRACE, STEP  # noqa: E402
from autoscaler.lifecycle import InstanceState  # noqa: E402
from autoscaler.settings import Settings  # noqa: E402
from autoscaler.store import config_versions, migrate  # noqa: E402
from autoscaler.store.models import Instance  # noqa: E402
from tests.conftest import AMQP_URL, REDIS_URL  # noqa: E402

REDIS_BROKER = f"{REDIS_URL}/0"
MGMT = "http://127.0.0.1:15672"
MGMT_AUTH = ("guest", "guest")
CELERY_HEARTBEAT = 120.0  # Celery's broker_heartbeat default
KOMBU_VISIBILITY = 3600.0  # kombu's Redis visibility_timeout default
KOMBU_SWEEP = 10.0 * 10  # unacked_restore_interval x unacked_restore_throttle, kombu's defaults
JOB_SECONDS = 600.0  # never finishes: each case ends at b's start

# the test app, its broker options and heartbeat overridden from HB_BENCH (JSON)
LAUNCH = """
import json, os, sys
from tests.control.handback_app import app
opts = json.loads(os.environ["HB_BENCH"])
app.conf.broker_transport_options = {**app.conf.broker_transport_options, **opts["transport"]}
if opts.get("heartbeat") is not None:
    app.conf.broker_heartbeat = opts["heartbeat"]
app.worker_main(sys.argv[1:])
"""


class Bench:
    """Worker processes, per-machine users, queues and keys made by the run; all removed at
    the end."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.procs: list[subprocess.Popen[bytes]] = []
        self.users: list[tuple[rabbit_users.RabbitPlan, str]] = []
        self.rabbit_queues: list[str] = []
        self.prefixes: list[str] = []

    def worker(
        self,
        name: str,
        broker: str,
        queue: str,
        transport: dict[str, Any] | None = None,
        heartbeat: float | None = None,
    ) -> subprocess.Popen[bytes]:
        """A worker of the test app consuming `queue`; returns once it is ready."""
        opts = {"transport": transport or {}, "heartbeat": heartbeat}
        env = os.environ | {"HB_BROKER": broker, "HB_ACKS": "late", "HB_BENCH": json.dumps(opts)}
        log_path = self.tmp / f"{name}.log"
        with log_path.open("ab") as log:
            proc = subprocess.Popen(
                [sys.executable, "-c", LAUNCH, "worker", "-Q", queue, "--pool", "solo", "-c", "1",
                 "-n", f"{name}@hb", "--without-gossip", "--without-mingle",
                 "--without-heartbeat", "-l", "INFO"],
                cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip
        self.procs.append(proc)
        deadline = time.monotonic() + 60
        while " ready." not in log_path.read_text(errors="replace"):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"worker {name} did not start: see {log_path}")
            time.sleep(0.05)
        return proc

    def signal(self, proc: subprocess.Popen[bytes], sig: signal.Signals) -> float:
        """Send `sig` to the worker's process group; the monotonic time it was sent."""
        at = time.monotonic()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        if sig == signal.SIGKILL:
            proc.wait(10)
        return at

    def user(self, plan: rabbit_users.RabbitPlan, launch_id: str) -> tuple[str, str]:
        """A machine's own RabbitMQ user: (its name, its broker URL)."""
        user = plan.user(f"b{uuid.uuid4().hex[:10]}", launch_id)
        create_user(plan, user, "pw-" + user)
        self.users.append((plan, user))
        return user, plan.machine_url(user, "pw-" + user)

    def close(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                self.signal(proc, signal.SIGKILL)
        for plan, user in self.users:
            with contextlib.suppress(rabbit_users.RabbitUnreachable):
                rabbit_users.delete_user(plan, user)
        for queue in self.rabbit_queues:
            requests.delete(
                f"{MGMT}/api/queues/%2F/{quote(queue, safe='')}", auth=MGMT_AUTH, timeout=5
            )
        client = redis.Redis.from_url(REDIS_BROKER)
        for prefix in self.prefixes:
            for key in client.scan_iter(match=prefix + "*"):
                client.delete(key)
        client.close()


def started(marks: Path, worker: str, job: str, timeout: float) -> float:
    """The monotonic time `worker` is first seen to have started `job`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for line in marks.read_text(encoding="utf-8").splitlines():
            mark = json.loads(line)
            if (mark["what"], mark["worker"].split("@")[0], mark["id"]) == ("start", worker, job):
                return time.monotonic()
        time.sleep(0.01)
    raise RuntimeError(f"{worker} did not start {job} within {timeout:.0f} s")


def publish(broker: str, transport: dict[str, Any], marks: Path, queue: str, job: str) -> None:
    app = Celery("hb-bench", broker=broker, set_as_current=False)
    app.conf.broker_transport_options = transport
    try:
        app.send_task("hb.work", args=[str(marks), JOB_SECONDS], task_id=job, queue=queue,
                      routing_key=queue)  # fmt: skip
    finally:
        app.close()


def lost(rt: Runtime, launch_id: str, queue: str, job: str, user: str | None) -> None:
    """The control plane's row of a machine reconcile found gone: due for its hand-back."""
    now = utc_now()
    with rt.transaction() as session:
        session.add(
            Instance(
                launch_id=launch_id,
                queue=queue,
                provider="gpu",
                state=InstanceState.LOST,
                created_at=now - timedelta(minutes=10),
                tasks=[job],
                acks_late=True,
                broker_user=user,
                handback_due_at=now - timedelta(seconds=1),
            )
        )


class Case:
    """One case's result: the loss-to-start time, the hand-back step's own duration, and how
    long a had run the job (from its start, about its delivery) when its machine was lost."""

    def __init__(self, seconds: float, step: float | None = None, ran: float = 0.0) -> None:
        self.seconds, self.step, self.ran = seconds, step, ran


def redis_case(bench: Bench, visibility: float, sweep: float) -> Case:
    """SIGKILL a mid-job; b's own sweep brings the job back after `visibility`. The hand-back
    changes nothing on Redis (`control.steps.handback`: the broker cannot tell whose a delivery
    is)."""
    tag = uuid.uuid4().hex[:6]
    queue, prefix = f"hbb-r-{tag}", f"hbb-{tag}:"
    marks = bench.tmp / f"marks-{tag}.jsonl"
    marks.touch()
    bench.prefixes.append(prefix)
    base = {"global_keyprefix": prefix}
    a = bench.worker(f"a{tag}", REDIS_BROKER, queue, base)
    publish(REDIS_BROKER, base, marks, queue, f"job-{tag}")
    took = started(marks, f"a{tag}", f"job-{tag}", 30)
    opts_b = base | {
        "visibility_timeout": visibility,
        "unacked_restore_interval": sweep,
        "unacked_restore_throttle": 1,
    }
    b = bench.worker(f"b{tag}", REDIS_BROKER, queue, opts_b)
    at = bench.signal(a, signal.SIGKILL)
    ran = started(marks, f"b{tag}", f"job-{tag}", visibility + 2 * sweep + 60)
    bench.signal(b, signal.SIGKILL)
    return Case(ran - at, None, at - took)


def rabbit_case(bench: Bench, rt: Runtime | None, how: signal.Signals, heartbeat: float) -> Case:
    """Freeze (SIGSTOP) or kill a mid-job; today (rt None) or handed back."""
    tag = uuid.uuid4().hex[:6]
    queue = f"hbb-a-{tag}"
    marks = bench.tmp / f"marks-{tag}.jsonl"
    marks.touch()
    plan = plan_for(CelerySource(url=AMQP_URL, management_url=MGMT), queue)
    assert isinstance(plan, rabbit_users.RabbitPlan)
    bench.rabbit_queues.append(queue)
    user_a, url_a = bench.user(plan, f"a{tag}")
    user_b, url_b = bench.user(plan, f"b{tag}")
    a = bench.worker(user_a, url_a, queue, heartbeat=heartbeat)
    publish(AMQP_URL, {}, marks, queue, f"job-{tag}")
    took = started(marks, user_a, f"job-{tag}", 30)
    b = bench.worker(user_b, url_b, queue, heartbeat=heartbeat)
    if rt is not None:  # the control plane's rows, ready before the loss
        configure(rt, queue, f'{{source: celery, url: "{AMQP_URL}", management_url: "{MGMT}"}}')
        lost(rt, f"rabbit-{tag}", queue, f"job-{tag}", user_a)
    at = bench.signal(a, how)
    step = None
    if rt is not None:
        t = time.monotonic()
        what = run_step(STEP, rt, f"rabbit-{tag}")
        step = time.monotonic() - t
        assert what.kind is Kind.DONE and user_a in str(what), what
    ran = started(marks, user_b, f"job-{tag}", 4 * heartbeat + 60)
    bench.signal(b, signal.SIGKILL)
    bench.signal(a, signal.SIGKILL)
    return Case(ran - at, step, at - took)


def runtime(tmp: Path) -> Runtime:
    """The control plane on SQLite."""
    url = f"sqlite:///{tmp / 'state.db'}"
    migrate.upgrade(url)
    env = {"AUTOSCALER_HOME": str(tmp), "AUTOSCALER_DATABASE_URL": url}
    return Runtime(Settings.from_env(env), env=env)


def configure(rt: Runtime, queue: str, metrics: str) -> None:
    """A configuration naming the queue handed back on (each case has a queue of its own)."""
    config = load_config_text(
        f"""
providers:
  gpu: {{kind: mock}}
queues:
  {queue}:
    metrics: {metrics}
    autoscale:
      provider: gpu
      max_workers: 2
      instance: {{gpu: "RTX 4090", max_price_per_hour: 1}}
"""
    )
    with rt.transaction() as session:
        config_versions.record(session, config.model_dump(mode="json"), "bench", utc_now())


def negotiated_heartbeat() -> float:
    """The heartbeat a worker with Celery's default gets from this broker."""
    with Connection(AMQP_URL, heartbeat=CELERY_HEARTBEAT) as conn:  # type: ignore[no-untyped-call]
        conn.connect()
        return float(conn.connection.heartbeat)


def median_of(trials: int, run: Callable[[], Case], label: str) -> Case:
    cases = []
    for i in range(trials):
        cases.append(run())
        last = cases[-1]
        extra = f", the step {last.step:.3f} s" if last.step is not None else ""
        print(
            f"  {label}, trial {i + 1}: {last.seconds:.2f} s (a lost {last.ran:.1f} s into the "
            f"job{extra})",
            flush=True,
        )
    steps = [c.step for c in cases if c.step is not None]
    return Case(
        statistics.median(c.seconds for c in cases),
        statistics.median(steps) if steps else None,
        statistics.median(c.ran for c in cases),
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--trials", type=int, default=2)
    ap.add_argument(
        "--visibility-timeout",
        type=float,
        default=20.0,
        help="kombu's visibility_timeout on the Redis 'today' worker (s)",
    )
    ap.add_argument(
        "--restore-interval",
        type=float,
        default=10.0,
        help="kombu's unacked_restore_interval there (its sweep; throttle 1)",
    )
    ap.add_argument(
        "--heartbeat",
        type=float,
        default=10.0,
        help="Celery's broker_heartbeat on the frozen RabbitMQ worker (s)",
    )
    args = ap.parse_args()  # fmt: skip

    tmp = Path(tempfile.mkdtemp(prefix="handback-bench-"))
    bench = Bench(tmp)
    rt = runtime(tmp)
    vis, sweep, hb = args.visibility_timeout, args.restore_interval, args.heartbeat
    n = args.trials
    t_start = time.monotonic()
    try:
        print("Redis, a killed mid-job:", flush=True)
        redis_today = median_of(n, lambda: redis_case(bench, vis, sweep), "today")
        print("RabbitMQ, a frozen mid-job (SIGSTOP):", flush=True)
        frozen_today = median_of(n, lambda: rabbit_case(bench, None, signal.SIGSTOP, hb), "today")
        frozen_with = median_of(
            n, lambda: rabbit_case(bench, rt, signal.SIGSTOP, hb), "with the hand-back"
        )
        print("RabbitMQ, a killed mid-job (SIGKILL):", flush=True)
        killed_today = median_of(n, lambda: rabbit_case(bench, None, signal.SIGKILL, hb), "today")
        default_hb = negotiated_heartbeat()
    finally:
        rt.close()
        bench.close()
        shutil.rmtree(tmp, ignore_errors=True)

    poll = float(Config.model_fields["poll_interval"].default)
    grace = GRACE.total_seconds()
    loop_rabbit = poll + grace + (frozen_with.step or 0.0)
    factor = frozen_today.seconds / hb
    frozen_default = factor * default_hb
    print(f"\nmedian of {n} trial(s), {time.monotonic() - t_start:.0f} s in all\n")
    rows = [
        ("case", "today (measured)", "with the hand-back", "today / with"),
        ("Redis, killed", f"{redis_today.seconds:.2f} s (visibility {vis:g} s*)",
         "(the same)", "1x"),
        ("RabbitMQ, frozen", f"{frozen_today.seconds:.2f} s (heartbeat {hb:g} s)",
         f"{frozen_with.seconds:.2f} s", f"{frozen_today.seconds / frozen_with.seconds:.0f}x"),
        ("RabbitMQ, killed", f"{killed_today.seconds:.2f} s", "(at once already)", "-"),
        ("", "", "", ""),
        ("at the defaults", "today", "with (loop budget)", "today / with"),
        ("Redis, killed", f"~{KOMBU_VISIBILITY:.0f} s (<= "
         f"{KOMBU_VISIBILITY + KOMBU_SWEEP:.0f} s)", "(the same)", "1x"),
        ("RabbitMQ, frozen", f"~{frozen_default:.0f} s ({factor:.1f} x {default_hb:g} s)",
         f"<= {loop_rabbit:.2f} s", f"~{frozen_default / loop_rabbit:.1f}x"),
    ]  # fmt: skip
    for row in rows:
        print(f"    {row[0]:<20}{row[1]:<30}{row[2]:<21}{row[3]}".rstrip())
    print(
        f"\nthe hand-back step itself: {frozen_with.step or 0:.3f} s on RabbitMQ (on Redis it "
        "restores nothing: kombu's unacked hash does not say whose a delivery is); in the "
        "loop it runs after reconcile's "
        f"poll (up to poll_interval, {poll:g} s by default) and GRACE ({grace:g} s).\n"
        f"* Redis today: the visibility timeout counted from the delivery (a was killed "
        f"{redis_today.ran:.1f} s into the job, once b was up: a job lost later into its run "
        f"waits that much less) plus the wait for a sweep (every {sweep:g} s here; "
        f"{KOMBU_SWEEP:g} s at kombu's defaults).\n"
        f"RabbitMQ today: a frozen connection lasted {factor:.1f} heartbeat timeouts (RabbitMQ "
        f"gives up 2 to 3 timeouts after the last byte it received); Celery asks for "
        f"{CELERY_HEARTBEAT:g} s and this broker grants {default_hb:g} s: "
        f"{2 * default_hb:g}-{3 * default_hb:g} s at the defaults."
    )


if __name__ == "__main__":
    main()
