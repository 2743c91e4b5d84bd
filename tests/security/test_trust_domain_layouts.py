"""Every remote-control attack of a rented machine, on the two layouts that look like separate
domains: queue B under another `global_keyprefix`, and queue B in another database.

Found by playing a machine with its own broker user against a live control plane: its patterns
`*.celery.pidbox` and `*.reply.celery.pidbox` ignored the prefix, so it pushed replies into the
loop's reply lists of other domains, kombu took replies without a ticket as answers, and a queue
under another prefix rose from 1 to 7 counted workers; replies through queue A's broker naming
queue B counted as B's capacity; and its key patterns held in every database.

- Another prefix is a boundary: the machine neither hears that domain's broadcasts, nor reaches
  its reply lists, bindings or `unacked`; a probe there counts none of its replies.
- Another database is not (ACL key patterns hold in every database and a connection starts in
  database 0): the machine does reach database 0's reply lists and `unacked`. Its replies there
  count for nothing (it cannot hear the ticket of a request made on another database), and
  `validate` says that a database is no boundary (`test_broker_user_patterns.py`).
- Wherever a reply is heard, it counts only for the queues of that domain.
Real Redis 7 and the users `broker_users.create_user` makes; the loop's own tick and store.
"""

from __future__ import annotations

import base64
import json
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any, ClassVar

import pytest
import redis
from celery import Celery

from autoscaler.brokers.registry import broker_domain
from autoscaler.brokers.users import BrokerPlan, create_user, delete_user
from autoscaler.brokers.workers import CeleryWorkerProbe, WorkerStatus
from autoscaler.config import load_config_text
from autoscaler.control.observe import record_sightings
from autoscaler.control.runtime import Runtime, utc_now
from autoscaler.control.tick.evaluate import evaluate
from autoscaler.policy.snapshot import QueueMetrics
from autoscaler.settings import Settings
from autoscaler.store import config_versions, instances, migrate
from tests.conftest import REDIS_URL
from tests.control.outbox import RecordingOutbox
from tests.security.flood import ReplyFlood

DB = 9  # the machine's database, no other test broadcasts there; 0 is the other domain
HOST = REDIS_URL.split("://", 1)[1]


@pytest.fixture
def machine() -> Iterator[tuple[str, str]]:
    """A machine of queue A (database 9, no prefix) with the user a launch makes for it."""
    name = f"asg-layout{uuid.uuid4().hex[:8]}-m1"
    plan = BrokerPlan(
        url=f"{REDIS_URL}/{DB}", queue=f"qa-{name}", db=DB, keyprefix="", sep="\x06\x16"
    )
    create_user(plan, name, "pw-" + name)
    try:
        yield name, "pw-" + name
    finally:
        delete_user(f"{REDIS_URL}/0", name)


def _url(user: str, password: str, db: int) -> str:
    return f"redis://{user}:{password}@{HOST}/{db}"


def _probe(db: int, prefix: str) -> CeleryWorkerProbe:
    return CeleryWorkerProbe(
        f"{REDIS_URL}/{db}", transport_options={"global_keyprefix": prefix}, timeout=1.0
    )


def _reply_list(probe: CeleryWorkerProbe, prefix: str) -> str:
    """The probe's reply list (a machine reads its name in the reply exchange's binding set
    while the probe collects; it is named after the probe's mailbox, one per thread)."""
    return f"{prefix}{probe._app.control.mailbox.oid}.reply.celery.pidbox"


# --------------------------------------------------------------------------- another prefix


def test_another_prefix_is_out_of_reach_of_a_machine(machine):
    user, password = machine
    probe = _probe(DB, "b:")  # queue B's loop, same server and database, prefix b:
    try:
        assert probe.poll() == {}  # its reply list and binding now exist
        reply = _reply_list(probe, "b:")
        as_machine = redis.Redis.from_url(_url(user, password, DB))
        try:
            for call in (
                lambda: as_machine.lpush(reply, "forged answer"),
                lambda: as_machine.smembers("b:_kombu.binding.reply.celery.pidbox"),
                lambda: as_machine.hset("b:unacked", "tag", '[{}, "", "b"]'),
                lambda: as_machine.lpush("b:qb", "forged job"),
                lambda: as_machine.execute_command("SUBSCRIBE", f"b:/{DB}.celery.pidbox"),
            ):
                with pytest.raises(redis.exceptions.NoPermissionError):
                    call()
        finally:
            as_machine.close()
        # a flood as the machine hears nothing of B's broadcasts: B counts none of it
        with ReplyFlood(_url(user, password, DB), hostname=f"{user}@evil") as flood:
            for _ in range(3):
                assert probe.poll() == {}
        assert flood.heard == 0 and flood.sent == 0
    finally:
        probe.close()


# --------------------------------------------------------------------------- another database


