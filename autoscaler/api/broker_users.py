"""Per-launch Redis ACL users: a rented machine never holds the shared broker password.

Where a queue's watched broker is Celery on Redis 6 or newer, each launch gets its own user
(named after its label, `asg-<installation>-<launch>`) limited to the keys and channels one
Celery worker of that queue needs:

- the queue's lists (`<prefix><queue>` and its priority-step lists `<queue><sep><n>`);
- kombu's `unacked`, `unacked_index`, `unacked_mutex` (one per database and prefix: shared by
  every queue of the database, a kombu limit);
- the binding sets (`_kombu.binding.<queue>`, `…celery.pidbox`, `…celeryev`,
  `…reply.celery.pidbox`) and remote control's own lists (`*.celery.pidbox`,
  `*.reply.celery.pidbox`);
- pub/sub channels of the fanout exchanges (`/<db>.celeryev/*`, `/<db>.celery.pidbox`);
- only the commands kombu's Redis transport sends.

Its password is derived from the machine's worker token (`keys.derive`): the server computes it
again when the machine asks for its deployment, and stores nothing. The user is deleted when the
machine is destroyed. Elsewhere (RabbitMQ, Redis older than 6, other sources) `plan_for` says
why no user can be made and what the machine would hold instead.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, urlsplit, urlunsplit

from autoscaler.config.models import MetricsSource
from autoscaler.metrics.registry import MetricsConfigError, source_url
from autoscaler.providers.labels import make_label
from autoscaler.urls import UrlError, parse_url

COMMANDS = (
    # connection and introspection kombu does on connect
    "ping",
    "auth",
    "hello",
    "client|setname",
    "client|id",
    "info",
    # queues
    "lpush",
    "rpush",
    "brpop",
    "rpop",
    "lpop",
    "llen",
    "lrange",
    "lrem",
    "ltrim",
    "del",
    "exists",
    "type",
    # bindings
    "sadd",
    "srem",
    "smembers",
    "scard",
    "sismember",
    # unacked restore (hash, index, mutex)
    "hset",
    "hget",
    "hdel",
    "hgetall",
    "hlen",
    "hmget",
    "zadd",
    "zrem",
    "zrevrangebyscore",
    "zrangebyscore",
    "zrange",
    "time",
    "zcard",
    "set",
    "get",
    "setnx",
    "expire",
    "pexpire",
    "watch",
    "unwatch",
    "multi",
    "exec",
    "discard",
    "evalsha",
    "eval",
    "script|load",
    "script|exists",
    # fanout (events, broadcast remote control)
    "publish",
    "subscribe",
    "psubscribe",
    "unsubscribe",
    "punsubscribe",
)


class NoBrokerUser(Exception):
    """No per-launch user can be made here; the message says what the machine holds instead."""


class BrokerUnreachable(NoBrokerUser):
    """The watched broker could not be asked right now (down, refusing us): a machine must not
    be rented without the user it needs; try again later."""


@dataclass(frozen=True)
class BrokerPlan:
    url: str  # the watched broker (admin rights: creates and deletes users)
    queue: str
    db: int
    keyprefix: str
    sep: str

    def user(self, installation_id: str, launch_id: str) -> str:
        """The machine's label (`asg-<installation>-<launch>`): whose it is, at a glance."""
        return make_label(installation_id, launch_id)

    def commands(self) -> list[str]:
        """The commands the user may send: kombu's set, and SELECT of its own database only
        (ACL key patterns are not tied to a database: `SELECT` of another one would open the
        same key names there). Database 0 needs no SELECT at all."""
        return [*COMMANDS, *([f"select|{self.db}"] if self.db else [])]

    def key_patterns(self) -> list[str]:
        """Every key pattern of the user. Names and the prefix enter the patterns escaped: a
        queue named `render*` must not open `render-private-queue` or `renderer:api_key`."""
        p, q, s = glob_escape(self.keyprefix), glob_escape(self.queue), glob_escape(self.sep)
        return [
            f"{p}{q}",
            f"{p}{q}{s}*",
            f"{p}unacked",
            f"{p}unacked_index",
            f"{p}unacked_mutex",
            f"{p}_kombu.binding.{q}",
            f"{p}_kombu.binding.celery.pidbox",
            f"{p}_kombu.binding.celeryev",
            f"{p}_kombu.binding.reply.celery.pidbox",
            f"{p}_kombu.binding_deadlines",
            f"{p}_kombu.binding_permanent.{q}",
            f"{p}_kombu.binding_permanent.celery.pidbox",
            f"{p}_kombu.binding_permanent.celeryev",
            f"{p}_kombu.binding_permanent.reply.celery.pidbox",
            f"{p}*.celery.pidbox",
            f"{p}*.celery.pidbox{s}*",
            f"{p}celeryev.*",  # a worker's own event queue (gossip)
        ]

    def channels(self) -> list[str]:
        p = glob_escape(self.keyprefix)
        pidbox, events = f"{p}/{self.db}.celery.pidbox", f"{p}/{self.db}.celeryev"
        return [pidbox, f"{pidbox}/*", f"{events}/*", f"{events}/worker.*"]

    def machine_url(self, user: str, password: str) -> str:
        parts = urlsplit(self.url)
        host = parts.hostname or "127.0.0.1"
        if ":" in host:
            host = f"[{host}]"
        netloc = f"{quote(user, safe='')}:{quote(password, safe='')}@{host}"
        if parts.port:
            netloc += f":{parts.port}"
        return urlunsplit((parts.scheme, netloc, parts.path, parts.query, ""))


