"""Celery on kombu's SQLAlchemy transport (the embedded broker), on SQLite and PostgreSQL."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

from celery import Celery
from kombu import Connection

from autoscaler.brokers import stamp
from autoscaler.brokers.embedded.celery_sqla import CelerySqlaReader
from tests.brokers.helpers import uninstall_stamp


def test_pending_oldest_and_consumed_rows_on_the_embedded_broker(db_url):
    broker = f"sqla+{db_url}"
    app = Celery("producer", broker=broker, set_as_current=False)
    t0 = time.time()
    stamp.install()
    try:
        app.send_task("t.x", queue="demo")
        app.send_task("t.x", queue="demo")
    finally:
        uninstall_stamp()
    t1 = time.time()  # the stamps were written between t0 and t1 (seconds apart under load)
    app.send_task("t.x", queue="plain")  # an unstamped producer
    app.send_task("t.x", queue="plain")
    app.close()
    clock = [datetime.fromtimestamp(t0 + 60, UTC)]
    reader = CelerySqlaReader(broker, clock=lambda: clock[0])
    conn = Connection(broker)
    try:  # a worker holds one message: kombu keeps its row, invisible
        msg = conn.channel().basic_get("demo", no_ack=False)
        assert msg is not None
        got = reader.read(["demo", "plain", "never-used"])
    finally:
        conn.release()  # (closing the channel restores the unacked message as a new row)
    assert got["demo"].pending == 1
    age = got["demo"].oldest_pending_age
    # (to the microsecond the reader's clock is kept to)
    assert age is not None and 60 - (t1 - t0) - 1e-5 <= age <= 60 + 1e-5, (age, t1 - t0)
    assert (got["plain"].pending, got["plain"].oldest_pending_age) == (2, 0.0)  # first sighting
    assert (got["never-used"].pending, got["never-used"].oldest_pending_age) == (0, None)
    clock[0] += timedelta(seconds=25)
    assert reader.read(["plain"])["plain"].oldest_pending_age == 25.0
    reader.close()


def test_a_broker_database_never_used_reads_as_empty(tmp_path):
    reader = CelerySqlaReader(f"sqla+sqlite:///{tmp_path / 'nothing.db'}")
    got = reader.read(["q"])["q"]
    assert (got.pending, got.stale) == (0, False)
