"""Per-launch Redis ACL users: a rented machine never holds the shared broker password.

Where a queue's watched broker is Celery on Redis 6 or newer, each launch gets its own user
(named after its label, `asg-<installation>-<launch>`) limited to the keys and channels one
Celery worker of that queue needs:

- the queue's lists (`<prefix><queue>` and its priority-step lists `<queue><sep><n>`);
- kombu's `unacked`, `unacked_index`, `unacked_mutex` (one per database and prefix: shared by
  every queue of the database, a kombu limit);
- the binding sets (`_kombu.binding.<queue>`, `…celery.pidbox`, `…celeryev`,
  `…reply.celery.pidbox`), its own remote-control list (`<label>@*.celery.pidbox`) and the
  loop's reply lists (`<oid>.reply.celery.pidbox`, exactly: no pattern reaches another prefix);
- pub/sub channels of the fanout exchanges (`/<db>.celeryev/*`, `/<db>.celery.pidbox`);
- only the commands kombu's Redis transport sends.

Its password is derived from the machine's worker token (`keys.derive`): the server computes it
again when the machine asks for its deployment, and stores nothing. The user is deleted when the
machine is destroyed. On RabbitMQ the users are `rabbitmq.users`'s; `plan_for`, `create_user`,
`delete_machine_user`, `sweep` and `machine_access` here serve both brokers. Elsewhere (Redis
older than 6, other sources) `plan_for` says why no user can be made and what the machine would
hold instead.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, urlsplit, urlunsplit

from autoscaler.brokers.base import MetricsConfigError, source_url
from autoscaler.brokers.rabbitmq import users as rabbit_users
from autoscaler.brokers.rabbitmq.users import RabbitPlan
from autoscaler.config.metrics_sources import CelerySource, MetricsSource
from autoscaler.providers.labels import make_label
from autoscaler.urls import Transport, UrlError, parse_url, transport

log = logging.getLogger("autoscaler.brokers.users")

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
    # kombu's and redis-py's scripts, loaded by the control plane, run by their SHA (the
    # `evalsha|<sha>` rules of `BrokerPlan.commands`): never sent, never any other script
    "script|exists",
)
"""Every command a Celery worker sends (seen with MONITOR under a real worker). No EVAL and no
SCRIPT LOAD: a machine could hang the server for everyone with a long script; the scripts kombu
needs are loaded by the control plane. Pub/sub is granted per channel (`BrokerPlan.rules`)."""

OID = "[-0-9a-f]" * 36
"""A kombu mailbox oid (`str(uuid3(...))`) as a Redis glob: exactly 36 hex digits or dashes."""

PUBSUB = ("subscribe", "psubscribe", "unsubscribe", "punsubscribe")


def _scripts() -> tuple[str, ...]:
    """The Lua scripts a worker runs by EVALSHA: kombu's binding refresh and sweep, redis-py's
    lock (kombu's `unacked_mutex`). Loaded by the control plane at each launch and reconcile."""
    from kombu.transport import redis as kombu_redis
    from redis.lock import Lock

    found = [getattr(kombu_redis, n, None) for n in ("REFRESH_BINDING", "SWEEP_BINDINGS")]
    found += [Lock.LUA_RELEASE_SCRIPT, Lock.LUA_EXTEND_SCRIPT, Lock.LUA_REACQUIRE_SCRIPT]
    return tuple(s for s in found if isinstance(s, str))


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
    version: tuple[int, ...] = (7, 0)
    """The watched Redis' version: selectors and write-only keys need 7.0."""

    @property
    def narrow(self) -> bool:
        """Redis 7: pub/sub split by command (subscribe to remote control, publish events) and
        replies write-only. Redis 6 has neither: its users may also publish on the remote-control
        channel and read other workers' replies (said by `autoscaler validate`)."""
        return self.version >= (7, 0)

    def domain(self) -> str:
        """The trust domain, for people: server and key prefix (no credentials). A database
        number is no boundary: ACL key patterns hold in every database, and a connection
        starts in database 0 before its SELECT, so a machine of database 1 reaches database 0's
        keys of the names it may use."""
        parts = urlsplit(self.url)
        where = f"{parts.hostname or 'localhost'}:{parts.port or 6379}"
        return f"{where} prefix {self.keyprefix!r}" if self.keyprefix else where

    def user(self, installation_id: str, launch_id: str) -> str:
        """The machine's label (`asg-<installation>-<launch>`): whose it is, at a glance."""
        return make_label(installation_id, launch_id)

    def commands(self) -> list[str]:
        """The commands the user may send: kombu's set, and SELECT of its own database only
        (ACL key patterns are not tied to a database: `SELECT` of another one would open the
        same key names there). Database 0 needs no SELECT at all."""
        run = [f"evalsha|{hashlib.sha1(s.encode()).hexdigest()}" for s in _scripts()]
        return [*COMMANDS, *run, *([f"select|{self.db}"] if self.db else [])]

    def key_patterns(self, user: str = "") -> list[str]:
        """Every key pattern of the user. Names and the prefix enter the patterns escaped: a
        queue named `render*` must not open `render-private-queue` or `renderer:api_key`. No
        pattern starts with a wildcard after the prefix: `*.celery.pidbox` would match the keys
        of every other prefix too (`B:…`), so its own remote-control queue is the one named
        after it and the replies it may write are the loop's, `<prefix><oid>.reply.celery.pidbox`
        (`reply_patterns`; write-only on Redis 7: the machine answers, it reads nobody's)."""
        p, q, s = glob_escape(self.keyprefix), glob_escape(self.queue), glob_escape(self.sep)
        mine = f"{p}{glob_escape(user or '-')}@*.celery.pidbox"
        remote = [f"~{mine}", f"~{mine}{s}*"]
        if not self.narrow:  # Redis 6: no write-only keys
            remote += [f"~{k}" for k in self._reply_keys()]
        return [
            *(f"~{k}" for k in self._queue_keys(p, q, s)),
            *remote,
        ]

    def _queue_keys(self, p: str, q: str, s: str) -> list[str]:
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
            f"{p}celeryev.*",  # a worker's own event queue (gossip)
        ]

    def _reply_keys(self) -> list[str]:
        """The loop's reply lists in this prefix alone: kombu names them after the asking
        mailbox's oid (a UUID: 36 characters of hex digits and dashes), so a fixed-length class
        cannot reach into a longer prefix (`B:<oid>…`) nor any other key."""
        p, s = glob_escape(self.keyprefix), glob_escape(self.sep)
        return [f"{p}{OID}.reply.celery.pidbox", f"{p}{OID}.reply.celery.pidbox{s}*"]

    def reply_patterns(self) -> list[str]:
        """Remote-control answers (Redis 7): written, never read, deleted or retyped."""
        return [f"%W~{k}" for k in self._reply_keys()]

    def channels(self) -> list[str]:
        p = glob_escape(self.keyprefix)
        pidbox, events = f"{p}/{self.db}.celery.pidbox", f"{p}/{self.db}.celeryev"
        return [pidbox, f"{pidbox}/*", f"{events}/*", f"{events}/worker.*"]

    def rules(self, user: str, password: str) -> list[str]:
        """The user's whole ACL SETUSER rule list.

        Redis 7: the root permissions publish events (`/<db>.celeryev/*`) and nothing else;
        one selector subscribes to remote control (`/<db>.celery.pidbox`) and to the workers'
        gossip (`…celeryev/worker.*`), never to task events (their arguments). So a machine
        cannot broadcast `shutdown` to every worker, nor read what other queues run. A worker
        must then start with `--without-mingle` (mingle's hello is a broadcast). Redis 6: no
        selectors; every channel with every pub/sub command, as before."""
        p = glob_escape(self.keyprefix)
        pidbox, events = f"{p}/{self.db}.celery.pidbox", f"{p}/{self.db}.celeryev"
        rules = ["reset", "on", f">{password}", "resetkeys", "resetchannels", "-@all"]
        rules += self.key_patterns(user)
        rules += [f"+{c}" for c in self.commands()]
        if not self.narrow:
            rules += [f"&{c}" for c in self.channels()]
            return [*rules, "+publish", *(f"+{c}" for c in PUBSUB)]
        rules += ["+publish", f"&{events}/*"]
        listen = [f"+{c}" for c in PUBSUB] + [f"&{pidbox}", f"&{pidbox}/*", f"&{events}/worker.*"]
        answer = ["+lpush", *self.reply_patterns()]  # kombu's _put sends LPUSH, nothing else
        return [*rules, f"({' '.join(listen)})", f"({' '.join(answer)})"]

    def machine_url(self, user: str, password: str) -> str:
        return machine_url(self.url, user, password)


