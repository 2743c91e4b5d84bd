"""Hand a gone machine's Celery jobs back to their queues on Redis, as kombu itself would.

kombu's Redis transport emulates acks: each delivered message stays in the `{prefix}unacked`
hash (delivery tag -> JSON `[message, exchange, routing_key]`) and the `{prefix}unacked_index`
sorted set (delivery tag -> delivery time, the consumer's clock) until the consumer acks it. A
consumer that dies without acking leaves it there until some consumer's `restore_visible`
brings it back after `visibility_timeout` (an hour by default). `restore_unacked` does it at
once for the task ids a machine last reported, exactly as kombu's `QoS.restore_by_tag` and
`Channel._do_restore_message` do (kombu 5.7):

- under kombu's own mutex (`{prefix}unacked_mutex`, a redis-py `Lock`: SET NX PX with a token),
  so kombu's `restore_visible` and we exclude each other;
- per message (kombu takes one at a time, we a batch the same way, HMGET for HGET): WATCH the
  unacked hash, HGET the entry, then in one MULTI: ZREM from the index, HDEL from the hash,
  and RPUSH the message (its `redelivered` flags set) onto each queue the exchange routes it to,
  on the list of its priority step (kombu's `_q_for_pri`: the step is the largest of
  `priority_steps` not above the message's priority, a non-zero step appends `sep + step`).
  RPUSH puts it where consumers' BRPOP takes next, as `restore_by_tag` does. An entry removed
  by anyone else (an ack, kombu's own restore, another restorer) between the WATCH and the
  EXEC aborts the EXEC: it is read again and is gone, so of any number of restorers exactly
  one pushes each message, and none is removed without its push.

The hash is read with HSCAN (bounded COUNT), never HGETALL; keys are those of
`CeleryRedisLayout` (`global_keyprefix`, `sep`, `priority_steps`). A job is never dropped:
an entry whose exchange routes nowhere (kombu would drop it: no dead-letter queue) is left in
the hash and reported; so is one still there when contention or the mutex's lifetime stop us.
"""

from __future__ import annotations

import base64
import binascii
import json
import logging
import time
from bisect import bisect
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, NamedTuple, cast

import redis
from kombu.utils.json import dumps as _kombu_dumps

from autoscaler.metrics.celery_redis import (
    Binding,
    CeleryRedisLayout,
    _topic_match,
    parse_bindings,
)

log = logging.getLogger(__name__)

UNACKED_INDEX_KEY = "unacked_index"
UNACKED_MUTEX_KEY = "unacked_mutex"
kombu_dumps = cast(Callable[[Any], str], _kombu_dumps)  # how kombu serialises what it pushes
MAX_PRIORITY = 9  # kombu's virtual.Channel.max_priority (min_priority 0, default_priority 0)


class UnackedMutexHeld(Exception):
    """kombu's `unacked_mutex` stayed held by someone else (a consumer's `restore_visible`,
    another restorer) for the whole wait: nothing was restored; try again later."""


class RestoredJob(NamedTuple):
    """One message pushed back: its task id, the queue, its (former) delivery tag, and the list
    it went to (the queue's priority-step key, with the prefix)."""

    task_id: str
    queue: str
    delivery_tag: str
    key: str


class Entry(NamedTuple):
    """An unacked entry that was not restored."""

    task_id: str
    delivery_tag: str


@dataclass(frozen=True)
class Restored:
    """What `restore_unacked` did.

    - `restored`: one row per (message, queue) pushed back (a message its exchange routes to
      two queues gives two rows);
    - `not_found`: task ids with no entry left in the unacked hash (never delivered, acked,
      restored by someone else — or by us, when the connection dropped during our EXEC);
    - `unroutable`: entries left in the hash because their exchange routes them to no queue
      now (kombu would drop them; its visibility timeout will find them again);
    - `newer`: entries left in the hash because they were delivered after `delivered_before`
      (another consumer's delivery of the same task id);
    - `left`: entries still in the hash because of contention on it or the mutex's lifetime:
      call again.
    """

    restored: tuple[RestoredJob, ...] = ()
    not_found: tuple[str, ...] = ()
    unroutable: tuple[Entry, ...] = ()
    newer: tuple[Entry, ...] = ()
    left: tuple[Entry, ...] = ()

    @property
    def task_ids(self) -> set[str]:
        return {job.task_id for job in self.restored}


