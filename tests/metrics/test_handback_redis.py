"""A gone machine's unacked Celery jobs go back to their queues on Redis, exactly once.

Real Redis, real kombu consumers (Celery-style: `no_ack=False`, a long visibility timeout) that
die holding messages (SIGKILL, or a channel told not to restore), real Celery producers
(protocols 2 and 1, priorities, a `global_keyprefix`). `restore_unacked` must put each message
on the list kombu would (same queue, same priority step, the end consumers take next), remove
it from `unacked` and `unacked_index`, and never push one twice — against a second restorer,
against kombu's own shutdown restore (WATCH, no mutex) and against kombu's visibility-timeout
restore (the `unacked_mutex`).
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from functools import partial
from typing import Any

import pytest
import redis
from celery import Celery
from kombu import Connection, Consumer, Exchange, Queue
from kombu.transport.redis import Mutex

from autoscaler.metrics.celery_redis import CeleryRedisLayout
from autoscaler.metrics.handback import (
    UnackedMutexHeld,
    restore_unacked,
    task_id_of,
    unacked_mutex,
)
from tests.conftest import REDIS_URL
from tests.metrics.helpers import unacked_entry

SEP = "\x06\x16"
STEPS = [0, 3, 6, 9]
STEP_OF = {0: 0, 1: 0, 2: 0, 3: 3, 4: 3, 5: 3, 6: 6, 7: 6, 8: 6, 9: 9}


def options(prefix: str, **more: Any) -> dict[str, Any]:
    return {"global_keyprefix": prefix, "visibility_timeout": 36_000, "priority_steps": STEPS,
            "sep": SEP, **more}


def producer(url: str, prefix: str, protocol: int = 2) -> Celery:
    app = Celery(f"producer{protocol}", broker=url, set_as_current=False)
    app.conf.broker_transport_options = options(prefix)
    app.conf.task_protocol = protocol
    return app


def send(app: Celery, queue: str, priority: int = 0, **kw: Any) -> str:
    return str(app.send_task("t.work", args=[1], queue=queue, priority=priority, **kw).id)


def key(prefix: str, queue: str, priority: int) -> str:
    step = STEP_OF[priority]
    return f"{prefix}{queue}{SEP}{step}" if step else f"{prefix}{queue}"


def listed(r: redis.Redis, prefix: str, queues: list[str]) -> dict[str, list[dict[str, Any]]]:
    """Every message waiting in the queues' priority lists, per list, head (left) first."""
    out = {}
    for q in queues:
        for step in STEPS:
            k = f"{prefix}{q}{SEP}{step}" if step else f"{prefix}{q}"
            out[k] = [json.loads(v) for v in r.lrange(k, 0, -1)]
    return out


def waiting_ids(r: redis.Redis, prefix: str, queues: list[str]) -> Counter[str]:
    return Counter(
        task_id_of(m) or "?" for msgs in listed(r, prefix, queues).values() for m in msgs
    )


def unacked_ids(r: redis.Redis, prefix: str) -> dict[str, str]:
    """delivery tag -> task id of every entry of the unacked hash (small hashes only)."""
    return {
        (k.decode() if isinstance(k, bytes) else k): task_id_of(json.loads(v)[0]) or "?"
        for k, v in r.hgetall(f"{prefix}unacked").items()
    }


DYING_CONSUMER = r"""
import json, sys, time
from kombu import Connection, Consumer, Queue
opts, queues, want = json.loads(sys.argv[1]), sys.argv[2].split(","), int(sys.argv[3])
got = []
with Connection(sys.argv[4], transport_options=opts) as conn:
    ch = conn.channel()
    ch.basic_qos(0, want, False)
    c = Consumer(ch, [Queue(q) for q in queues], no_ack=False, accept=["json"],
                 callbacks=[lambda body, m: got.append(m)])
    c.consume()
    deadline = time.monotonic() + 30
    while len(got) < want and time.monotonic() < deadline:
        try:
            conn.drain_events(timeout=1)
        except TimeoutError:
            pass
    for m in got:
        print("GOT", m.headers.get("id") or m.properties.get("correlation_id"),
              m.delivery_tag, flush=True)
    print("READY", flush=True)
    time.sleep(600)
"""