def machine_url(url: str, user: str, password: str) -> str:
    """The watched broker's URL with the machine's own user instead of the admin's."""
    parts = urlsplit(url)
    host = parts.hostname or "127.0.0.1"
    if ":" in host:
        host = f"[{host}]"
    netloc = f"{quote(user, safe='')}:{quote(password, safe='')}@{host}"
    if parts.port:
        netloc += f":{parts.port}"
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, ""))


def _shared_exchange_refusal(queue: str, others: list[str]) -> str:
    return (
        f"exchange {queue!r} also routes to {', '.join(others[:5])}: a machine's own user could "
        "bind its queue there and receive copies of their messages, so none is made; give the "
        "queue an exchange of its own, or set `shared_exchange: accept` in its metrics block "
        "(the machine then shares that exposure)"
    )


def admin_url(source: MetricsSource, env: Mapping[str, str] | None = None) -> str | None:
    """The watched Redis where a queue's machines' users live (to delete them, list them), or
    None where no per-machine user is ever made. Asks nothing of the broker: a user made once
    is deleted even if no user would be made for the queue today."""
    if source.source != "celery":
        return None
    try:
        url = source_url(source, env)
    except MetricsConfigError:
        return None
    return url if user_broker(url) is not None else None


def delete_machine_user(source: MetricsSource, user: str, env: Mapping[str, str] | None) -> bool:
    """Delete a machine's broker user (Redis or RabbitMQ); False where its broker is not one
    we make users on any more (the user cannot be reached from here)."""
    url = admin_url(source, env)
    if url is None or not isinstance(source, CelerySource):  # admin_url: only Celery's have one
        return False
    if transport(url) == "amqp":
        target = rabbit_users.plan(url, source.queue or "", source.management_url)
        rabbit_users.delete_user(target, user)
    else:
        delete_user(url, user)
    return True