def task_id_of(message: Any) -> str | None:
    """The Celery task id of a kombu message envelope: `headers.id` (protocol 2), else
    `properties.correlation_id`, else the `id` of a JSON body (protocol 1)."""
    if not isinstance(message, dict):
        return None
    headers = message.get("headers")
    if isinstance(headers, dict) and isinstance(headers.get("id"), str) and headers["id"]:
        return str(headers["id"])
    props = message.get("properties")
    if isinstance(props, dict):
        corr = props.get("correlation_id")
        if isinstance(corr, str) and corr:
            return corr
    body = message.get("body")
    if not isinstance(body, str) or "json" not in str(message.get("content-type", "")):
        return None
    try:
        if isinstance(props, dict) and props.get("body_encoding") == "base64":
            body = base64.b64decode(body, validate=True).decode("utf-8")
        decoded = json.loads(body)
    except (ValueError, binascii.Error, UnicodeDecodeError):
        return None
    ident = decoded.get("id") if isinstance(decoded, dict) else None
    return ident if isinstance(ident, str) and ident else None


def _entry(raw: bytes | str | None) -> tuple[dict[str, Any], str, str, str] | None:
    """(message, exchange, routing key, task id) of one unacked value, None if not kombu's."""
    if raw is None:
        return None
    try:
        value = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        return None
    if not (isinstance(value, list) and len(value) >= 3 and isinstance(value[0], dict)):
        return None
    message, exchange, routing_key = value[0], value[1], value[2]
    tid = task_id_of(message)
    if tid is None or not isinstance(exchange, str) or not isinstance(routing_key, str):
        return None
    return message, exchange, routing_key, tid


def lookup(exchange: str, routing_key: str, bindings: Mapping[str, list[Binding]]) -> list[str]:
    """The queues kombu's `Channel._lookup` restores (exchange, routing key) to: the anonymous
    exchange routes by queue name; another through its binding table, a member with a pattern
    as a topic binding, without as a direct one. Empty where kombu finds nothing (it would drop
    the message: `deadletter_queue` is None), unlike the reader's `route`, which counts such a
    message under the queue named like the key."""
    if not exchange:
        return [routing_key] if routing_key else []
    found = [
        queue for key, pattern, queue in bindings.get(exchange, [])
        if (_topic_match(pattern, routing_key) if pattern else key == routing_key)
    ]
    return list(dict.fromkeys(found))


def priority_key(layout: CeleryRedisLayout, queue: str, message: Mapping[str, Any]) -> str:
    """The list kombu restores `message` of `queue` to (`_get_message_priority`, then
    `_q_for_pri`: the step `steps[bisect(steps, priority) - 1]`)."""
    props = message.get("properties")
    try:
        pri = max(min(int(props["priority"]), MAX_PRIORITY), 0)  # type: ignore[index]
    except (TypeError, ValueError, KeyError):
        pri = 0
    steps = layout.steps
    step = steps[bisect(steps, pri) - 1]
    return layout.keys(queue)[steps.index(step)]


def redelivered(message: dict[str, Any]) -> dict[str, Any]:
    """The message as kombu's `_do_restore_message` pushes it back: `redelivered` set in its
    headers and its delivery info (each only where the envelope has a place for it)."""
    headers = message.get("headers")
    if isinstance(headers, dict):
        headers["redelivered"] = True
        props = message.get("properties")
        info = props.get("delivery_info") if isinstance(props, dict) else None
        if isinstance(info, dict):
            info["redelivered"] = True
    return message


@contextmanager
def unacked_mutex(
    client: redis.Redis,
    layout: CeleryRedisLayout,
    *,
    timeout: float = 10.0,
    expire: float = 60.0,
    key: str = UNACKED_MUTEX_KEY,
) -> Iterator[float]:
    """Hold kombu's `unacked_mutex` (its `Mutex`: a redis-py `Lock` on `{prefix}unacked_mutex`,
    here waited for up to `timeout` seconds where kombu gives up at once); yields the monotonic
    time by which it expires. Raises UnackedMutexHeld when it stays held."""
    lock = client.lock(
        layout.global_keyprefix + key, timeout=expire, sleep=0.05, blocking=True,
        blocking_timeout=max(0.0, timeout),
    )
    start = time.monotonic()
    if not lock.acquire():
        raise UnackedMutexHeld(f"{layout.global_keyprefix}{key} held for {timeout:g}s")
    try:
        yield start + expire
    finally:
        try:
            lock.release()
        except redis.exceptions.LockError:  # it expired (and perhaps someone else took it)
            log.warning("the unacked mutex expired while we held it")
        except redis.RedisError as exc:  # e.g. scripting refused: it expires by itself
            log.warning("the unacked mutex was not released (%s)", type(exc).__name__)


