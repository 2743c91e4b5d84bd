"""RabbitMQ gets real per-machine users too, and there the confinement is exact.

A user per launch through the management API: a real Celery worker runs its queue's jobs and
answers remote control under it, while the same user cannot broadcast (a plain worker of another
queue survives a `shutdown` sent with it), declare or read another queue, nor bind the events
exchange for task events (other queues' arguments). Deleting it, and sweeping leftovers of this
installation only, go through the same management API. Real RabbitMQ with its management API.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests
from celery import Celery
from kombu import Connection, Exchange, Queue

from autoscaler.brokers.rabbitmq import users as rabbit_users
from autoscaler.brokers.users import create_user, delete_machine_user, plan_for, sweep
from autoscaler.config import load_config_text
from autoscaler.config.metrics_sources import CelerySource
from tests.conftest import AMQP_URL

MGMT = "http://127.0.0.1:15672"
APP = """
import os, time
from celery import Celery
app = Celery("rabbitapp", broker=os.environ["BROKER"], set_as_current=False)
app.conf.update(worker_prefetch_multiplier=1, broker_connection_retry_on_startup=True)

@app.task(name="rabbitapp.mark")
def mark(path):
    open(path, "w").write("ran")
"""


def _worker(tmp_path: Path, broker: str, queue: str, name: str) -> subprocess.Popen[bytes]:
    (tmp_path / "rabbitapp.py").write_text(APP)
    log = open(tmp_path / f"{name}.log", "ab")  # noqa: SIM115 - the child keeps it
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "rabbitapp",
            "worker",
            "-Q",
            queue,
            "-n",
            f"{name}@h",
            "--pool",
            "solo",
            "--without-mingle",
            "-l",
            "info",
        ],
        cwd=tmp_path,
        env={**os.environ, "BROKER": broker},
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    log.close()
    deadline = time.monotonic() + 60
    while " ready." not in (tmp_path / f"{name}.log").read_text(errors="replace"):
        assert proc.poll() is None, (tmp_path / f"{name}.log").read_text()
        assert time.monotonic() < deadline, "the worker did not start"
        time.sleep(0.2)
    return proc


def _stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@pytest.fixture
def machine() -> Iterator[tuple[rabbit_users.RabbitPlan, str, str]]:
    install = f"t{uuid.uuid4().hex[:10]}"
    queue = f"rq-{uuid.uuid4().hex[:8]}"
    source = CelerySource(url=AMQP_URL, management_url=MGMT)
    plan = plan_for(source, queue)
    assert isinstance(plan, rabbit_users.RabbitPlan)
    user = plan.user(install, "l1")
    create_user(plan, user, "pw-" + user)
    try:
        yield plan, user, queue
    finally:
        rabbit_users.delete_user(plan, user)


def test_a_machines_rabbitmq_user_works_and_reaches_nothing_else(machine, tmp_path):
    plan, user, queue = machine
    url = plan.machine_url(user, "pw-" + user)
    victim_queue = f"rv-{uuid.uuid4().hex[:8]}"
    mine = _worker(tmp_path, url, queue, user)
    victim = _worker(tmp_path, AMQP_URL, victim_queue, "victim")
    admin = Celery("admin", broker=AMQP_URL, set_as_current=False)
    as_machine = Celery("machine", broker=url, set_as_current=False)
    try:
        marker = tmp_path / "ran"
        admin.send_task("rabbitapp.mark", args=[str(marker)], queue=queue, routing_key=queue)
        deadline = time.monotonic() + 30
        while not marker.exists():
            assert time.monotonic() < deadline, (tmp_path / f"{user}.log").read_text()
            time.sleep(0.2)
        assert admin.control.ping([f"{user}@h"], timeout=3.0)  # it answers remote control

        as_machine.control.broadcast("shutdown", destination=["victim@h"])  # refused by RabbitMQ
        time.sleep(2.0)
        assert victim.poll() is None and admin.control.ping(["victim@h"], timeout=3.0)

        with Connection(url) as conn:
            for attempt in (
                lambda ch: Queue(victim_queue, channel=ch).declare(),
                lambda ch: ch.basic_get(victim_queue),
                lambda ch: Queue(
                    f"celeryev.spy-{uuid.uuid4().hex[:6]}",
                    exchange=Exchange("celeryev", type="topic"),
                    routing_key="task.#",
                    channel=ch,
                    auto_delete=True,
                ).declare(),
            ):
                with pytest.raises(Exception, match="ACCESS_REFUSED"):
                    attempt(conn.channel())
    finally:
        admin.close()
        as_machine.close()
        _stop(mine)
        _stop(victim)
        for q in (queue, victim_queue):  # the broker keeps durable queues: leave none behind
            requests.delete(f"{MGMT}/api/queues/%2F/{q}", auth=("guest", "guest"), timeout=5)


def test_users_are_deleted_and_swept_for_this_installation_only(tmp_path):
    install, other = f"t{uuid.uuid4().hex[:10]}", f"o{uuid.uuid4().hex[:10]}"
    queue = f"rq-{uuid.uuid4().hex[:8]}"
    source = CelerySource(url=AMQP_URL, management_url=MGMT)
    plan = plan_for(source, queue)
    assert isinstance(plan, rabbit_users.RabbitPlan)
    users = {n: plan.user(i, n) for i, n in ((install, "live"), (install, "gone"), (other, "x"))}
    for name in users.values():
        create_user(plan, name, "pw")
    try:
        config = load_config_text(f"""
