"""The key layout actually on a watched Redis, against what a queue's `metrics:` block says.

kombu names a queue's lists from the producers' `broker_transport_options` (`global_keyprefix`,
`sep`, `priority_steps`); a `metrics:` block that says otherwise silently reads only some of
them (3 of 12 messages with the wrong separator). `autoscaler validate` asks the broker: one
bounded SCAN of key names, then the type, length and oldest message of the candidate keys, and
warns when messages of a watched queue wait in lists the block does not read, with the settings
that would read them. The separator is confirmed by kombu's binding tables (members
`routing_key<sep>pattern<sep>queue`); without one, only a separator of punctuation is believed
(so a queue `jobs-v2` is not taken for priority 2 of `jobs` with a separator `-v`).

Nothing is written; a broker out of reach gives a note, never an error.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field

import redis

from autoscaler.brokers.base import MetricsConfigError, Secrets, safe_error, source_url
from autoscaler.brokers.redis.keys import BINDING_PREFIX, DEFAULT_SEP, redis_layout
from autoscaler.brokers.redis_client import open_redis
from autoscaler.config.metrics_sources import CelerySource
from autoscaler.config.models import Config
from autoscaler.settings import redact_url
from autoscaler.urls import transport

MAX_KEYS = 200_000
"""Key names examined per broker (SCAN stops there)."""
MAX_CANDIDATES = 5_000


@dataclass
class QueueLayout:
    """What one queue's lists hold on the broker."""

    queue: str
    read: dict[str, int] = field(default_factory=dict)  # keys the block reads -> messages
    unread: dict[str, int] = field(default_factory=dict)  # other lists of the queue -> messages
    seps: set[str] = field(default_factory=set)
    steps: set[int] = field(default_factory=set)
    base_seen: bool = False
    prefixes: dict[str, int] = field(default_factory=dict)  # another prefix -> messages

    @property
    def read_total(self) -> int:
        return sum(self.read.values())

    @property
    def unread_total(self) -> int:
        return sum(self.unread.values())


def _text(raw: bytes | str) -> str:
    return raw.decode("utf-8", "surrogateescape") if isinstance(raw, bytes) else raw