@dataclass
class _Outcome:
    restored: list[RestoredJob] = field(default_factory=list)
    unroutable: list[Entry] = field(default_factory=list)
    left: list[Entry] = field(default_factory=list)


class _Push(NamedTuple):
    tag: bytes | str
    task_id: str
    raw: bytes | str  # the entry as it was (put back if no push could be made)
    payload: str  # the message as it goes back
    targets: list[tuple[str, str]]  # (queue, priority key)


def _text(raw: bytes | str) -> str:
    return raw.decode("utf-8", "surrogateescape") if isinstance(raw, bytes) else raw


def _bindings(
    client: redis.Redis, layout: CeleryRedisLayout, exchanges: Collection[str]
) -> dict[str, list[Binding]]:
    named = sorted(ex for ex in exchanges if ex)
    if not named:
        return {}
    pipe = client.pipeline(transaction=False)
    for ex in named:
        pipe.smembers(layout.binding_key(ex))
    return {
        ex: parse_bindings(list(members), layout.sep)
        for ex, members in zip(named, pipe.execute(raise_on_error=False), strict=True)
        if isinstance(members, set)
    }


def _restore_batch(
    client: redis.Redis,
    layout: CeleryRedisLayout,
    index_key: str,
    tags: Sequence[bytes | str],
    wanted: Collection[str],
    bindings: Mapping[str, list[Binding]],
    scores: Mapping[bytes | str, float | None],
    only: Collection[str] | None,
    out: _Outcome,
) -> bool:
    """kombu's `restore_by_tag` over `tags` at once: WATCH the hash, HMGET the entries, then
    one MULTI of ZREM + HDEL + RPUSH per entry still there. False when the EXEC was aborted
    (the hash changed after the WATCH: nothing was done, try again)."""
    unacked = layout.unacked
    plan: list[_Push] = []
    unroutable: list[Entry] = []  # counted once the batch is done (not on an abort)
    with client.pipeline(transaction=True) as pipe:
        try:
            pipe.watch(unacked)  # type: ignore[no-untyped-call]
            values = pipe.hmget(unacked, list(tags))
            for tag, raw in zip(tags, values, strict=True):
                parsed = _entry(raw)
                if raw is None or parsed is None or parsed[3] not in wanted:
                    continue  # acked or restored since the scan
                message, exchange, routing_key, tid = parsed
                queues = lookup(exchange, routing_key, bindings)
                if only is not None:
                    queues = [q for q in queues if q in only]
                if not queues:
                    unroutable.append(Entry(tid, _text(tag)))
                    continue
                targets = [(q, priority_key(layout, q, message)) for q in queues]
                plan.append(_Push(tag, tid, raw, kombu_dumps(redelivered(message)), targets))
            if not plan:
                pipe.unwatch()
                out.unroutable += unroutable
                return True
            pipe.multi()
            for push in plan:
                pipe.zrem(index_key, push.tag)  # kombu's _remove_from_indices, then the pushes
                pipe.hdel(unacked, push.tag)
                for _, key in push.targets:
                    pipe.rpush(key, push.payload)
            results = pipe.execute(raise_on_error=False)
        except redis.WatchError:
            return False
    out.unroutable += unroutable
    at = 0
    for push in plan:
        hdel, pushed = results[at + 1], results[at + 2 : at + 2 + len(push.targets)]
        at += 2 + len(push.targets)
        if hdel != 1:  # impossible under WATCH: say so loudly if it ever happens
            log.error("unacked entry %s was removed by someone else in our EXEC", _text(push.tag))
        ok = [t for t, res in zip(push.targets, pushed, strict=True)
              if not isinstance(res, Exception)]
        out.restored += [RestoredJob(push.task_id, q, _text(push.tag), key) for q, key in ok]
        if not ok:  # every push failed (a key of another type): the entry goes back
            _put_back(client, layout, index_key, push.tag, push.raw, scores.get(push.tag))
            out.unroutable.append(Entry(push.task_id, _text(push.tag)))
        elif len(ok) < len(push.targets):
            log.error("task %s restored to %d of its %d queues", push.task_id, len(ok),
                      len(push.targets))
    return True


def _put_back(
    client: redis.Redis,
    layout: CeleryRedisLayout,
    index_key: str,
    tag: bytes | str,
    raw: bytes | str,
    score: float | None,
) -> None:
    pipe = client.pipeline(transaction=True)
    pipe.hsetnx(layout.unacked, tag, raw)
    index: dict[Any, float] = {tag: score if score is not None else time.time()}
    pipe.zadd(index_key, index, nx=True)
    pipe.execute()