def take_and_die(prefix: str, queues: list[str], want: int) -> dict[str, str]:
    """A kombu consumer in its own process takes `want` messages (acks late: none acked) and
    is SIGKILLed: no ack, no restore. task id -> delivery tag of what it held."""
    held = dict(take_and_die_all(prefix, queues, want))
    assert len(held) == want
    return held


def take_and_die_all(prefix: str, queues: list[str], want: int) -> list[tuple[str, str]]:
    """`take_and_die`, as (task id, delivery tag) pairs (a task id may come twice)."""
    proc = subprocess.Popen(
        [sys.executable, "-c", DYING_CONSUMER, json.dumps(options(prefix)), ",".join(queues),
         str(want), REDIS_URL],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
    )
    held: list[tuple[str, str]] = []
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.startswith("GOT "):
                _, tid, tag = line.split()
                held.append((tid, tag))
            elif line.startswith("READY"):
                break
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
    assert len(held) == want, proc.stderr.read() if proc.stderr else ""
    return held


def drain(prefix: str, queues: list[str], quiet: float = 1.0) -> list[tuple[str, bool]]:
    """Another (live) consumer takes and acks everything until `quiet` seconds pass with no
    message: (task id, redelivered) in the order received."""
    got: list[tuple[str, bool]] = []

    def on_message(body: Any, message: Any) -> None:
        got.append((message.headers.get("id") or message.properties["correlation_id"],
                    bool(message.delivery_info.get("redelivered"))))
        message.ack()

    with Connection(REDIS_URL, transport_options=options(prefix)) as conn:
        ch = conn.channel()
        ch.basic_qos(0, 1, False)
        with Consumer(ch, [Queue(q) for q in queues], no_ack=False, accept=["json"],
                      callbacks=[on_message]):
            last = time.monotonic()
            while time.monotonic() - last < quiet:
                before = len(got)
                with contextlib.suppress(TimeoutError):
                    conn.drain_events(timeout=0.2)
                if len(got) != before:
                    last = time.monotonic()
    return got


# --------------------------------------------------------------------------- the hand-back