def _binding_seps(members: list[str], queue: str) -> set[str]:
    """Strings that binding members of `queue` could have been joined with: each member is
    `routing_key<sep>pattern<sep>queue`, so `sep` ends what precedes the queue name and occurs
    once more before it."""
    out = set()
    for m in members:
        if not m.endswith(queue):
            continue
        body = m[: -len(queue)]
        for n in range(1, min(16, len(body) // 2) + 1):
            if body[-n:] in body[:-n]:
                out.add(body[-n:])
    return out


def _is_envelope(raw: object) -> bool:
    if not isinstance(raw, bytes):
        return False
    try:
        env = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        return False
    return isinstance(env, dict) and isinstance(env.get("properties"), dict)


def inspect_layout(
    client: redis.Redis, source: CelerySource, queues: list[str], max_keys: int = MAX_KEYS
) -> dict[str, QueueLayout]:
    """Every watched queue's lists as the broker holds them."""
    layout = redis_layout(source)
    prefix = layout.global_keyprefix
    found = {q: QueueLayout(q) for q in queues}
    readable = {q: set(layout.keys(q)) for q in queues}
    names: list[str] = []
    members: list[str] = []
    binding_keys: list[bytes | str] = []
    cursor, seen = 0, 0
    while True:
        cursor, batch = client.scan(cursor=cursor, count=1000)
        for raw in batch:
            seen += 1
            name = _text(raw)
            if BINDING_PREFIX in name:
                binding_keys.append(raw)
            else:
                names.append(name)
        if cursor == 0 or seen >= max_keys:
            break
    if binding_keys:
        pipe = client.pipeline(transaction=False)
        for bkey in binding_keys[:1000]:
            pipe.smembers(bkey)
        for got in pipe.execute(raise_on_error=False):
            if isinstance(got, set):
                members += [_text(m) for m in got]

    candidates: list[tuple[str, str, str, int | None, str | None]] = []  # key, queue, kind, ...
    for name in names:
        for q in queues:
            base = prefix + q
            if name == base or name in readable[q]:
                candidates.append((name, q, "read", None, None))
            elif name.startswith(base):
                m = re.fullmatch(r"(.+?)(\d+)", name[len(base) :], re.S)
                if m:
                    candidates.append((name, q, "step", int(m.group(2)), m.group(1)))
            elif name.endswith(q) and len(name) > len(q):
                candidates.append((name, q, "prefix", None, name[: -len(q)]))
        if len(candidates) >= MAX_CANDIDATES:
            break
    if not candidates:
        return found
    pipe = client.pipeline(transaction=False)
    for key, *_ in candidates:
        pipe.type(key)
        pipe.llen(key)
        pipe.lindex(key, -1)
    res = pipe.execute(raise_on_error=False)
    confirmed = {q: _binding_seps(members, q) for q in queues}
    for i, (key, q, kind, step, extra) in enumerate(candidates):
        kind_of, depth, head = res[3 * i], res[3 * i + 1], res[3 * i + 2]
        if kind_of != b"list" or not isinstance(depth, int):
            continue
        entry = found[q]
        if kind == "read":
            entry.read[key] = depth
            if key == prefix + q:
                entry.base_seen = True
            continue
        if not _is_envelope(head):
            continue
        if kind == "step" and extra is not None and step is not None:
            believable = extra in confirmed[q] or (not confirmed[q] and not re.search(r"\w", extra))
            if not believable:
                continue
            entry.unread[key] = depth
            entry.seps.add(extra)
            entry.steps.add(step)
        elif kind == "prefix" and extra is not None and not extra.startswith(prefix + q):
            entry.prefixes[extra] = entry.prefixes.get(extra, 0) + depth
    for q, entry in found.items():  # the steps the block reads that hold messages
        for key in entry.read:
            rest = key[len(prefix + q) :]
            m = re.fullmatch(r"(.+?)(\d+)", rest, re.S) if rest else None
            if m:
                entry.steps.add(int(m.group(2)))
    return found


def describe_layout(source: CelerySource, entry: QueueLayout) -> list[str]:
    """The dry run's warnings for one queue (none when the block reads every list)."""
    lines = []
    if entry.unread_total:
        total = entry.read_total + entry.unread_total
        shown = ", ".join(f"{k!r} holds {n}" for k, n in sorted(entry.unread.items())[:6])
        sep = sorted(entry.seps)[0] if len(entry.seps) == 1 else None
        steps = sorted(entry.steps | ({0} if entry.base_seen else set()))
        fix = []
        if sep is not None and sep != source.sep:
            fix.append(f"metrics.sep: {json.dumps(sep)}")
        if list(steps) != sorted(set(source.priority_steps)):
            fix.append(f"metrics.priority_steps: {steps}")
        lines.append(
            f"  warning: the broker holds {entry.unread_total} message(s) of queue "
            f"{entry.queue} in lists this metrics block does not read ({shown}): it would "
            f"count {entry.read_total} of {total}; "
            + (
                f"set {' and '.join(fix)} (the producers' broker_transport_options)"
                if fix
                else "set metrics.sep and metrics.priority_steps as the producers' "
                "broker_transport_options do"
            )
        )
    if entry.prefixes and not entry.read_total:
        other = max(entry.prefixes, key=lambda p: entry.prefixes[p])
        lines.append(
            f"  warning: nothing waits under the key prefix {source.global_keyprefix!r} for "
            f"queue {entry.queue}, but {entry.prefixes[other]} message(s) wait in "
            f"{other + entry.queue!r}: is metrics.global_keyprefix {json.dumps(other)}?"
        )
    return lines


def _check(config: Config, env: Mapping[str, str] | None, timeout: float) -> list[str]:
    groups: dict[CelerySource, list[str]] = {}
    for name, q in config.queues.items():
        src = q.metrics
        if src.source != "celery":
            continue
        groups.setdefault(src.model_copy(update={"queue": None}), []).append(src.queue or name)
    out: list[str] = []
    for src, queues in groups.items():
        try:
            url = source_url(src, env)
        except MetricsConfigError:
            continue  # the dry run already says where the numbers would come from
        if transport(url) != "redis":
            continue
        try:
            client = open_redis(url, timeout)
            try:
                found = inspect_layout(client, src, sorted(set(queues)))
            finally:
                client.close()
        except Exception as exc:  # unreachable, refused, a wrong password: a note only
            cause = safe_error(exc, Secrets.from_urls(url))
            out.append(f"note: the key layout on {redact_url(url)} was not checked ({cause})")
            continue
        for entry in found.values():
            lines = describe_layout(src, entry)
            if lines:
                out.append(f"queue {entry.queue} on {redact_url(url)}:")
                out += lines
    return out


def broker_layout_warnings(
    config: Config,
    env: Mapping[str, str] | None = None,
    timeout: float = 1.0,
    deadline: float = 5.0,
) -> list[str]:
    """For `validate`'s dry run: warnings about Celery queues on Redis whose messages wait in
    lists their `metrics:` block does not read. Bounded by `deadline` seconds in all."""
    result: list[list[str]] = []

    def run() -> None:
        result.append(_check(config, env, timeout))

    worker = threading.Thread(target=run, name="layout-check", daemon=True)
    worker.start()
    worker.join(deadline)
    if not result:
        return [f"note: the brokers' key layouts were not checked within {deadline:g}s"]
    return result[0]


__all__ = ["DEFAULT_SEP", "QueueLayout", "broker_layout_warnings", "inspect_layout"]
