"""Celery on kombu's SQLAlchemy transport (the embedded default broker), measured for real.

kombu keeps a row per message in `kombu_message` (id, visible, timestamp, payload, queue_id)
and a row per queue in `kombu_queue` (id, name). Facts from kombu 5.7 that shape this reader:

- a consumed message is not deleted: `_get` flips `visible` to false and leaves the row, and
  acks delete nothing, so delivered-but-running and finished messages cannot be told apart:
  in flight is unknown here (0);
- the `timestamp` column is only written on update (it is NULL while a message is pending), so
  it cannot age a pending message; the payload is the same JSON envelope as on Redis, so the
  age comes from the `brokers.stamp` header, or is bounded by first sighting of the head id;
- the next message to run is the visible row with the smallest id.

pending = count of visible rows per queue; one SELECT answers every queue (count, head row).
Table names follow the transport options `queue_tablename` / `message_tablename`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import make_url
from sqlalchemy.exc import SQLAlchemyError

from autoscaler.brokers.base import (
    Clock,
    ReaderBuild,
    Secrets,
    SightingsMemo,
    SourceError,
    max_age,
    observe_safely,
    parse_celery_envelope,
    safe_error,
    utc_now,
)
from autoscaler.brokers.base import Sightings as SightingsPort
from autoscaler.config.metrics_sources import CelerySource
from autoscaler.policy.snapshot import QueueMetrics
from autoscaler.settings import redact_url


def broker_db_url(url: str) -> str:
    """`sqla+sqlite:///x.db` -> `sqlite:///x.db` (the SQLAlchemy URL under kombu's scheme)."""
    return url.split("+", 1)[1] if url.startswith("sqla+") else url


class CelerySqlaReader:
    """`MetricsReader` for Celery on kombu's SQLAlchemy transport (`sqla+...` URLs)."""

    def __init__(
        self,
        url: str,
        *,
        queue_tablename: str = "kombu_queue",
        message_tablename: str = "kombu_message",
        sightings: SightingsPort | None = None,
        clock: Clock = utc_now,
        timeout: float = 5.0,
    ) -> None:
        self._secrets = Secrets.from_urls(url, broker_db_url(url))
        db_url = make_url(broker_db_url(url))
        if db_url.get_backend_name() == "sqlite":
            db_url = db_url.set(drivername="sqlite+pysqlite")
            self._engine = sa.create_engine(db_url, connect_args={"timeout": timeout})
        elif db_url.get_backend_name() == "postgresql":
            if db_url.drivername == "postgresql":
                db_url = db_url.set(drivername="postgresql+psycopg")
            self._engine = sa.create_engine(
                db_url, pool_pre_ping=True, connect_args={"connect_timeout": max(1, int(timeout))}
            )
        else:
            self._engine = sa.create_engine(db_url, pool_pre_ping=True)
        meta = sa.MetaData()
        self._q = sa.Table(
            queue_tablename, meta, sa.Column("id", sa.Integer), sa.Column("name", sa.String(200))
        )
        self._m = sa.Table(
            message_tablename,
            meta,
            sa.Column("id", sa.BigInteger),
            sa.Column("visible", sa.Boolean),
            sa.Column("payload", sa.Text),
            sa.Column("queue_id", sa.Integer),
        )
        self._sightings: SightingsPort = sightings or SightingsMemo()
        self._clock = clock
        self.source_id = f"celery-sqla:{redact_url(broker_db_url(url))}"

    def _query(self, queues: Sequence[str]) -> sa.Select[Any]:
        q, m = self._q, self._m
        agg = (
            sa.select(m.c.queue_id, sa.func.count().label("n"), sa.func.min(m.c.id).label("head"))
            .where(m.c.visible == sa.true())
            .group_by(m.c.queue_id)
            .subquery()
        )
        head = m.alias("head")
        return (
            sa.select(q.c.name, agg.c.n, head.c.id, head.c.payload)
            .join(agg, agg.c.queue_id == q.c.id)
            .join(head, head.c.id == agg.c.head)
            .where(q.c.name.in_(list(queues)))
        )

    def read(self, queues: Sequence[str]) -> dict[str, QueueMetrics]:
        now = self._clock()
        queues = list(dict.fromkeys(queues))
        if not queues:
            return {}
        try:
            with self._engine.connect() as conn:
                rows = [tuple(r) for r in conn.execute(self._query(queues)).all()]
        except SQLAlchemyError as exc:
            if self._no_tables():
                rows = []  # the broker has never been used: every queue is empty
            else:
                cause = getattr(exc, "orig", None) or exc
                raise SourceError(safe_error(cause, self._secrets, self.source_id)) from None
        found = {name: (int(n), int(mid), payload) for name, n, mid, payload in rows}
        ids: dict[str, str | None] = {}
        ages: dict[str, list[float | None]] = {}
        for name in queues:
            if name not in found:
                ids[name] = None
                continue
            _, mid, payload = found[name]
            info = parse_celery_envelope(payload)
            if info.published_at is not None:
                ages[name] = [max(0.0, now.timestamp() - info.published_at)]
                ids[name] = None
            else:
                ids[name] = f"row:{mid}"
        seen = observe_safely(self._sightings, self.source_id, ids, now)
        for name, first in seen.items():
            ages.setdefault(name, []).append(max(0.0, (now - first).total_seconds()))
        return {
            name: QueueMetrics(
                queue=name,
                pending=found[name][0] if name in found else 0,
                oldest_pending_age=max_age(ages.get(name, [])),
                in_flight=0,
                read_at=now,
            )
            for name in queues
        }

    def _no_tables(self) -> bool:
        try:
            return not sa.inspect(self._engine).has_table(self._m.name)
        except SQLAlchemyError:
            return False

    def close(self) -> None:
        self._engine.dispose()


def build(source: CelerySource, ctx: ReaderBuild) -> CelerySqlaReader:
    """Celery's reader on the embedded broker, kombu's SQL transport
    (`brokers.registry.CELERY_TRANSPORTS`)."""
    return CelerySqlaReader(ctx.url, sightings=ctx.sightings, clock=ctx.clock, timeout=ctx.timeout)
