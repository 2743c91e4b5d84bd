"""Celery queues on RabbitMQ: the management API first, passive declare as the fallback.

One GET of `/api/queues/{vhost}?columns=...` answers every queue of the vhost: ready
(`messages_ready`), in flight (`messages_unacknowledged`: with Celery's default early acks the
prefetched jobs that have not started, never the running ones; ETA jobs a worker holds are in
it too, and the workers' report moves them to `scheduled`), `consumers`,
`head_message_timestamp` (the AMQP `timestamp` property of the head message, which
`brokers.stamp` sets) and the cumulative deliveries (`message_stats.deliver_get`).

Unstamped producers: RabbitMQ shows no message without consuming it (a peek with requeue would
reorder the queue and count deliveries on quorum queues), so the age of the oldest ready message
is bounded from the counters alone (`brokers.marks.DeliveryMarks`): having seen D messages ready
at t, while fewer than D have been delivered since, one of them still waits, so the oldest is at
least now - t old. The marks are kept through `Sightings` (restart-proof). What RabbitMQ cannot
show: ETA / countdown jobs still in a queue (no worker has fetched them) count as pending.

A queue missing from the answer or with incomplete statistics (the
management database samples every few seconds, so a brand-new queue has none yet) is asked by
`queue_declare(passive=True)`: ready + consumers, no unacked count, no head age. If the
management API fails altogether, every queue is read by passive declare: the ready count is
fresh, so the reading is not stale (scale-up from zero keeps working), in flight is 0 and the
age unknown, and `error` says the management API failed. Only when both paths fail does `read`
raise (and the fallback serves stale last-known numbers). A queue that does not exist is an
empty queue.

Credentials: from the AMQP URL, or from `management_url` when it carries its own; they are sent
as HTTP basic auth and never appear in an error text.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any
from urllib.parse import quote, urlsplit, urlunsplit

import amqp
import requests
from kombu.utils.url import parse_url

from autoscaler.brokers.base import (
    Clock,
    Mark,
    ReaderBuild,
    Secrets,
    SightingsMemo,
    SourceError,
    failed_metrics,
    safe_error,
    utc_now,
)
from autoscaler.brokers.base import Sightings as SightingsPort
from autoscaler.brokers.marks import DeliveryMarks, advance_deliveries
from autoscaler.config.metrics_sources import CelerySource
from autoscaler.policy.snapshot import QueueMetrics

_COLUMNS = (
    "name,messages_ready,messages_unacknowledged,consumers,head_message_timestamp,"
    "message_stats.deliver_get,message_stats.deliver_get_details.rate"
)
STATS_INTERVAL = 10.0
"""Seconds of deliveries that may fall between the management API's samples of a queue's depth
and of its counters (its collection interval is 5 s): subtracted from each delivery mark."""


@dataclass(frozen=True)
class Passive:
    ready: int
    consumers: int


@dataclass(frozen=True)
class ManagementTarget:
    """Where a RabbitMQ broker's management API is, and as whom to call it."""

    base: str  # scheme://host:port[/path], no credentials
    auth: tuple[str, str]
    vhost: str
    host: str
    port: int
    amqp_auth: tuple[str, str]


def management_target(url: str, management_url: str | None = None) -> ManagementTarget:
    """The management API of the broker at amqp `url`: `management_url` when given (its own
    credentials, else the broker's), else the broker's host on port 15672."""
    parts = parse_url(url)
    host = parts.get("hostname") or "127.0.0.1"
    amqp_auth = (parts.get("userid") or "guest", parts.get("password") or "guest")
    m = urlsplit(management_url or f"http://{host}:15672")
    auth = (m.username, m.password or "") if m.username is not None else amqp_auth
    netloc = m.hostname or host
    if m.port:
        netloc = f"{netloc}:{m.port}"
    return ManagementTarget(
        base=urlunsplit((m.scheme or "http", netloc, m.path.rstrip("/"), "", "")),
        auth=auth,
        vhost=parts.get("virtual_host") or "/",
        host=host,
        port=int(parts.get("port") or 5672),
        amqp_auth=amqp_auth,
    )