def test_a_dead_consumers_jobs_go_back_where_kombu_would_put_them(prefix, rclient):
    qa, qb = f"qa-{uuid.uuid4().hex[:6]}", f"qb-{uuid.uuid4().hex[:6]}"
    p2, p1 = producer(REDIS_URL, prefix, 2), producer(REDIS_URL, prefix, 1)
    pri: dict[str, int] = {}
    for priority in (0, 2, 3, 5, 7, 9):
        pri[send(p2, qa, priority)] = priority
    for priority in (0, 6):  # Celery's protocol 1: the id in the body and correlation_id
        pri[send(p1, qa, priority)] = priority
    mine_b, other_b = send(p2, qb, 4), send(p2, qb, 0)
    pri[mine_b], pri[other_b] = 4, 0

    held = take_and_die(prefix, [qa, qb], 10)
    assert set(held) == set(pri)
    assert waiting_ids(rclient, prefix, [qa, qb]) == Counter()  # all taken, none restored
    waiting = [send(p2, qa, 0), send(p2, qa, 0)]  # published after: wait behind the restored

    mine = [t for t in pri if t != other_b]
    unknown = [str(uuid.uuid4()), str(uuid.uuid4())]
    got = restore_unacked(rclient, CeleryRedisLayout(prefix, SEP, tuple(STEPS)), mine + unknown)

    assert sorted(j.task_id for j in got.restored) == sorted(mine)  # each once
    assert sorted(got.not_found) == sorted(unknown)
    assert got.unroutable == got.newer == got.left == ()
    for job in got.restored:
        queue = qb if job.task_id == mine_b else qa
        assert job.queue == queue and job.delivery_tag == held[job.task_id]
        assert job.key == key(prefix, queue, pri[job.task_id])
    lists = listed(rclient, prefix, [qa, qb])
    for job in got.restored:  # on that list and no other, flagged redelivered
        for k, msgs in lists.items():
            copies = [m for m in msgs if task_id_of(m) == job.task_id]
            assert len(copies) == (1 if k == job.key else 0), (job, k)
            for m in copies:
                assert m["headers"]["redelivered"] is True
                assert m["properties"]["delivery_info"]["redelivered"] is True
                assert m["properties"]["delivery_tag"] == job.delivery_tag
    # RPUSH like kombu's restore_by_tag: the restored ones are taken next (BRPOP's end),
    # ahead of what was published meanwhile
    base = [task_id_of(m) for m in lists[f"{prefix}{qa}"]]
    assert base[:2] == waiting[::-1] and set(base[2:]) == {t for t in mine if pri[t] < 3}

    # the other task's entry is untouched, in both the hash and the index
    assert unacked_ids(rclient, prefix) == {held[other_b]: other_b}
    assert rclient.zrange(f"{prefix}unacked_index", 0, -1) == [held[other_b].encode()]

    received = drain(prefix, [qa, qb])
    assert Counter(t for t, _ in received) == Counter(mine + waiting)  # each exactly once
    assert all(flag for t, flag in received if t in mine)
    assert not any(flag for t, flag in received if t in waiting)

    again = restore_unacked(rclient, prefix, mine)  # acked by now: nothing to hand back
    assert again.restored == () and sorted(again.not_found) == sorted(mine)
    assert unacked_ids(rclient, prefix) == {held[other_b]: other_b}


def test_exchanges_are_routed_by_their_binding_tables_and_nothing_is_dropped(prefix, rclient):
    """kombu's `_lookup`: a topic exchange's message goes back to every queue its binding
    table routes it to — all of them, as kombu would (the unacked entry does not say which
    queue it was taken from), or only the machine's own queues when `queues` says which. One
    whose binding table is gone kombu would drop: it stays unacked, reported."""
    qa, qb, qc = (f"q{c}-{uuid.uuid4().hex[:6]}" for c in "abc")
    topic = Exchange(f"tx-{uuid.uuid4().hex[:6]}", type="topic")
    direct = Exchange(f"dx-{uuid.uuid4().hex[:6]}", type="direct")
    declared = [Queue(qa, topic, routing_key="jobs.*"), Queue(qb, topic, routing_key="jobs.#"),
                Queue(qc, direct, routing_key="c")]

    def publish() -> dict[str, str]:
        ids = {name: str(uuid.uuid4()) for name in ("topic", "direct")}
        with Connection(REDIS_URL, transport_options=options(prefix)) as conn:
            ch = conn.channel()
            for q in declared:
                q.bind(ch).declare()
            prod = conn.Producer(ch)
            prod.publish({"x": 1}, exchange=topic, routing_key="jobs.gpu", priority=7,
                         headers={"id": ids["topic"], "task": "t"}, correlation_id=ids["topic"])
            prod.publish({"x": 2}, exchange=direct, routing_key="c",
                         headers={"id": ids["direct"], "task": "t"},
                         correlation_id=ids["direct"])
        return ids

    # the machine consumed qa and qc; the copy of the topic message in qb waits for others
    ids = publish()
    held = take_and_die_all(prefix, [qa, qc], 2)
    assert sorted(t for t, _ in held) == sorted(ids.values())
    rclient.delete(f"{prefix}_kombu.binding.{direct.name}")  # its bindings expired
    got = restore_unacked(rclient, prefix, ids.values(), queues=[qa, qc])
    assert [(j.task_id, j.queue, j.key) for j in got.restored] == [
        (ids["topic"], qa, key(prefix, qa, 7))
    ]
    assert [e.task_id for e in got.unroutable] == [ids["direct"]]
    assert list(unacked_ids(rclient, prefix).values()) == [ids["direct"]]  # kept, not lost
    assert waiting_ids(rclient, prefix, [qa, qb, qc]) == Counter({ids["topic"]: 2})
    assert got.not_found == ()
    rclient.delete(f"{prefix}unacked", f"{prefix}unacked_index",
                   *[k for q in (qa, qb, qc) for k in CeleryRedisLayout(prefix).keys(q)])

    # without `queues`: kombu's own restore — back to both qa and qb
    ids = publish()
    held = take_and_die_all(prefix, [qa], 1)
    got = restore_unacked(rclient, prefix, [ids["topic"]])
    assert sorted((j.queue, j.key) for j in got.restored) == sorted(
        [(qa, key(prefix, qa, 7)), (qb, key(prefix, qb, 7))]
    )
    assert waiting_ids(rclient, prefix, [qa, qb]) == Counter({ids["topic"]: 3})