providers: {{gpu: {{kind: mock}}}}
queues:
  {queue}:
    metrics: {{source: celery, url: "{AMQP_URL}", management_url: "{MGMT}"}}
    autoscale:
      provider: gpu
      max_workers: 1
      instance: {{gpu: RTX 4090, max_price_per_hour: 0.6}}
""")
        assert sweep(config, install, {"live"}) == [users["gone"]]
        left = set(rabbit_users.list_users(plan))
        assert users["live"] in left and users["x"] in left and users["gone"] not in left
        assert delete_machine_user(source, users["live"], None)
        assert users["live"] not in set(rabbit_users.list_users(plan))
        r = requests.get(f"{MGMT}/api/users/{users['x']}", auth=("guest", "guest"), timeout=5)
        assert r.status_code == 200  # another installation's user is never touched
    finally:
        for name in users.values():
            rabbit_users.delete_user(plan, name)


def test_a_launch_makes_its_user_and_the_destroy_deletes_it(tmp_path, sqlite_url):
    from datetime import UTC, datetime

    from fastapi.testclient import TestClient

    from autoscaler.api.app import create_app
    from autoscaler.control.runtime import Runtime
    from autoscaler.control.steps import launch, terminate
    from autoscaler.control.steps.frame import Kind, run_step
    from autoscaler.lifecycle import InstanceState as S
    from autoscaler.settings import Settings
    from autoscaler.store import config_versions, instances, intents, migrate, moves

    queue = f"rq-{uuid.uuid4().hex[:8]}"
    migrate.upgrade(sqlite_url)
    env = {
        "AUTOSCALER_HOME": str(tmp_path),
        "AUTOSCALER_DATABASE_URL": sqlite_url,
        "AUTOSCALER_API_URL": "https://autoscaler.example.invalid",
    }
    rt = Runtime(Settings.from_env(env), env=env)
    client = TestClient(create_app(rt), raise_server_exceptions=False)
    try:
        config = load_config_text(f"""
providers: {{sandbox: {{kind: mock, boot_delay: 1}}}}
queues:
  {queue}:
    metrics: {{source: celery, url: "{AMQP_URL}", management_url: "{MGMT}"}}
    autoscale:
      provider: sandbox
      max_workers: 1
      instance: {{gpu: RTX 4090, max_price_per_hour: 0.6}}