def test_another_database_is_reachable_yet_its_replies_count_for_nothing(machine):
    user, password = machine
    probe = _probe(0, "")  # queue B's loop on database 0 of the same server
    admin = redis.Redis.from_url(f"{REDIS_URL}/0")
    tag = f"forged-{uuid.uuid4().hex[:8]}"
    try:
        # no SELECT: a connection starts in database 0, where the machine's patterns hold too
        as_machine = redis.Redis.from_url(_url(user, password, 0))
        try:
            assert as_machine.hset("unacked", tag, "[]") == 1  # why validate says "no boundary"
            with pytest.raises(redis.exceptions.NoPermissionError):  # channels are exact
                as_machine.execute_command("SUBSCRIBE", "/0.celery.pidbox")
        finally:
            as_machine.close()
        with ReplyFlood(_url(user, password, DB), hostname=f"{user}@evil") as flood:
            with Forger(_url(user, password, 0)) as forger:
                # kombu's own collection takes the forgeries as answers (and, without a limit,
                # would collect for as long as they come) ...
                stock = Celery("stock", broker=f"{REDIS_URL}/0", set_as_current=False)
                answers = stock.control.broadcast("active_queues", reply=True, timeout=1, limit=1)
                stock.close()
                assert Forger.BODY in answers
                # ... the loop's counts none: the machine cannot hear a ticket of database 0
                for _ in range(3):
                    before = forger.pushed
                    assert probe.poll() == {}
                    assert forger.pushed > before
            assert not forger.errors, forger.errors
        assert flood.heard == 0  # its own database's channel carries nothing of B's
    finally:
        admin.hdel("unacked", tag)
        admin.close()
        probe.close()


class Forger:
    """A machine writing replies by hand into every reply list it finds in the reply
    exchange's binding set (readable to it), with no ticket or a guessed one."""

    BODY: ClassVar[dict[str, Any]] = {
        "ghost-0@evil-0": [{"name": "jobs", "exchange": {"name": "jobs"}}]
    }

    def __init__(self, url: str) -> None:
        self.url = url
        self.pushed = 0
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Forger:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)

    def _run(self) -> None:
        r = redis.Redis.from_url(self.url)
        try:
            while not self._stop.is_set():
                for member in r.smembers("_kombu.binding.reply.celery.pidbox"):
                    reply = member.decode().split("\x06\x16")[-1]
                    for ticket in (None, "a guess"):
                        r.lpush(reply, _kombu_message(self.BODY, ticket))
                        self.pushed += 1
                time.sleep(0.01)
        except Exception as exc:  # the test reads it
            self.errors.append(f"{type(exc).__name__}: {exc}")
        finally:
            r.close()


def _kombu_message(body: dict, ticket: str | None) -> str:
    """A reply as kombu's Redis transport stores one (what a machine writes by hand)."""
    return json.dumps(
        {
            "body": base64.b64encode(json.dumps(body).encode()).decode(),
            "content-encoding": "utf-8",
            "content-type": "application/json",
            "headers": {} if ticket is None else {"ticket": ticket},
            "properties": {
                "delivery_tag": uuid.uuid4().hex,
                "body_encoding": "base64",
                "delivery_info": {"exchange": "reply.celery.pidbox", "routing_key": "x"},
            },
        }
    )


# --------------------------------------------------------------------------- sightings


LAYOUTS = {
    "another prefix": ("redis://127.0.0.1:6379/0", "", "redis://127.0.0.1:6379/0", "b:"),
    "another database": ("redis://127.0.0.1:6379/0", "", "redis://127.0.0.1:6379/1", ""),
}


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_a_reply_counts_only_for_the_queues_of_the_domain_it_came_through(tmp_path, db_url, layout):
    """Queues a and b both trust broker-seen workers (`hand_made: broker`) and both consume
    a queue named `jobs`. Five workers heard through a's domain claiming `jobs` are a's
    capacity, never b's: b rents for its 200 waiting jobs."""
    url_a, prefix_a, url_b, prefix_b = LAYOUTS[layout]

    def block(url: str, prefix: str) -> str:
        extra = f", global_keyprefix: '{prefix}'" if prefix else ""
        return f"""
    metrics: {{source: celery, url: "{url}", queue: jobs{extra}}}
    autoscale:
      provider: sandbox
      max_workers: 3
      hand_made: broker
      scale_up: [{{trigger: queue_depth, target_per_worker: 10}}]
      instance: {{gpu: "RTX 4090", max_price_per_hour: 0.5}}"""

    text = (
        "providers:\n  sandbox: {kind: mock}\nqueues:\n  a:"
        + block(url_a, prefix_a)
        + "\n  b:"
        + block(url_b, prefix_b)
    )
    migrate.upgrade(db_url)
    env = {"AUTOSCALER_HOME": str(tmp_path), "AUTOSCALER_DATABASE_URL": db_url}
    rt = Runtime(Settings.from_env(env), env=env)
    try:
        config = load_config_text(text)
        now = utc_now()
        with rt.transaction() as session:
            config_versions.record(session, config.model_dump(mode="json"), "t", now)
            install = rt.installation_id(session)
            domain_a = broker_domain(config.queues["a"].metrics, env)
            ghosts = {f"ghost-{i}@host-{i}": WorkerStatus(("jobs",), 0) for i in range(5)}
            record_sightings(session, ghosts, install, now, domain_a)
        readings = {q: QueueMetrics(q, 200, 60.0, 0, now) for q in ("a", "b")}
        evaluate(rt, RecordingOutbox(), trigger="t", readings=readings, now=now)
        with rt.transaction() as session:
            launched = [r.queue for r in instances.live_rows(session)]
        assert launched.count("b") == 3  # nobody serves b
        assert launched.count("a") == 0  # a's five hand-made workers cover its 200 jobs
    finally:
        rt.close()