def test_a_push_that_fails_puts_the_entry_back(prefix, rclient):
    q = f"q-{uuid.uuid4().hex[:6]}"
    tid = send(producer(REDIS_URL, prefix), q)
    held = take_and_die(prefix, [q], 1)
    rclient.set(f"{prefix}{q}", "not a list")  # RPUSH fails inside the MULTI
    got = restore_unacked(rclient, prefix, [tid])
    assert got.restored == () and [e.delivery_tag for e in got.unroutable] == [held[tid]]
    assert unacked_ids(rclient, prefix) == {held[tid]: tid}
    assert rclient.zscore(f"{prefix}unacked_index", held[tid]) is not None


def test_entries_delivered_after_the_machines_last_report_stay(prefix, rclient):
    """The same task id delivered to another consumer later (a retry, or kombu's own
    restore) is that consumer's: `delivered_before` leaves it alone."""
    qa = f"q-{uuid.uuid4().hex[:6]}"
    app = producer(REDIS_URL, prefix)
    tid = send(app, qa)
    first = take_and_die(prefix, [qa], 1)
    time.sleep(0.05)
    last_report = time.time()
    time.sleep(0.05)
    send(app, qa, task_id=tid)
    second = take_and_die(prefix, [qa], 1)
    got = restore_unacked(rclient, prefix, [tid], delivered_before=last_report)
    assert [j.delivery_tag for j in got.restored] == [first[tid]]
    assert [e.delivery_tag for e in got.newer] == [second[tid]]
    assert unacked_ids(rclient, prefix) == {second[tid]: tid}


def test_the_hash_is_scanned_in_bounded_steps_and_foreign_entries_stay(private_redis):
    """Default layout (no prefix) on a throwaway server: HSCAN with COUNT, never HGETALL."""
    url = private_redis.url
    r = redis.Redis.from_url(url)
    try:
        q = "celery"
        for i in range(0, 5000, 500):
            r.hset("unacked", mapping={f"foreign-{j}": unacked_entry(q) for j in range(i, i + 500)})
        app = Celery("p", broker=url, set_as_current=False)
        app.conf.broker_transport_options = {"visibility_timeout": 36_000}
        ids = [str(app.send_task("t.work", queue=q).id) for _ in range(3)]
        got: list[Any] = []
        with Connection(url, transport_options={"visibility_timeout": 36_000}) as conn:
            ch = conn.channel()
            ch.qos.restore_at_shutdown = False  # dies holding them
            for _ in ids:
                got.append(ch.basic_get(q, no_ack=False))
        assert r.hlen("unacked") == 5003
        r.config_resetstat()
        res = restore_unacked(r, "", ids, scan_count=500)
        stats = r.info("commandstats")
        assert sorted(j.task_id for j in res.restored) == sorted(ids)
        assert not {"cmdstat_hgetall", "cmdstat_hvals", "cmdstat_hkeys"} & set(stats)
        assert stats["cmdstat_hscan"]["calls"] >= 10
        assert r.hlen("unacked") == 5000 and r.llen(q) == 3
        assert r.zcard("unacked_index") == 0
    finally:
        r.close()


