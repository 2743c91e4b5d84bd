"""The read cut into pieces (`brokers.redis.redis_pieces`): every server call within its
budget, the numbers a plain-Python model of the spec computes from the same keys, and no job
counted twice while jobs move.

The counts per call come from MONITOR on a throwaway server (the commands a script runs are
shown after its EVALSHA): never from wall time."""

from __future__ import annotations

import json
import socket
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any, NamedTuple

import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kombu import Connection

from autoscaler.brokers.base import PUBLISHED_AT_HEADER
from autoscaler.brokers.redis.celery_redis import SCAN_BUDGET, CeleryRedisLayout, CeleryRedisReader
from autoscaler.brokers.redis.redis_pieces import PIECE_BUDGET, PIECES_LUA, SEARCH_RADIUS
from tests.brokers.helpers import envelope


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    """A throwaway redis-server of this module's own (no other client's commands in MONITOR)."""
    yield from _server()


def _server(*extra: str) -> Iterator[str]:
    port = free_port()
    proc = subprocess.Popen(
        [
            "redis-server",
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            *extra,
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"redis://127.0.0.1:{port}/0"
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                redis.Redis.from_url(url).ping()
                break
            except redis.RedisError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.02)
        yield url
    finally:
        proc.kill()
        proc.wait(10)


@pytest.fixture
def r(server) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(server)
    client.flushall()
    yield client
    client.close()


def deliver(r: redis.Redis, lay: CeleryRedisLayout, queue: str, raw: bytes) -> str:
    """What kombu's QoS.append writes for a delivered message (index and hash in one MULTI)."""
    tag = json.loads(raw)["properties"]["delivery_tag"]
    pipe = r.pipeline(transaction=True)
    pipe.zadd(lay.unacked_index, {tag: time.time()})
    pipe.hset(lay.unacked, tag, json.dumps([json.loads(raw), "", queue]))
    pipe.execute()
    return str(tag)


def restore(r: redis.Redis, lay: CeleryRedisLayout, tag: str, key: str) -> None:
    """kombu's restore_by_tag (leftmost=False): off the index and the hash, back at the head,
    marked redelivered, in one MULTI."""
    entry = json.loads(r.hget(lay.unacked, tag) or b"null")
    msg = entry[0]
    msg["headers"]["redelivered"] = True
    pipe = r.pipeline(transaction=True)
    pipe.zrem(lay.unacked_index, tag)
    pipe.hdel(lay.unacked, tag)
    pipe.rpush(key, json.dumps(msg))
    pipe.execute()


class Clock:
    def __init__(self, now: datetime) -> None:
        self.now = now

    def __call__(self) -> datetime:
        return self.now


class Stepping(CeleryRedisReader):
    """Sends each command of a round on its own and calls `hook(commands done, round, commands
    done in this round)` after each: other clients' commands land exactly between two of ours.

    The script is loaded first: on a fresh server the read's first round would meet NOSCRIPT
    and go again, and a hook meant for "the round after the counting one" would run inside the
    counting round itself (the failure CI saw when this test ran first on its worker)."""

    def __init__(self, *args: Any, hook: Callable[[int, int, int], None], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._client.script_load(PIECES_LUA)
        self.hook = hook
        self.done = 0
        self.round_no = 0

    def _round(self, calls):  # type: ignore[no-untyped-def]
        self.round_no += 1
        for number, call in enumerate(calls, 1):
            yield from super()._round([call])
            self.done += 1
            self.hook(self.done, self.round_no, number)


# --------------------------------------------------------------------------- the model


class Job(NamedTuple):
    """One message as the spec sees it: its publish stamp (None when unstamped or not an
    envelope at all) and its due time (Celery's `eta` header, epoch seconds; None: due now)."""

    stamp: float | None
    eta: float | None

    def scheduled(self, now: float) -> bool:
        return self.eta is not None and self.eta > now


def _epoch(value: Any) -> float | None:
    """Celery's `eta` header (ISO 8601, naive meaning UTC) in epoch seconds."""
    if not isinstance(value, str) or not value:
        return None
    try:
        when = datetime.fromisoformat(value)
    except ValueError:
        return None
    return (when if when.tzinfo else when.replace(tzinfo=UTC)).timestamp()


def job(env: Any) -> Job:
    """The stamp and due time of a decoded envelope (anything else: unstamped, due now)."""
    headers = env.get("headers") if isinstance(env, dict) else None
    if not isinstance(headers, dict):
        return Job(None, None)
    stamp = headers.get(PUBLISHED_AT_HEADER)
    if isinstance(stamp, bool) or not isinstance(stamp, int | float | str):
        stamp = None
    try:
        published = None if stamp is None else float(stamp)
    except ValueError:
        published = None
    return Job(published, _epoch(headers.get("eta")))


def decoded(raw: bytes | str) -> Any:
    try:
        return json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        return None


def longest_wait(head: list[Job], now: float) -> float | None:
    """The longest wait among the due jobs of a list's oldest messages (`head`, oldest first),
    or None when none of them is due. A job waits since it was published, or since its ETA if
    that is later. Unstamped, it was published before it was first seen (here: now, on a read
    that is the first to see it) and before every later job of the head that carries a stamp
    (FIFO): the earliest of those times bounds its publish time."""
    waits = []
    for i, it in enumerate(head):
        if it.scheduled(now):
            continue
        published = it.stamp
        if published is None:
            published = min(
                [now, *(later.stamp for later in head[i + 1 :] if later.stamp is not None)]
            )
        since = published if it.eta is None else max(published, it.eta)
        waits.append(max(0.0, now - since))
    return max(waits, default=None)


def delivered(client: redis.Redis, lay: CeleryRedisLayout) -> dict[str, list[Job]]:
    """The jobs kombu's unacked hash holds, per queue: every entry in the hash whose tag is in
    the index (the whole hash when there is no index). Only the anonymous exchange is used
    here: it routes by queue name, i.e. the entry's routing key."""
    index = set(client.zrange(lay.unacked_index, 0, -1))
    out: dict[str, list[Job]] = {}
    for tag, value in client.hgetall(lay.unacked).items():
        if index and tag not in index:
            continue
        envelope_, exchange, routing_key = json.loads(value)[:3]
        assert exchange == ""
        out.setdefault(routing_key, []).append(job(envelope_))
    return out


def model(
    client: redis.Redis,
    lay: CeleryRedisLayout,
    queues: list[str],
    now: float,
    *,
    window: int,
    scan_limit: int,
    scan_budget: int,
) -> dict[str, tuple[Any, ...] | None]:
    """What a first read at `now` must report per queue - (pending, scheduled, next due time,
    in flight, scheduled held, oldest age), None for a queue with a key of another type - from
    the spec in `celery_redis`'s docstring, with plain commands (TYPE, LRANGE of each priority
    key, HGETALL and ZRANGE of the unacked hash and index) while nothing moves:

    - each key's oldest messages are examined for ETAs: its first `window`, then up to
      `scan_limit` while the read's `scan_budget` lasts (keys in the order read: queue by
      queue, highest priority first); a message with a future ETA among them is scheduled,
      every other one pending, and the earliest such ETA is the next due time;
    - unacked entries: due ones are in flight, the others scheduled (and held), their ETAs
      next due times too;
    - the oldest age is the longest wait among the due jobs of each key's first `window`
      messages (`longest_wait`; the reader looks no further: `redis_pieces`'s "due stamped
      messages seen at the head").

    Everything here is compared exactly. The reader walks a head only up to its first due job
    without an ETA (every later job waits less, when stamps grow along the list - equal stamps
    in the worlds here) and takes unstamped ages from the first sightings it stores: on a first
    read at a fixed clock (and a second one with the same clock) every sighting is `now`,
    which `longest_wait` assumes. Later reads, whose sightings lie in the past, are left to the
    first-sighting tests (`test_celery_redis`, `test_head_sightings`)."""
    assert scan_limit >= window  # (the reader examines its window whatever the scan limit)
    held = delivered(client, lay)
    left = scan_budget
    out: dict[str, tuple[Any, ...] | None] = {}
    for q in queues:
        pending = scheduled = 0
        etas: list[float] = []
        ages: list[float] = []
        failed = False
        for key in lay.keys(q):
            kind = client.type(key)
            if kind != b"list":
                failed = failed or kind != b"none"
                continue
            jobs = [job(decoded(raw)) for raw in reversed(client.lrange(key, 0, -1))]
            examined = min(len(jobs), window)
            if len(jobs) > window:
                extra = min(min(len(jobs), scan_limit) - window, left)
                examined, left = examined + extra, left - extra
            future = [j.eta for j in jobs[:examined] if j.scheduled(now) and j.eta is not None]
            scheduled += len(future)
            pending += len(jobs) - len(future)
            etas += future
            wait = longest_wait(jobs[:window], now)
            if wait is not None:
                ages.append(wait)
        if failed:
            out[q] = None
            continue
        jobs = held.get(q, [])
        later = [j.eta for j in jobs if j.scheduled(now) and j.eta is not None]
        out[q] = (
            pending,
            scheduled + len(later),
            min(etas + later, default=None),
            len(jobs) - len(later),
            len(later),
            max(ages, default=None),
        )
    return out


def summary(got: dict[str, Any]) -> dict[str, tuple[Any, ...] | None]:
    return {
        q: None
        if m.stale
        else (
            m.pending,
            m.scheduled,
            m.next_due_at,
            m.in_flight,
            m.scheduled_held,
            m.oldest_pending_age,
        )
        for q, m in got.items()
    }


def close(a: tuple[Any, ...] | None, b: tuple[Any, ...] | None) -> bool:
    if a is None or b is None:
        return a is b
    return all(
        x == y or (isinstance(x, float) and isinstance(y, float) and abs(x - y) < 1e-3)
        for x, y in zip(a, b, strict=True)
    )


ETAS = st.one_of(st.none(), st.sampled_from([-300.0, -5.0, 60.0, 3600.0]))
MESSAGE = st.tuples(st.booleans(), ETAS)  # stamped, ETA offset from now
KEY = st.one_of(
    st.lists(MESSAGE, max_size=12),
    # a deep list, built from one repeated pattern (cheap to generate)
    st.tuples(st.integers(60, 400), st.lists(MESSAGE, min_size=1, max_size=4)).map(
        lambda t: [t[1][i % len(t[1])] for i in range(t[0])]
    ),
)


@settings(
    max_examples=30,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    steps=st.sampled_from([(0, 3, 6, 9), (0,), (0, 5), (2, 7)]),
    sep=st.sampled_from(["\x06\x16", ":"]),
    lists=st.dictionaries(
        st.tuples(st.sampled_from("abcdef"), st.integers(0, 3)), KEY, max_size=10
    ),
    unacked=st.lists(st.tuples(st.sampled_from("abcdefg"), ETAS), max_size=8),
    noise=st.sampled_from([None, b"not json", b'{"headers": 3}']),
    foreign=st.booleans(),
    budget=st.sampled_from([300, 450, 900, 5000]),
    window=st.sampled_from([3, 8, 64]),
    limit=st.sampled_from([64, 150, 10_000]),
    scan_budget=st.sampled_from([SCAN_BUDGET, 500, 0]),
)
def test_pieces_read_what_the_model_says(
    r, server, steps, sep, lists, unacked, noise, foreign, budget, window, limit, scan_budget
):
    """Random queues, priorities, stamps, ETAs, deep lists, unacked jobs and a key of the wrong
    type: pending, scheduled, next due time, in flight, held and oldest age are what the model
    of the spec computes from plain reads of the same keys, whatever the piece budget (down to
    pieces of a few messages, lists continued over several rounds) and the scan budgets."""
    lay = CeleryRedisLayout(
        global_keyprefix=f"p{uuid.uuid4().hex[:6]}:", sep=sep, priority_steps=steps
    )
    now = datetime.now(UTC)
    ts = now.timestamp()
    pipe = r.pipeline(transaction=False)
    for (q, step), msgs in lists.items():
        key = lay.keys(q)[step % len(lay.steps)]
        for stamped, eta in msgs:
            pipe.lpush(
                key,
                envelope(
                    q,
                    stamp=ts - 40 if stamped else None,
                    eta=None if eta is None else now + timedelta(seconds=eta),
                ),
            )
    if noise is not None:
        pipe.lpush(lay.keys("c")[0], noise)
    if foreign:  # another writer's set named like one of g's priority keys
        pipe.sadd(lay.keys("g")[-1], "x")
    pipe.execute()
    for q, eta in unacked:
        deliver(r, lay, q, envelope(q, eta=None if eta is None else now + timedelta(seconds=eta)))
    queues = list("abcdefg")
    want = model(r, lay, queues, ts, window=window, scan_limit=limit, scan_budget=scan_budget)
    reader = CeleryRedisReader(
        server,
        layout=lay,
        clock=Clock(now),
        piece_budget=budget,
        window=window,
        scan_limit=limit,
        scan_budget=scan_budget,
    )
    got = summary(reader.read(queues))
    assert all(close(got[q], want[q]) for q in queues), (got, want)
    again = summary(reader.read(queues))  # a second read (cached heads, known windows)
    assert all(close(again[q], want[q]) for q in queues), (again, want)


# --------------------------------------------------------------------------- budget per call


def monitored(url: str, action: Callable[[], object]) -> list[tuple[str, list[str]]]:
    """(client type, command words) of every command the server ran during `action`."""
    seen: list[tuple[str, list[str]]] = []
    ready = threading.Event()
    marker = f"end-{uuid.uuid4().hex}"

    def listen() -> None:
        client = redis.Redis.from_url(url)
        with client.monitor() as m:
            ready.set()
            for cmd in m.listen():
                # redis-py joins the arguments with spaces (none of ours has one)
                words = cmd["command"].split(" ")
                if words and words[0].upper() == "ECHO" and words[-1] == marker:
                    break
                seen.append((cmd.get("client_type", ""), words))
        client.close()

    t = threading.Thread(target=listen, daemon=True)
    t.start()
    ready.wait(5)
    time.sleep(0.2)
    action()
    redis.Redis.from_url(url).echo(marker)
    t.join(30)
    return seen


def units_per_call(
    seen: list[tuple[str, list[str]]], lengths: dict[str, int]
) -> list[tuple[str, int]]:
    """Units each script call spent, counted from the commands it ran (every command: 1; an
    LRANGE or ZRANGE: 1 more per entry it returned, from the keys' sizes - they do not change
    here; an HMGET: 1 more per field) and the COUNT of each SCAN-style page: (command,
    units)."""
    calls: list[tuple[str, int]] = []
    for client, words in seen:
        name = words[0].upper() if words else ""
        if client != "lua":
            if name == "EVALSHA":
                calls.append((f"EVALSHA {words[3]}", 0))
            elif name in ("HSCAN", "ZSCAN", "SSCAN"):
                calls.append((name, int(words[words.index("COUNT") + 1])))
            elif name not in ("MONITOR", "ECHO", "PING", "CLIENT", "HELLO", "SELECT"):
                calls.append((name, 1))
            continue
        units = 1
        if name in ("LRANGE", "ZRANGE"):
            n = lengths.get(_unescape(words[1]), 0)
            start, stop = int(words[2]), int(words[3])
            start, stop = (
                max(n + start if start < 0 else start, 0),
                min(n + stop if stop < 0 else stop, n - 1),
            )
            units += max(0, stop - start + 1)
        elif name == "HMGET":
            units += len(words) - 2
        kind, spent = calls[-1]
        calls[-1] = (kind, spent + units)
    return calls


def _unescape(word: str) -> str:
    """A key as MONITOR shows it (non-printable bytes as \\xNN) back to the key."""
    return word.encode("latin-1").decode("unicode_escape")


def lengths_of(r: redis.Redis, prefix: str) -> dict[str, int]:
    sizes = {b"list": r.llen, b"zset": r.zcard}
    return {
        k.decode(): int(sizes[kind](k))
        for k in r.scan_iter(match=f"{prefix}*", count=1000)
        if (kind := r.type(k)) in sizes
    }


def fill(r: redis.Redis, lay: CeleryRedisLayout, queues: int, deep: int) -> None:
    now = datetime.now(UTC)
    pipe = r.pipeline(transaction=False)
    for i in range(queues):
        q = f"q{i}"
        keys = lay.keys(q)
        for _ in range(i % 6):
            pipe.lpush(keys[0], envelope(q, stamp=time.time() if i % 2 else None))
        if i % 7 == 0:
            pipe.lpush(keys[2], envelope(q, eta=now + timedelta(minutes=5)))
    for start in range(0, deep, 500):
        pipe.lpush(
            lay.keys("q1")[0],
            *[
                envelope("q1", stamp=time.time(), eta=now + timedelta(hours=1))
                for _ in range(min(500, deep - start))
            ],
        )
    pipe.execute()
    for i in range(0, queues, 5):
        deliver(r, lay, f"q{i}", envelope(f"q{i}"))


@pytest.mark.parametrize("budget", [300, 1000])
def test_every_server_call_stays_within_its_budget(r, server, budget):
    """600 queues (2,400 priority keys) and a list of 3,000 ETA jobs: every script call looks
    at no more keys and messages than its budget (counted from the commands it runs), every
    SCAN page asks for fewer, and the read is still a few round trips."""
    lay = CeleryRedisLayout(global_keyprefix="b:")
    fill(r, lay, 600, 3000)
    reader = CeleryRedisReader(server, layout=lay, piece_budget=budget)
    reader.read(["q0"])  # the script loaded, the connection open
    queues = [f"q{i}" for i in range(600)]
    got: dict[str, Any] = {}
    seen = monitored(server, lambda: got.update(reader.read(queues)))
    calls = units_per_call(seen, lengths_of(r, "b:"))
    scripts = [u for kind, u in calls if kind.startswith("EVALSHA")]
    assert len(scripts) > 600 * 4 / budget  # really cut into pieces
    assert max(scripts) <= budget, sorted(scripts)[-5:]
    assert all(u <= budget for kind, u in calls if not kind.startswith("EVALSHA"))
    assert {kind for kind, _ in calls} == {"EVALSHA q", "EVALSHA c", "EVALSHA u"}
    # one round for every queue, the unacked index and hash; the deep list continues in one more
    assert reader.rounds == 2
    assert got["q1"].scheduled == 3000 and got["q1"].pending == 1
    assert sum(m.pending + m.scheduled + m.in_flight for m in got.values()) == (
        sum(i % 6 for i in range(600)) + len(range(0, 600, 7)) + 3000 + len(range(0, 600, 5))
    )


def test_a_deep_scan_is_bounded_by_the_budget_not_the_list(r, server):
    """ETAs deep in a list are found in pieces: the longest call does not grow with the list."""
    lay = CeleryRedisLayout(global_keyprefix="d:")
    fill(r, lay, 1, 9000)
    reader = CeleryRedisReader(server, layout=lay, piece_budget=500)
    reader.read(["q1"])
    seen = monitored(server, lambda: reader.read(["q1"]))
    scripts = [
        u for kind, u in units_per_call(seen, lengths_of(r, "d:")) if kind.startswith("EVALSHA")
    ]
    assert max(scripts) <= 500 and len(scripts) >= 9000 // 500


# --------------------------------------------------------------------------- jobs moving


def layout_with_jobs(r: redis.Redis, queues: int) -> tuple[CeleryRedisLayout, list[str], int]:
    """Jobs in two priority keys of each queue and a few delivered (kombu's unacked): the
    layout, the queue names and the number of jobs."""
    lay = CeleryRedisLayout(global_keyprefix=f"m{uuid.uuid4().hex[:6]}:")
    names = [f"q{i}" for i in range(queues)]
    total = 0
    for i, q in enumerate(names):
        keys = lay.keys(q)
        msgs = [envelope(q, stamp=time.time()) for _ in range(1 + i % 3)]
        r.lpush(keys[0], *msgs)
        r.lpush(keys[1], envelope(q))
        total += len(msgs) + 1
        if i % 3 == 0:
            deliver(r, lay, q, envelope(q))
            total += 1
    return lay, names, total


def counted(got: dict[str, Any]) -> int:
    return sum(m.pending + m.scheduled + m.in_flight for m in got.values())


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    move=st.sampled_from(["deliver", "deliver-gap", "restore", "restore-tail"]),
    at=st.integers(1, 5),
    gap=st.integers(0, 10),
    queue=st.integers(0, 89),
    budget=st.sampled_from([300, 700]),
)
def test_a_job_moving_between_pieces_is_never_counted_twice(
    r, server, move, at, gap, queue, budget
):
    """A worker takes a job (BRPOP, then kombu's unacked write - `gap` of our commands later)
    or kombu restores one to its list (head or tail), between any two commands of the read:
    the job counts once, or - taken before its list was counted and delivered after the
    index's first scan - not at all, never twice."""
    lay, names, total = layout_with_jobs(r, 90)
    q = names[queue]
    key = lay.keys(q)[0]
    held = [t.decode() for t in r.zrange(lay.unacked_index, 0, -1)]
    popped: list[bytes] = []

    def hook(done: int, _round: int, _n: int) -> None:
        if move.startswith("deliver"):
            if done == at:
                popped.append(r.rpop(key) or b"")
            if done == at + (gap if move == "deliver-gap" else 0) and popped and popped[0]:
                deliver(r, lay, q, popped[0])
        elif done == at and held:
            tag = held[queue % len(held)]
            entry = json.loads(r.hget(lay.unacked, tag) or b"null")
            if entry is not None:
                target = lay.keys(entry[2])[0]
                if move == "restore":
                    restore(r, lay, tag, target)
                else:  # kombu's visibility-timeout restore pushes at the tail
                    pipe = r.pipeline(transaction=True)
                    pipe.zrem(lay.unacked_index, tag)
                    pipe.hdel(lay.unacked, tag)
                    pipe.lpush(target, json.dumps(entry[0]))
                    pipe.execute()

    reader = Stepping(server, layout=lay, piece_budget=budget, hook=hook)
    got = reader.read(names)
    # the first view, the pieces (2 at 700, 3 at 300), the second view: the move happened
    assert reader.done >= min(at, 4)
    assert total - 1 <= counted(got) <= total
    flagged = sum(m.delivered_during_read for m in got.values())
    assert flagged == got[q].delivered_during_read <= 1  # only the moved job, on its queue
    delivered_in_read = (
        move.startswith("deliver")
        and popped
        and popped[0]
        and (at + (gap if move == "deliver-gap" else 0) < reader.done)
    )
    if delivered_in_read and counted(got) == total - 1:
        assert flagged == 1  # in no count: the delivery during the read says so
    assert counted(got) + flagged <= total + 1
    if (
        move == "deliver-gap"
        and popped
        and popped[0]
        and r.hget(lay.unacked, json.loads(popped[0])["properties"]["delivery_tag"]) is None
    ):
        deliver(r, lay, q, popped[0])  # the worker's unacked write, after the read
    after = CeleryRedisReader(server, layout=lay).read(names)  # nothing moves now: all of them
    assert counted(after) == total


def test_kombus_own_delivery_between_any_two_commands_counts_the_job_at_most_once(r, server):
    """The same with kombu itself taking the job (basic_get: its RPOP and its unacked write)
    after each command of the read in turn."""
    lay, names, total = layout_with_jobs(r, 40)
    n_calls = len(list(_calls(server, lay, names)))
    for at in range(1, n_calls + 1):
        conn = Connection(server, transport_options={"global_keyprefix": lay.global_keyprefix})
        taken: list[Any] = []

        def hook(
            done: int,
            _round: int,
            _n: int,
            at: int = at,
            conn: Connection = conn,
            taken: list[Any] = taken,
        ) -> None:
            if done == at:
                taken.append(conn.channel().basic_get("q5", no_ack=False))

        try:
            got = Stepping(server, layout=lay, hook=hook, piece_budget=300).read(names)
            assert taken and taken[0] is not None
            assert total - 1 <= counted(got) <= total
            taken[0].reject(requeue=True)  # back for the next turn (kombu: to the list's tail)
        finally:
            conn.release()


def _calls(server: str, lay: CeleryRedisLayout, names: list[str]) -> Iterator[int]:
    counter: list[int] = []
    Stepping(
        server, layout=lay, piece_budget=300, hook=lambda done, _r, _n: counter.append(done)
    ).read(names)
    yield from counter


def test_a_deep_list_moving_between_rounds_is_classified_once(r, server):
    """Workers pop and kombu restores at a deep list's head between the rounds of its ETA scan:
    the scan goes on behind the last message it examined, so every job is scheduled once, and
    scheduled + pending is the depth the first round counted."""
    lay = CeleryRedisLayout(global_keyprefix=f"s{uuid.uuid4().hex[:6]}:")
    key = lay.keys("deep")[0]
    now = datetime.now(UTC)
    r.lpush(
        key,
        *[envelope("deep", stamp=time.time(), eta=now + timedelta(hours=1)) for _ in range(2000)],
    )
    for moves in ((3, 0), (0, 5), (10, 4), (SEARCH_RADIUS - 1, 0)):

        def hook(_done: int, round_no: int, n: int, moves: tuple[int, int] = moves) -> None:
            if n == 1 and round_no == 2:  # the first round and one piece of the next have run
                popped, pushed = moves
                for _ in range(popped):
                    r.rpop(key)
                for _ in range(pushed):
                    r.rpush(key, envelope("deep", stamp=time.time(), eta=now + timedelta(hours=1)))

        reader = Stepping(server, layout=lay, piece_budget=300, hook=hook, clock=Clock(now))
        got = reader.read(["deep"])["deep"]
        depth = r.llen(key) + moves[0] - moves[1]  # as the first round counted it
        assert (got.pending, got.scheduled) == (0, depth), moves
        assert reader.rounds >= 2


def test_a_lost_anchor_scans_the_list_again_and_never_overcounts(r, server):
    """More jobs popped between two rounds than the anchor search reaches: the list is scanned
    again from its head; scheduled never exceeds the depth counted."""
    lay = CeleryRedisLayout(global_keyprefix=f"l{uuid.uuid4().hex[:6]}:")
    key = lay.keys("deep")[0]
    now = datetime.now(UTC)
    r.lpush(
        key,
        *[envelope("deep", stamp=time.time(), eta=now + timedelta(hours=1)) for _ in range(1500)],
    )

    def hook(_done: int, round_no: int, n: int) -> None:
        if n == 1 and round_no == 2:
            for _ in range(SEARCH_RADIUS * 3):
                r.rpop(key)

    got = Stepping(server, layout=lay, piece_budget=300, hook=hook, clock=Clock(now)).read(
        ["deep"]
    )["deep"]
    assert got.pending + got.scheduled == 1500  # the depth counted in the first round
    assert got.pending >= 0 and got.scheduled <= 1500


# --------------------------------------------------------------------------- fallbacks


def test_a_big_unacked_index_is_read_in_slices_in_one_round(r, server):
    """3,000 delivered jobs: the index and their values come in slices of the budget. The
    first read learns the size (its first pass goes again behind the rest of the index); from
    then on all slices go in the one round trip, before and after the lists."""
    lay = CeleryRedisLayout(global_keyprefix=f"u{uuid.uuid4().hex[:6]}:")
    r.lpush(lay.keys("a")[0], envelope("a"))
    for i in range(3000):
        deliver(r, lay, "a" if i % 2 else "b", envelope("a" if i % 2 else "b"))
    reader = CeleryRedisReader(server, layout=lay, piece_budget=300)
    rounds = []
    for _ in range(3):
        got = reader.read(["a", "b"])
        assert (got["a"].pending, got["a"].in_flight, got["b"].in_flight) == (1, 1500, 1500)
        rounds.append(reader.rounds)
    assert rounds[0] > 1 and rounds[1:] == [1, 1]
    for _ in range(1000):  # grown past the slices sent: more of them, the pass again
        deliver(r, lay, "b", envelope("b"))
    got = reader.read(["a", "b"])
    assert (got["a"].in_flight, got["b"].in_flight, reader.rounds) == (1500, 2500, 2)


def test_a_hash_without_kombus_index_is_counted_as_read(r, server):
    lay = CeleryRedisLayout(global_keyprefix=f"h{uuid.uuid4().hex[:6]}:")
    r.hset(lay.unacked, "tag", json.dumps([json.loads(envelope("a")), "", "a"]))
    assert CeleryRedisReader(server, layout=lay).read(["a"])["a"].in_flight == 1
    deliver(r, lay, "a", envelope("a"))  # once kombu's index exists, only indexed jobs count
    assert CeleryRedisReader(server, layout=lay).read(["a"])["a"].in_flight == 1


def test_scripting_refused_falls_back_to_the_pipeline_read():
    for url in _server("--rename-command", "EVALSHA", "", "--rename-command", "EVAL", ""):
        client = redis.Redis.from_url(url)
        client.lpush("q", envelope("q", stamp=time.time() - 10))
        deliver(client, CeleryRedisLayout(), "q", envelope("q"))
        reader = CeleryRedisReader(url)
        got = reader.read(["q", "other"])
        assert reader.mode == "pipeline"
        assert (got["q"].pending, got["q"].in_flight, got["other"].pending) == (1, 1, 0)
        assert got["q"].oldest_pending_age is not None and got["q"].oldest_pending_age >= 9


def test_the_script_flushed_between_rounds_is_loaded_again(r, server):
    lay = CeleryRedisLayout(global_keyprefix=f"f{uuid.uuid4().hex[:6]}:")
    now = datetime.now(UTC)
    r.lpush(lay.keys("q")[0], *[envelope("q", eta=now + timedelta(hours=1)) for _ in range(900)])

    def hook(_done: int, round_no: int, n: int) -> None:
        if n == 1 and round_no == 2:
            r.script_flush()

    got = Stepping(server, layout=lay, piece_budget=300, hook=hook, clock=Clock(now)).read(["q"])[
        "q"
    ]
    assert (got.pending, got.scheduled) == (0, 900)


def test_the_setting_and_the_reader_agree_on_the_budget():
    from autoscaler.brokers.redis.redis_pieces import MAX_PIECE_BUDGET, MIN_PIECE_BUDGET
    from autoscaler.config.metrics_sources import CelerySource

    field = CelerySource.model_fields["piece_budget"]
    assert field.default == PIECE_BUDGET
    bounds = {type(m).__name__: m for m in field.metadata}
    assert bounds["Ge"].ge == MIN_PIECE_BUDGET and bounds["Le"].le == MAX_PIECE_BUDGET
    assert MIN_PIECE_BUDGET >= 5 + 4 * SEARCH_RADIUS  # a piece's first task can always search
    reader = CeleryRedisReader("redis://127.0.0.1:1/0", piece_budget=10)
    assert reader.piece_budget == MIN_PIECE_BUDGET


def test_the_configured_piece_budget_reaches_the_reader():
    """A queue's `metrics:` block with `piece_budget: 700` (not the default): the reader the
    registry builds for it - inside the fallback the tick uses - works in pieces of 700."""
    from autoscaler.brokers.registry import build_source
    from autoscaler.config.metrics_sources import CelerySource
    from autoscaler.config.models import Queue

    queue = Queue.model_validate(
        {
            "metrics": {
                "source": "celery",
                "url": "redis://127.0.0.1:1/0",
                "piece_budget": 700,
            }
        }
    )
    assert isinstance(queue.metrics, CelerySource)
    assert queue.metrics.piece_budget == 700 != PIECE_BUDGET
    source = build_source(queue.metrics)
    try:
        assert isinstance(source.reader, CeleryRedisReader)
        assert source.reader.piece_budget == 700
    finally:
        source.reader.close()
