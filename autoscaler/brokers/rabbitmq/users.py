"""Per-launch RabbitMQ users: a rented machine holds a user of its own, never the broker's.

RabbitMQ's permissions are per resource (regular expressions over queue and exchange names, per
vhost, and per routing key on topic exchanges). Found by running a real Celery worker under the
user; the user of the machine labelled L, serving queue Q, may:

- configure (declare) Q, its remote-control queue `L@….celery.pidbox`, the remote-control
  exchanges `celery.pidbox` and `reply.celery.pidbox`, the events exchange `celeryev` and its
  gossip queue `celeryev.…`;
- write (publish, or bind a queue) to Q, its own remote-control queue, the replies exchange, the
  events exchange and its gossip queue — never to `celery.pidbox`: it cannot broadcast (no
  `shutdown` to every worker; start workers with `--without-mingle`, whose hello is a broadcast);
- read (consume, or bind from) Q, its remote-control queue, `celery.pidbox` (to hear remote
  control), `celeryev` and its gossip queue — no other queue;
- on the topic exchange `celeryev`: publish any event, bind only `worker.*` (gossip), never
  `task.*` (other queues' task arguments).

Made through the management API at launch, deleted at destroy and on a failed launch, swept by
reconcile like the Redis users. `close_connections` closes a gone machine's connections (found by
its user), so the broker requeues its unacknowledged jobs at once.

What RabbitMQ cannot narrow (said in the README's threat model): `configure` on an exchange
covers deleting it as well as declaring it, and a Celery worker declares the shared
`celeryev`, `celery.pidbox` and `reply.celery.pidbox` itself — a machine could delete one and
declare it again with another type (a fanout `celeryev` would hand it every task event).
`shared_exchanges_intact` checks their types at every reconcile, which logs an error when one
is wrong.
Gossip queues are `celeryev.<uuid>` whatever the worker: a machine that learns another's
name could read it. A queue whose exchange also routes to other queues gets no user
(`other_queues_bound`), as on Redis.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Protocol
from urllib.parse import quote, urlsplit

import requests

from autoscaler.brokers.rabbitmq.celery_rabbitmq import management_target
from autoscaler.providers.labels import make_label

TIMEOUT = 5.0


class RabbitUnreachable(Exception):
    """The management API could not be asked (down, refusing us)."""


class ManagementAPI(Protocol):
    """Where the management API is and the credentials it takes (a `RabbitPlan` is one)."""

    @property
    def management(self) -> str: ...

    @property
    def auth(self) -> tuple[str, str]: ...


@dataclass(frozen=True)
class RabbitPlan:
    url: str  # the watched broker (its credentials manage users)
    management: str  # the management API, no credentials
    auth: tuple[str, str]
    vhost: str
    queue: str
    host: str
    port: int

    narrow = True
    version: tuple[int, ...] = ()

    def user(self, installation_id: str, launch_id: str) -> str:
        return make_label(installation_id, launch_id)

    def domain(self) -> str:
        return f"{self.host}:{self.port} vhost {self.vhost!r}"

    def machine_url(self, user: str, password: str) -> str:
        parts = urlsplit(self.url)
        host = parts.hostname or "127.0.0.1"
        netloc = f"{quote(user, safe='')}:{quote(password, safe='')}@{host}"
        if parts.port:
            netloc += f":{parts.port}"
        return f"{parts.scheme}://{netloc}{parts.path or '/'}"

    def permissions(self, user: str) -> dict[str, str]:
        q, mine = re.escape(self.queue), rf"{re.escape(user)}@.*\.celery\.pidbox"
        gossip = r"celeryev\..*"
        return {
            "configure": rf"^({q}|{mine}|celery\.pidbox|reply\.celery\.pidbox|celeryev|{gossip})$",
            "write": rf"^({q}|{mine}|reply\.celery\.pidbox|celeryev|{gossip})$",
            "read": rf"^({q}|{mine}|celery\.pidbox|celeryev|{gossip})$",
        }

    def topic_permissions(self) -> dict[str, str]:
        return {"exchange": "celeryev", "write": ".*", "read": r"^worker\..*"}


def plan(url: str, queue: str, management_url: str | None) -> RabbitPlan:
    """The plan for a queue on this broker; RabbitUnreachable if its management API cannot be
    asked, PermissionError if its user may not manage users."""
    target = management_target(url, management_url)
    try:
        who = requests.get(f"{target.base}/api/whoami", auth=target.auth, timeout=TIMEOUT)
    except requests.RequestException as exc:
        raise RabbitUnreachable(f"its management API ({type(exc).__name__})") from None
    if who.status_code != 200:
        raise RabbitUnreachable(f"its management API (HTTP {who.status_code})")
    tags = who.json().get("tags") if isinstance(who.json(), dict) else None
    tags = tags if isinstance(tags, list) else str(tags or "").split(",")
    if "administrator" not in tags:
        raise PermissionError(
            "the broker's user may not manage users (it needs the administrator tag)"
        )
    return RabbitPlan(url, target.base, target.auth, target.vhost, queue, target.host, target.port)


SHARED_EXCHANGES = {"celeryev": "topic", "celery.pidbox": "fanout", "reply.celery.pidbox": "direct"}
"""The exchanges every worker shares, and their types."""


def other_queues_bound(plan: RabbitPlan) -> list[str]:
    """The destinations other than the queue itself that its exchange routes to."""
    vhost, name = quote(plan.vhost, safe=""), quote(plan.queue, safe="")
    resp = _call(plan, "GET", f"exchanges/{vhost}/{name}/bindings/source", allow_missing=True)
    data = resp.json() if resp.status_code == 200 else []
    found = {str(b.get("destination")) for b in data if isinstance(b, dict)}
    return sorted(d for d in found if d and d != plan.queue)


def shared_exchanges_intact(plan: RabbitPlan) -> list[str]:
    """What is wrong with the shared exchanges (missing ones are fine: a worker declares them);
    empty when nothing is."""
    vhost = quote(plan.vhost, safe="")
    wrong = []
    for name, kind in SHARED_EXCHANGES.items():
        resp = _call(plan, "GET", f"exchanges/{vhost}/{quote(name, safe='')}", allow_missing=True)
        if resp.status_code == 200 and resp.json().get("type") != kind:
            wrong.append(f"exchange {name!r} is {resp.json().get('type')!r}, not {kind!r}")
    return wrong


def _call(
    plan: ManagementAPI,
    method: str,
    path: str,
    json: object = None,
    allow_missing: bool = False,
    headers: dict[str, str] | None = None,
) -> requests.Response:
    try:
        resp = requests.request(
            method,
            f"{plan.management}/api/{path}",
            auth=plan.auth,
            json=json,
            timeout=TIMEOUT,
            headers=headers,
        )
    except requests.RequestException as exc:
        raise RabbitUnreachable(f"its management API ({type(exc).__name__})") from None
    missing_ok = (method == "DELETE" or allow_missing) and resp.status_code == 404
    if resp.status_code >= 400 and not missing_ok:
        raise RabbitUnreachable(f"its management API (HTTP {resp.status_code} on {method})")
    return resp


def create_user(plan: RabbitPlan, user: str, password: str) -> None:
    vhost, name = quote(plan.vhost, safe=""), quote(user, safe="")
    _call(plan, "PUT", f"users/{name}", {"password": password, "tags": ""})
    _call(plan, "PUT", f"permissions/{vhost}/{name}", plan.permissions(user))
    _call(plan, "PUT", f"topic-permissions/{vhost}/{name}", plan.topic_permissions())


def delete_user(plan: RabbitPlan, user: str) -> None:
    _call(plan, "DELETE", f"users/{quote(user, safe='')}")


def list_users(plan: RabbitPlan) -> list[str]:
    data = _call(plan, "GET", "users").json()
    if not isinstance(data, list):
        return []
    return [str(u.get("name")) for u in data if isinstance(u, dict)]


def close_connections(management: ManagementAPI, user: str, reason: str) -> int:
    """Close every AMQP connection of `user` (any vhost) through the management API, so the
    broker requeues its unacknowledged messages at once; returns how many it listed for the
    user and told to close (0: nothing was open). Other users' connections are untouched.

    `/api/connections/username/{user}` (RabbitMQ >= 3.8) lists from the broker's connection
    tracking, which sees a connection as soon as it opens, and its DELETE closes them all with
    the `X-Reason` the client is given. (Closing by name, `DELETE /api/connections/{name}`,
    only finds a connection once its first statistics arrived, about a second after it
    opened: a machine that reconnected just before would be missed; it is the fallback for
    brokers without the per-user endpoint.) The tracking may list a connection for a moment
    after it closed. Delete the user first when it must not reconnect: a connection opened
    after the call stays open."""
    # the reason travels in a header: printable ASCII, one line
    why = "".join(ch if " " <= ch <= "~" else "?" for ch in reason)[:200] or "closed"
    path = f"connections/username/{quote(user, safe='')}"
    listed = _call(management, "GET", path, allow_missing=True)
    if listed.status_code != 404:
        names = _connection_names(listed.json(), user)
        if not names:
            return 0
        closed = _call(management, "DELETE", path, headers={"X-Reason": why})
        if closed.status_code != 404:
            return len(names)
    # a broker without the per-user endpoint: list every connection, close the user's by name
    every = _call(management, "GET", "connections?columns=name,user").json()
    names = _connection_names(every, user)
    count = 0
    for name in names:
        resp = _call(
            management, "DELETE", f"connections/{quote(name, safe='')}", headers={"X-Reason": why}
        )
        if resp.status_code < 300:
            count += 1
    return count


def _connection_names(data: object, user: str) -> list[str]:
    return sorted(
        {
            str(c["name"])
            for c in (data if isinstance(data, list) else [])
            if isinstance(c, dict) and c.get("user") == user and c.get("name")
        }
    )