def restore_unacked(
    client: redis.Redis,
    layout: CeleryRedisLayout | str,
    task_ids: Collection[str],
    *,
    queues: Collection[str] | None = None,
    mutex_timeout: float = 10.0,
    mutex_expire: float = 60.0,
    delivered_before: float | None = None,
    unacked_index_key: str = UNACKED_INDEX_KEY,
    unacked_mutex_key: str = UNACKED_MUTEX_KEY,
    scan_count: int = 1000,
    batch: int = 100,
    max_aborts: int = 20,
) -> Restored:
    """Push the unacked messages of `task_ids` back onto their queues, each exactly once (see
    the module's docstring). `layout` is the broker's `CeleryRedisLayout` (or only its
    `global_keyprefix`, kombu's defaults otherwise); `client` the watched broker's admin
    connection. `queues`, the queues the machine consumed, restricts where a message goes back
    to: kombu restores a message to every queue its exchange routes it to (the entry does not
    say which one it was taken from), so a topic or fanout exchange bound to several queues
    would get a copy back in each. `delivered_before` (epoch seconds, the consumers' clocks)
    leaves entries delivered later alone: the same task id delivered to another consumer
    since. Raises UnackedMutexHeld (nothing restored) when kombu's mutex stays held for
    `mutex_timeout` seconds, and redis-py's errors when Redis fails (what was restored stays
    restored: a second call finds the rest)."""
    lay = layout if isinstance(layout, CeleryRedisLayout) else CeleryRedisLayout(layout)
    wanted = {str(t) for t in task_ids}
    if not wanted:
        return Restored()
    index_key = lay.global_keyprefix + unacked_index_key
    only = None if queues is None else set(queues)

    found: dict[bytes | str, tuple[str, str]] = {}  # tag -> (task id, exchange)
    for tag, raw in client.hscan_iter(lay.unacked, count=max(1, scan_count)):
        parsed = _entry(raw)
        if parsed is not None and parsed[3] in wanted:
            found[tag] = (parsed[3], parsed[1])

    scores: dict[bytes | str, float | None] = {}
    tags = list(found)
    if tags:
        pipe = client.pipeline(transaction=False)
        for tag in tags:
            pipe.zscore(index_key, tag)
        for tag, score in zip(tags, pipe.execute(raise_on_error=False), strict=True):
            scores[tag] = float(score) if isinstance(score, (int, float)) else None
    newer: list[Entry] = []
    if delivered_before is not None:
        keep = []
        for tag in tags:
            score = scores.get(tag)
            if score is not None and score > delivered_before:
                newer.append(Entry(found[tag][0], _text(tag)))
            else:
                keep.append(tag)
        tags = keep
    bindings = _bindings(client, lay, {ex for _, ex in found.values()})

    out = _Outcome()
    if tags:
        with unacked_mutex(
            client, lay, timeout=mutex_timeout, expire=mutex_expire, key=unacked_mutex_key
        ) as expires:
            todo = [tags[i : i + max(1, batch)] for i in range(0, len(tags), max(1, batch))]
            aborts = 0
            while todo:
                chunk = todo.pop(0)
                if time.monotonic() > expires - mutex_expire / 2 or aborts > max_aborts:
                    out.left += [Entry(found[t][0], _text(t)) for t in chunk]
                    continue
                if _restore_batch(
                    client, lay, index_key, chunk, wanted, bindings, scores, only, out
                ):
                    continue
                aborts += 1  # the hash changed under us (acks, deliveries): smaller batches
                half = max(1, len(chunk) // 2)
                todo[:0] = [chunk[:half], chunk[half:]] if len(chunk) > 1 else [chunk]
                time.sleep(min(0.05 * aborts, 0.5))

    kept = {e.task_id for e in (*out.unroutable, *out.left, *newer)}
    not_found = sorted(wanted - {job.task_id for job in out.restored} - kept)
    return Restored(
        restored=tuple(out.restored),
        not_found=tuple(not_found),
        unroutable=tuple(out.unroutable),
        newer=tuple(newer),
        left=tuple(out.left),
    )


__all__ = [
    "Entry",
    "Restored",
    "RestoredJob",
    "UnackedMutexHeld",
    "lookup",
    "priority_key",
    "restore_unacked",
    "task_id_of",
    "unacked_mutex",
]