# --------------------------------------------------------------------------- exclusivity


class Round:
    """One round of a race: `n` Celery messages (random priorities) taken by an in-process
    kombu consumer that will never ack them nor restore them itself."""

    def __init__(self, prefix: str, n: int, app: Celery, queues: list[str]) -> None:
        self.prefix, self.queues = prefix, queues
        self.ids = [send(app, random.choice(queues), random.randint(0, 9)) for _ in range(n)]
        self.conn = Connection(REDIS_URL, transport_options=options(prefix))
        self.ch = self.conn.channel()
        self.tags = []
        for q in queues:
            while (m := self.ch.basic_get(q, no_ack=False)) is not None:
                self.tags.append(m.delivery_tag)
        assert len(self.tags) == n

    def check(self, r: redis.Redis, *restorers: Any) -> None:
        """Each message exactly once in the lists, none left unacked; the restorers' reports
        disjoint and complete."""
        assert waiting_ids(r, self.prefix, self.queues) == Counter(self.ids)
        assert unacked_ids(r, self.prefix) == {}
        assert r.zcard(f"{self.prefix}unacked_index") == 0
        tags = [j.delivery_tag for res in restorers for j in res.restored]
        assert len(tags) == len(set(tags))
        r.delete(*[k for q in self.queues for k in CeleryRedisLayout(self.prefix).keys(q)])

    def close(self) -> None:
        self.ch.qos._delivered.clear()  # it "died": its close must not restore or ack
        self.conn.close()