def glob_escape(text: str) -> str:
    """`text` as a literal inside a Redis glob pattern (ACL keys and channels, SCAN MATCH):
    `* ? [ ] \\` escaped with a backslash, as Redis' stringmatchlen reads them."""
    return "".join(f"\\{c}" if c in "*?[]\\" else c for c in text)


def plan_for(source: MetricsSource, queue: str, env: Mapping[str, str] | None = None) -> BrokerPlan:
    """The per-launch user plan of a queue's watched broker, or NoBrokerUser saying why not."""
    if source.source != "celery":
        raise NoBrokerUser(
            f"the {source.source} source gets no per-machine broker user: the machine's "
            "worker needs the broker's own credentials (give them through its deployment)"
        )
    try:
        url = source_url(source, env)
    except MetricsConfigError as exc:
        raise NoBrokerUser(str(exc)) from None
    scheme = url.split("://", 1)[0].lower()
    if scheme not in ("redis", "rediss"):
        raise NoBrokerUser(
            f"the {scheme} broker gets no per-machine user from us: the machine would hold the "
            "credentials of the broker URL it is given (use a RabbitMQ user limited to this "
            "queue's vhost)"
        )
    try:
        db = parse_url(url).db or 0
    except UrlError as exc:
        raise NoBrokerUser(str(exc)) from None
    version = _redis_version(url)
    if version < (6, 0):
        raise NoBrokerUser(
            f"Redis {'.'.join(map(str, version))} has no ACL users (6.0 or newer does): the "
            "machine would hold the shared broker password"
        )
    return BrokerPlan(
        url=url,
        queue=source.queue or queue,
        db=db,
        keyprefix=source.global_keyprefix or "",
        sep=source.sep,
    )


def _client(url: str) -> object:
    import redis

    return redis.Redis.from_url(url, socket_timeout=5, socket_connect_timeout=3)


def _redis_version(url: str) -> tuple[int, ...]:
    client: Any = None
    try:
        client = _client(url)
        info = client.info("server")
    except Exception as exc:  # a URL redis cannot parse, a broker down: said, never raised
        raise BrokerUnreachable(
            f"the watched broker cannot be asked its version ({type(exc).__name__})"
        ) from None
    finally:
        if client is not None:
            with contextlib.suppress(Exception):
                client.close()
    try:
        return tuple(int(x) for x in str(info.get("redis_version", "0")).split(".")[:2])
    except ValueError:
        return (0,)


def create_user(plan: BrokerPlan, user: str, password: str) -> None:
    rules = ["reset", "on", f">{password}", "resetkeys", "resetchannels", "-@all"]
    rules += [f"~{k}" for k in plan.key_patterns()]
    rules += [f"&{c}" for c in plan.channels()]
    rules += [f"+{c}" for c in plan.commands()]
    client = _client(plan.url)
    try:
        client.execute_command("ACL", "SETUSER", user, *rules)  # type: ignore[attr-defined]
    finally:
        with contextlib.suppress(Exception):
            client.close()  # type: ignore[attr-defined]


def delete_user(url: str, user: str) -> None:
    client = _client(url)
    try:
        client.execute_command("ACL", "DELUSER", user)  # type: ignore[attr-defined]
    finally:
        with contextlib.suppress(Exception):
            client.close()  # type: ignore[attr-defined]


def machine_access(config: Any, env: Mapping[str, str] | None = None) -> list[str]:
    """What `autoscaler validate` says each autoscaled queue's machines will hold to reach
    their broker (asks each watched Redis its version; never prints a URL)."""
    lines = []
    known: dict[object, str | None] = {}  # one question per watched broker
    for name, queue in config.queues.items():
        if queue.autoscale is None or not queue.autoscale.enabled:
            continue
        key = queue.metrics.model_copy(update={"queue": None})
        if key not in known:
            try:
                plan_for(queue.metrics, name, env)
                known[key] = None
            except NoBrokerUser as exc:
                known[key] = str(exc)
        if known[key] is not None:
            lines.append(f"machines of {name} will hold: {known[key]}")
            continue
        lines.append(
            f"machines of {name} will hold: their own Redis user (named after the machine), "
            "limited to "
            "this queue's keys and Celery's unacked, binding, remote-control and event keys; "
            "deleted when the machine is destroyed"
        )
    return lines


def list_users(url: str) -> list[str]:
    client = _client(url)
    try:
        users = client.execute_command("ACL", "USERS")  # type: ignore[attr-defined]
    finally:
        with contextlib.suppress(Exception):
            client.close()  # type: ignore[attr-defined]
    return [u.decode() if isinstance(u, bytes) else str(u) for u in users or ()]


def sweep(
    config: Any,
    installation_id: str,
    live_launches: set[str],
    env: Mapping[str, str] | None = None,
) -> list[str]:
    """Delete this installation's broker users whose machine has no live row any more (a
    launch failed after its user was made, a row lost): reconcile calls it every round. Users
    of other installations, and every other user, are never touched. Returns those deleted."""
    from autoscaler.providers.labels import parse_label

    deleted: list[str] = []
    urls: set[str] = set()
    for name, queue in config.queues.items():
        if queue.autoscale is None or not queue.autoscale.enabled:
            continue
        with contextlib.suppress(NoBrokerUser):
            urls.add(plan_for(queue.metrics, name, env).url)
    for url in sorted(urls):
        for user in list_users(url):
            parsed = parse_label(user)
            if parsed is None or parsed.installation_id != installation_id:
                continue
            if parsed.launch_id in live_launches:
                continue
            delete_user(url, user)
            deleted.append(user)
    return deleted