""")
        now = datetime.now(UTC)
        with rt.transaction() as session:
            config_versions.record(session, config.model_dump(mode="json"), "t", now)
            intents.add_intents(session, [("r1", queue, "sandbox", "t")], now)
        assert run_step(launch.STEP, rt, "r1").kind is Kind.DONE
        with rt.transaction() as session:
            row = instances.get(session, "r1")
            assert row is not None and row.broker_user
            user = row.broker_user
        plan = plan_for(CelerySource(url=AMQP_URL, management_url=MGMT), queue)
        assert isinstance(plan, rabbit_users.RabbitPlan)
        assert user in rabbit_users.list_users(plan)
        # its agent would ask for its deployment with its token: find the token the mock holds
        from sqlalchemy import select

        from autoscaler.store.models import MockMachine

        with rt.transaction() as session:
            machine = session.scalars(select(MockMachine)).one()
        assert "guest" not in str(machine.env)  # never the broker's own credentials
        with rt.transaction() as session:
            moves.move(session, "r1", S.BOOTING, S.TERMINATING, datetime.now(UTC), "test")
        assert run_step(terminate.STEP, rt, "r1").kind is Kind.DONE
        assert user not in rabbit_users.list_users(plan)
    finally:
        client.close()
        rt.close()


def test_no_user_for_a_queue_whose_exchange_routes_elsewhere_and_shared_exchanges_are_checked():
    """As on Redis: a queue whose exchange also routes to another queue gets no per-machine
    user unless accepted (a machine could bind its queue there). And since `configure` on the
    shared exchanges covers deleting them, their types are checked (here in a vhost of its own,
    where a machine had redeclared `celeryev` as a fanout to see every task event)."""
    from autoscaler.brokers.users import NoBrokerUser

    queue, other = f"rq-{uuid.uuid4().hex[:8]}", f"ro-{uuid.uuid4().hex[:8]}"
    with Connection(AMQP_URL) as conn:
        ch = conn.channel()
        exchange = Exchange(queue, type="direct", channel=ch)
        exchange.declare()
        Queue(queue, exchange=exchange, routing_key=queue, channel=ch).declare()
        source = CelerySource(url=AMQP_URL, management_url=MGMT)
        assert isinstance(plan_for(source, queue), rabbit_users.RabbitPlan)
        Queue(other, exchange=exchange, routing_key="copy", channel=ch).declare()
        try:
            with pytest.raises(NoBrokerUser, match=f"also routes to {other}"):
                plan_for(source, queue)
            accepted = source.model_copy(update={"shared_exchange": "accept"})
            assert isinstance(plan_for(accepted, queue), rabbit_users.RabbitPlan)
        finally:
            for q in (queue, other):
                requests.delete(f"{MGMT}/api/queues/%2F/{q}", auth=("guest", "guest"), timeout=5)
            requests.delete(f"{MGMT}/api/exchanges/%2F/{queue}", auth=("guest", "guest"), timeout=5)

    vhost = f"review-{uuid.uuid4().hex[:6]}"
    auth = ("guest", "guest")
    requests.put(f"{MGMT}/api/vhosts/{vhost}", auth=auth, timeout=5).raise_for_status()
    try:
        requests.put(
            f"{MGMT}/api/permissions/{vhost}/guest",
            auth=auth,
            timeout=5,
            json={"configure": ".*", "write": ".*", "read": ".*"},
        ).raise_for_status()
        url = AMQP_URL.rstrip("/") + f"/{vhost}"
        plan = plan_for(CelerySource(url=url, management_url=MGMT), "q")
        assert isinstance(plan, rabbit_users.RabbitPlan) and plan.vhost == vhost
        assert rabbit_users.shared_exchanges_intact(plan) == []  # none declared yet: fine
        with Connection(url) as conn:
            Exchange("celeryev", type="fanout", channel=conn.channel()).declare()
        assert rabbit_users.shared_exchanges_intact(plan) == [
            "exchange 'celeryev' is 'fanout', not 'topic'"
        ]
    finally:
        requests.delete(f"{MGMT}/api/vhosts/{vhost}", auth=auth, timeout=5)