def user_broker(url: str) -> Transport | None:
    """The brokers we make per-machine users on: Redis over the network (a Unix socket is out
    of a rented machine's reach) and RabbitMQ; None elsewhere."""
    kind = transport(url)
    if kind == "amqp" or (kind == "redis" and not url.lower().startswith("unix")):
        return kind
    return None


def glob_escape(text: str) -> str:
    """`text` as a literal inside a Redis glob pattern (ACL keys and channels, SCAN MATCH):
    `* ? [ ] \\` escaped with a backslash, as Redis' stringmatchlen reads them."""
    return "".join(f"\\{c}" if c in "*?[]\\" else c for c in text)


def plan_for(
    source: MetricsSource, queue: str, env: Mapping[str, str] | None = None
) -> BrokerPlan | RabbitPlan:
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
    kind = user_broker(url)
    if kind == "amqp":
        try:
            rabbit = rabbit_users.plan(url, source.queue or queue, source.management_url)
            others = rabbit_users.other_queues_bound(rabbit)
        except rabbit_users.RabbitUnreachable as exc:
            raise BrokerUnreachable(f"the watched broker cannot be asked: {exc}") from None
        except PermissionError as exc:
            raise NoBrokerUser(f"no per-machine RabbitMQ user can be made: {exc}") from None
        if others and source.shared_exchange != "accept":
            raise NoBrokerUser(_shared_exchange_refusal(rabbit.queue, others))
        return rabbit
    if kind is None:
        scheme = url.split("://", 1)[0] if "://" in url else "scheme-less"
        raise NoBrokerUser(
            f"the {scheme} broker gets no per-machine user from us: the machine would hold the "
            "credentials of the broker URL it is given"
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
    name = source.queue or queue
    prefix = source.global_keyprefix or ""
    others = _other_queues_bound(url, f"{prefix}_kombu.binding.{name}", name, source.sep)
    if others and source.shared_exchange != "accept":
        raise NoBrokerUser(_shared_exchange_refusal(name, others))
    return BrokerPlan(
        url=url,
        queue=source.queue or queue,
        db=db,
        keyprefix=source.global_keyprefix or "",
        sep=source.sep,
        version=version,
    )


@contextlib.contextmanager
def _connected(url: str, unreachable: str | None = None) -> Iterator[Any]:
    """A client of the watched Redis, closed after use. With `unreachable`, any failure of the
    block is BrokerUnreachable ("the watched broker cannot be asked <unreachable>")."""
    from autoscaler.brokers.redis_client import open_redis

    client: Any = None
    try:
        client = open_redis(url, 5.0)
        yield client
    except Exception as exc:  # a URL redis cannot parse, a broker down: said, never raised
        if unreachable is None:
            raise
        raise BrokerUnreachable(
            f"the watched broker cannot be asked {unreachable} ({type(exc).__name__})"
        ) from None
    finally:
        if client is not None:
            with contextlib.suppress(Exception):
                client.close()


def _redis_version(url: str) -> tuple[int, ...]:
    with _connected(url, "its version") as client:
        info = client.info("server")
    try:
        return tuple(int(x) for x in str(info.get("redis_version", "0")).split(".")[:2])
    except ValueError:
        return (0,)


def load_scripts(url: str) -> None:
    """Load the scripts a worker runs by EVALSHA (it may not load them itself)."""
    with _connected(url) as client:
        for script in _scripts():
            client.script_load(script)


def _other_queues_bound(url: str, binding_key: str, queue: str, sep: str) -> list[str]:
    """The queues other than `queue` that the exchange's binding set routes to."""
    with _connected(url, "the queue's bindings") as client:
        members = client.smembers(binding_key)
    found = set()
    for raw in members or ():
        text = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else str(raw)
        bound = text.split(sep)[-1]
        if bound and bound != queue:
            found.add(bound)
    return sorted(found)


def create_user(plan: BrokerPlan | RabbitPlan, user: str, password: str) -> None:
    if isinstance(plan, RabbitPlan):
        rabbit_users.create_user(plan, user, password)
        return
    load_scripts(plan.url)
    with _connected(plan.url) as client:
        client.execute_command("ACL", "SETUSER", user, *plan.rules(user, password))


def delete_user(url: str, user: str) -> None:
    with _connected(url) as client:
        client.execute_command("ACL", "DELUSER", user)


def machine_access(config: Any, env: Mapping[str, str] | None = None) -> list[str]:
    """What `autoscaler validate` says each autoscaled queue's machines will hold to reach
    their broker (asks each watched Redis its version; never prints a URL)."""
    lines = []
    known: dict[object, BrokerPlan | RabbitPlan | str] = {}  # one question per watched broker
    domains: dict[str, list[str]] = {}
    databases: dict[str, set[int]] = {}
    for name, queue in config.queues.items():
        auto = queue.autoscale
        if auto is None or not auto.enabled or not auto.max_workers:
            continue  # no machine of ours will ever hold anything
        key = queue.metrics.model_copy(update={"queue": None})
        if key not in known:
            try:
                known[key] = plan_for(queue.metrics, name, env)
            except NoBrokerUser as exc:
                known[key] = str(exc)
        plan = known[key]
        if isinstance(plan, str):
            lines.append(f"machines of {name} will hold: {plan}")
            continue
        if isinstance(plan, RabbitPlan):
            lines.append(
                f"machines of {name} will hold: their own RabbitMQ user (named after the "
                f"machine) on {plan.domain()}: this queue, its own remote-control queue, "
                "listening to remote control and answering it, publishing events, binding "
                "only the workers' gossip (never task events, never a broadcast, no other "
                "queue); start its worker with --without-mingle; deleted when the machine is "
                "destroyed"
            )
            continue
        domains.setdefault(plan.domain(), []).append(name)
        databases.setdefault(plan.domain(), set()).add(plan.db)
        narrow = (
            "may listen to remote control and answer it, publish events (never read task "
            "events, never broadcast), run only the scripts the control plane loads (no EVAL); "
            "start its worker with --without-mingle"
            if plan.narrow
            else f"on Redis {'.'.join(map(str, plan.version))} it may also publish on the "
            "remote-control channel (a broadcast reaches every worker) and read other workers' "
            "answers: Redis 7 narrows both"
        )
        lines.append(
            f"machines of {name} will hold: their own Redis user (named after the machine), "
            f"limited to {plan.domain()} (database {plan.db}): this queue's keys and "
            f"Celery's unacked, binding, remote-control and event keys there; it {narrow}; "
            "deleted when the machine is destroyed"
        )
    for domain, queues in sorted(domains.items()):
        dbs = sorted(databases[domain])
        if len(dbs) > 1:
            lines.append(
                f"trust domain {domain} holds queues {', '.join(sorted(queues))} on databases "
                f"{', '.join(map(str, dbs))}: a database is no boundary (ACL key patterns hold "
                "in every database, and a connection starts in database 0), so machines of "
                "these queues can reach each other's unacked jobs and remote control; give a "
                "queue its own domain (its application's own global_keyprefix, or its own Redis)"
            )
        elif len(queues) > 1:
            lines.append(
                f"trust domain {domain} holds queues {', '.join(sorted(queues))}: kombu shares "
                "one unacked hash and the exchange bindings per domain, so machines of these "
                "queues can disturb each other's in-flight jobs; give a queue its own domain "
                "(its application's own global_keyprefix, or its own Redis) to separate it"
            )
        else:
            lines.append(f"trust domain {domain} holds queue {queues[0]} alone")
    return lines


def list_users(url: str) -> list[str]:
    with _connected(url) as client:
        users = client.execute_command("ACL", "USERS")
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

    def stale(users: list[str]) -> list[str]:
        out = []
        for user in users:
            parsed = parse_label(user)
            if parsed is None or parsed.installation_id != installation_id:
                continue
            if parsed.launch_id not in live_launches:
                out.append(user)
        return out

    deleted: list[str] = []
    urls: dict[str, CelerySource] = {}
    for queue in config.queues.values():
        if queue.autoscale is None or not queue.autoscale.enabled:
            continue
        url = admin_url(queue.metrics, env)
        if url is not None and isinstance(queue.metrics, CelerySource):  # admin_url: Celery's
            urls.setdefault(url, queue.metrics)
    for url, source in sorted(urls.items()):
        if transport(url) == "amqp":
            target = rabbit_users.plan(url, source.queue or "", source.management_url)
            for problem in rabbit_users.shared_exchanges_intact(target):
                log.error(
                    "RabbitMQ %s: %s: a machine may have deleted and redeclared it; delete it "
                    "so workers declare it again as it should be",
                    target.domain(),
                    problem,
                )
            for user in stale(rabbit_users.list_users(target)):
                rabbit_users.delete_user(target, user)
                deleted.append(user)
            continue
        load_scripts(url)  # a restart or SCRIPT FLUSH of the broker dropped them: back
        for user in stale(list_users(url)):
            delete_user(url, user)
            deleted.append(user)
    return deleted
