"""Persisted first sightings on SQLite and PostgreSQL (the db_url fixture runs both)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from sqlalchemy import func, select

from autoscaler.store.db import transaction
from autoscaler.store.head_sightings import StoredSightings, forget_source, observe_heads
from autoscaler.store.models import QueueHeadSighting

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def test_first_seen_is_kept_while_the_head_stays_and_reset_when_it_changes(sessions):
    store = StoredSightings(sessions)
    assert store.observe("src", {"a": "m1", "b": None}, T0) == {"a": T0}
    t1 = T0 + timedelta(seconds=40)
    assert store.observe("src", {"a": "m1", "b": "n1"}, t1) == {"a": T0, "b": t1}
    t2 = t1 + timedelta(seconds=5)
    assert store.observe("src", {"a": "m2", "b": "n1"}, t2) == {"a": t2, "b": t1}
    # emptied: the row goes, a later head starts afresh even with a recycled id
    store.observe("src", {"a": None}, t2)
    t3 = t2 + timedelta(seconds=9)
    assert store.observe("src", {"a": "m2"}, t3) == {"a": t3}


def test_sources_are_separate_and_long_keys_fit(sessions):
    long_key = "q\x06\x169" + "x" * 400
    with transaction(sessions) as s:
        assert observe_heads(s, "one", {long_key: "id" * 150}, T0) == {long_key: T0}
        assert observe_heads(s, "two", {long_key: "other"}, T0 + timedelta(1)) == {
            long_key: T0 + timedelta(1)}
    with transaction(sessions) as s:
        assert observe_heads(s, "one", {long_key: "id" * 150}, T0 + timedelta(2)) == {
            long_key: T0}
        assert forget_source(s, "one") == 1
        assert s.scalar(select(func.count()).select_from(QueueHeadSighting)) == 1


def test_a_concurrent_writer_of_the_same_row_does_not_fail_the_tick(sessions):
    # another tick inserted the row between our read and our insert: on conflict do nothing
    with transaction(sessions) as s:
        s.add(QueueHeadSighting(source="src", queue="a", message_id="m1", first_seen_at=T0))
    with transaction(sessions) as s:
        assert observe_heads(s, "src", {"a": "m1"}, T0 + timedelta(seconds=3)) == {"a": T0}