class CeleryRabbitMQReader:
    """`MetricsReader` for Celery on RabbitMQ (`source: celery` with an amqp:// URL)."""

    def __init__(
        self,
        url: str,
        *,
        management_url: str | None = None,
        sightings: SightingsPort | None = None,
        clock: Clock = utc_now,
        timeout: float = 5.0,
    ) -> None:
        self._secrets = Secrets.from_urls(url, management_url)
        target = management_target(url, management_url)
        self._host, self._port = target.host, target.port
        self._user, self._password = target.amqp_auth
        self._vhost = target.vhost
        self._ssl = url.startswith(("amqps://", "pyamqps://"))
        self._timeout = timeout
        self._clock = clock
        self._sightings: SightingsPort = sightings or SightingsMemo()
        self._auth = target.auth
        self._mgmt = target.base
        self._http = requests.Session()
        self.source_id = f"celery-rabbitmq:{self._host}:{self._port}/{self._vhost}"
        self.last_consumers: dict[str, int] = {}
        """Consumers per queue seen by the last read (QueueMetrics has no field for a count)."""

    # ----------------------------------------------------------------- management API

    def _management(self) -> dict[str, dict[str, Any]]:
        url = f"{self._mgmt}/api/queues/{quote(self._vhost, safe='')}"
        resp = self._http.get(
            url, params={"columns": _COLUMNS}, auth=self._auth, timeout=self._timeout
        )
        if resp.status_code != 200:
            raise SourceError(f"{self.source_id}: management API answered {resp.status_code}")
        rows = resp.json()
        if not isinstance(rows, list):
            raise SourceError(f"{self.source_id}: management API answer is not a list")
        return {r["name"]: r for r in rows if isinstance(r, dict) and "name" in r}

    # ----------------------------------------------------------------- passive declare

    def _passive(self, queues: Sequence[str]) -> dict[str, Passive | None]:
        """Ready and consumers per queue; None for a queue that does not exist."""
        conn = amqp.Connection(
            host=f"{self._host}:{self._port}",
            userid=self._user,
            password=self._password,
            virtual_host=self._vhost,
            ssl=self._ssl,
            connect_timeout=self._timeout,
            read_timeout=self._timeout,
            write_timeout=self._timeout,
        )
        out: dict[str, Passive | None] = {}
        try:
            conn.connect()
            ch = conn.channel()
            for q in queues:
                try:
                    _, ready, consumers = ch.queue_declare(q, passive=True)
                    out[q] = Passive(int(ready), int(consumers))
                except amqp.exceptions.NotFound:
                    out[q] = None
                    ch = conn.channel()  # the broker closed the channel on 404
        finally:
            with contextlib.suppress(Exception):  # already gone; nothing to release
                conn.close()
        return out

    # ----------------------------------------------------------------- read

    def read(self, queues: Sequence[str]) -> dict[str, QueueMetrics]:
        now = self._clock()
        queues = list(dict.fromkeys(queues))
        mgmt_error: str | None = None
        try:
            rows = self._management()
        except SourceError as exc:
            rows, mgmt_error = None, str(exc)
        except (requests.RequestException, ValueError) as exc:
            rows = None
            mgmt_error = safe_error(exc, self._secrets, f"{self.source_id} management API")

        out: dict[str, QueueMetrics] = {}
        ask: list[str] = []
        counted: dict[str, dict[str, Any]] = {}
        for q in queues:
            row = rows.get(q) if rows is not None else None
            if row is None or not isinstance(row.get("messages_ready"), int):
                ask.append(q)
                continue
            out[q] = self._from_row(q, row, now)
            counted[q] = row
        self._bound_unstamped_ages(out, counted, now)
        if ask:
            try:
                passive = self._passive(ask)
            except (OSError, amqp.exceptions.AMQPError) as exc:
                error = safe_error(exc, self._secrets, f"{self.source_id} passive declare")
                if rows is None or len(ask) == len(queues):
                    raise SourceError(
                        f"{mgmt_error or 'management API incomplete'}; {error}"
                    ) from None
                passive = {}
                for q in ask:  # management answered for the others: these are unknown
                    out[q] = failed_metrics(q, now, error)
            for q, p in passive.items():
                self.last_consumers[q] = p.consumers if p else 0
                if p is None:
                    out[q] = QueueMetrics(
                        queue=q, pending=0, oldest_pending_age=None, in_flight=0, read_at=now
                    )
                elif rows is None:  # fresh ready count; unacked and head age unknown
                    out[q] = QueueMetrics(
                        queue=q,
                        pending=p.ready,
                        oldest_pending_age=None,
                        in_flight=0,
                        read_at=now,
                        error=f"{mgmt_error}; read by passive declare (no unacked count)",
                    )
                else:  # a queue too new for the management statistics: its ready count is exact
                    out[q] = QueueMetrics(
                        queue=q, pending=p.ready, oldest_pending_age=None, in_flight=0, read_at=now
                    )
        return {q: out[q] for q in queues}

    def _from_row(self, q: str, row: dict[str, Any], now: datetime) -> QueueMetrics:
        self.last_consumers[q] = int(row.get("consumers") or 0)
        ready = int(row.get("messages_ready") or 0)
        head = row.get("head_message_timestamp")
        age = None
        if ready and isinstance(head, int | float) and not isinstance(head, bool):
            age = max(0.0, now.timestamp() - float(head))
        return QueueMetrics(
            queue=q,
            pending=ready,
            oldest_pending_age=age,
            in_flight=int(row.get("messages_unacknowledged") or 0),
            read_at=now,
        )

    def _bound_unstamped_ages(
        self, out: dict[str, QueueMetrics], rows: dict[str, dict[str, Any]], now: datetime
    ) -> None:
        """Ages of queues without a head timestamp, bounded from the delivery counters (one
        store transaction for every queue of the read)."""
        if not rows:
            return
        now_ts = now.timestamp()
        bounds: dict[str, float] = {}

        def update(prior: dict[str, Mark]) -> dict[str, Mark | None]:
            new: dict[str, Mark | None] = {}
            for q, row in rows.items():
                stats = row.get("message_stats")
                stats = stats if isinstance(stats, dict) else {}
                delivered = _int(stats.get("deliver_get"))
                details = stats.get("deliver_get_details")
                rate = details.get("rate") if isinstance(details, dict) else None
                margin = (
                    int(rate * STATS_INTERVAL) + 1
                    if isinstance(rate, int | float) and not isinstance(rate, bool) and rate > 0
                    else 0
                )
                text, at = prior.get(q, (None, None))
                marks, since = advance_deliveries(
                    DeliveryMarks.decode(text, at), out[q].pending, delivered, now_ts, margin
                )
                new[q] = marks.encode() if out[q].pending > 0 else None
                if since is not None:
                    bounds[q] = since
            return new

        try:
            self._sightings.update_marks(self.source_id, list(rows), update)
        except Exception as exc:  # the store is down: ages unknown, counts kept
            logging.getLogger(__name__).warning(
                "delivery marks of %s unavailable: %s", self.source_id, type(exc).__name__
            )
            return
        for q, since in bounds.items():
            m = out[q]
            age = max(0.0, now_ts - since)
            if m.oldest_pending_age is None or age > m.oldest_pending_age:
                out[q] = replace(m, oldest_pending_age=age)

    def close(self) -> None:
        self._http.close()


def _int(value: Any) -> int:
    return int(value) if isinstance(value, int) and not isinstance(value, bool) else 0


def build(source: CelerySource, ctx: ReaderBuild) -> CeleryRabbitMQReader:
    """Celery's reader on RabbitMQ (`brokers.registry.CELERY_TRANSPORTS`)."""
    return CeleryRabbitMQReader(
        ctx.url,
        management_url=source.management_url,
        sightings=ctx.sightings,
        clock=ctx.clock,
        timeout=ctx.timeout,
    )