def race(*jobs: Callable[[], Any]) -> list[Any]:
    barrier = threading.Barrier(len(jobs))
    results: list[Any] = [None] * len(jobs)
    errors: list[BaseException] = []

    def run(i: int) -> None:
        try:
            barrier.wait()
            results[i] = jobs[i]()
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(jobs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    return results


@pytest.fixture
def clients() -> Iterator[list[redis.Redis]]:
    made = [redis.Redis.from_url(REDIS_URL) for _ in range(3)]
    yield made
    for c in made:
        c.close()


def test_two_restorers_racing_push_each_message_once(prefix, clients):
    app = producer(REDIS_URL, prefix)
    queues = [f"q1-{uuid.uuid4().hex[:6]}", f"q2-{uuid.uuid4().hex[:6]}"]
    for _ in range(25):
        rnd = Round(prefix, 24, app, queues)
        try:
            a, b = race(
                partial(restore_unacked, clients[0], prefix, rnd.ids, batch=5),
                partial(restore_unacked, clients[1], prefix, rnd.ids[::-1], batch=7),
            )
            assert len(a.restored) + len(b.restored) == len(rnd.ids)
            assert set(a.not_found) | a.task_ids == set(rnd.ids)
            rnd.check(clients[2], a, b)
        finally:
            rnd.close()


def test_a_restore_racing_kombus_shutdown_restore_is_exclusive(prefix, clients):
    """kombu's `restore_by_tag` at a channel's shutdown takes no mutex: only the WATCH keeps
    the two apart."""
    app = producer(REDIS_URL, prefix)
    queues = [f"q-{uuid.uuid4().hex[:6]}"]
    won = Counter[str]()
    for _ in range(25):
        rnd = Round(prefix, 24, app, queues)
        try:
            ours, _ = race(
                partial(restore_unacked, clients[0], prefix, rnd.ids, batch=3),
                rnd.ch.qos.restore_unacked,  # kombu: every delivered tag
            )
            won.update(ours=len(ours.restored), kombu=len(rnd.ids) - len(ours.restored))
            rnd.check(clients[2], ours)
        finally:
            rnd.close()
    assert sum(won.values()) == 25 * 24


def test_a_restore_racing_kombus_visibility_restore_is_exclusive(prefix, clients):
    app = producer(REDIS_URL, prefix)
    queues = [f"q-{uuid.uuid4().hex[:6]}"]
    for _ in range(25):
        rnd = Round(prefix, 24, app, queues)
        rnd.ch.visibility_timeout = 0  # every unacked message is due for kombu's restore
        rnd.ch.qos.__dict__.pop("visibility_timeout", None)
        try:
            ours, _ = race(
                partial(restore_unacked, clients[0], prefix, rnd.ids, batch=4),
                partial(rnd.ch.qos.restore_visible, num=100, interval=1),
            )
            rnd.check(clients[2], ours)
        finally:
            rnd.close()


def test_kombus_mutex_and_ours_are_the_same(prefix, rclient):
    app = producer(REDIS_URL, prefix)
    queues = [f"q-{uuid.uuid4().hex[:6]}"]
    rnd = Round(prefix, 5, app, queues)
    rnd.ch.visibility_timeout = 0
    rnd.ch.qos.__dict__.pop("visibility_timeout", None)
    try:
        # kombu holds it (its Mutex on its prefixed client): we wait, then give up, untouched
        with Mutex(rnd.ch.client, rnd.ch.unacked_mutex_key, 300):
            t0 = time.monotonic()
            with pytest.raises(UnackedMutexHeld):
                restore_unacked(rclient, prefix, rnd.ids, mutex_timeout=0.3)
            assert time.monotonic() - t0 >= 0.2  # it waited (redis-py stops a try early)
        assert set(unacked_ids(rclient, prefix).values()) == set(rnd.ids)
        assert waiting_ids(rclient, prefix, queues) == Counter()

        # we hold it: kombu's visibility-timeout restore skips (MutexHeld), then runs after
        with unacked_mutex(rclient, CeleryRedisLayout(prefix)):
            rnd.ch.qos.restore_visible(num=100, interval=1)
            assert waiting_ids(rclient, prefix, queues) == Counter()
        rnd.ch.qos.restore_visible(num=100, interval=1)
        rnd.check(rclient)
    finally:
        rnd.close()


def test_nothing_asked_nothing_touched(rclient, prefix):
    assert restore_unacked(rclient, prefix, []).restored == ()
    assert rclient.exists(f"{prefix}unacked_mutex") == 0


RESTORER = r"""
import json, sys
import redis
from autoscaler.metrics.handback import restore_unacked
prefix, ids, url = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3]
print("GO", flush=True)
# the mutex a dead restorer leaves behind expires by itself (kombu's own lock): short here
restore_unacked(redis.Redis.from_url(url), prefix, ids, batch=1, mutex_expire=1.0)
print("DONE", flush=True)
"""


def test_a_restorer_killed_mid_hand_back_leaves_nothing_restored_twice_or_lost(prefix, clients):
    """Chaos: the reconciler's process dies (SIGKILL) at a random point of its restore; the
    next round restores the rest. Every message ends once in its list, none left unacked."""
    app = producer(REDIS_URL, prefix)
    queues = [f"qk-{uuid.uuid4().hex[:6]}"]
    rng = random.Random(7)
    cut = 0
    for _ in range(8):
        rnd = Round(prefix, 30, app, queues)
        try:
            proc = subprocess.Popen(
                [sys.executable, "-c", RESTORER, prefix, json.dumps(rnd.ids), REDIS_URL],
                stdout=subprocess.PIPE, text=True, start_new_session=True,
            )  # fmt: skip
            assert proc.stdout is not None and proc.stdout.readline().startswith("GO")
            time.sleep(rng.uniform(0.0, 0.15))
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
            left = len(unacked_ids(clients[2], prefix))
            cut += 0 < left < len(rnd.ids)
            after = restore_unacked(clients[0], prefix, rnd.ids, mutex_timeout=5.0)
            assert len(after.restored) == left
            rnd.check(clients[2], after)
        finally:
            rnd.close()
    assert cut, "no round was cut mid-restore: the kill came too early or too late every time"
