"""Persisted first sightings on SQLite and PostgreSQL (the db_url fixture runs both)."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta

from sqlalchemy import event, func, select

from autoscaler.store.db import transaction
from autoscaler.store.head_sightings import StoredSightings, observe_heads
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
            long_key: T0 + timedelta(1)
        }
    with transaction(sessions) as s:
        assert observe_heads(s, "one", {long_key: "id" * 150}, T0 + timedelta(2)) == {long_key: T0}
        rows = select(QueueHeadSighting.source, func.count()).group_by(QueueHeadSighting.source)
        assert {source: n for source, n in s.execute(rows)} == {"one": 1, "two": 1}


def test_a_row_another_tick_wrote_earlier_is_kept(sessions):
    with transaction(sessions) as s:
        s.add(QueueHeadSighting(source="src", queue="a", message_id="m1", first_seen_at=T0))
    with transaction(sessions) as s:
        assert observe_heads(s, "src", {"a": "m1"}, T0 + timedelta(seconds=3)) == {"a": T0}


def test_two_ticks_racing_for_the_same_first_sighting_agree_and_neither_fails(engine, sessions):
    """Two ticks (own threads, own connections) both read "no row" for (source, queue), then
    both insert: the loser's insert meets the winner's row (on PostgreSQL it waits for the
    winner's commit, on SQLite for its write lock) and must do nothing, then read the winner's
    first_seen_at back. The barrier holds each insert until both ticks have read."""
    both_read = threading.Barrier(2, timeout=20)
    inserts: list[str] = []

    def hold_insert(conn, cursor, statement, parameters, context, executemany):
        if statement.lstrip().upper().startswith("INSERT INTO QUEUE_HEAD_SIGHTINGS"):
            inserts.append(statement)
            both_read.wait()  # BrokenBarrierError (reported below) if the other never got here

    event.listen(engine, "before_cursor_execute", hold_insert)
    store = StoredSightings(sessions)
    at = {"one": T0, "two": T0 + timedelta(seconds=3)}
    got: dict[str, dict[str, datetime]] = {}
    errors: list[BaseException] = []

    def tick(name: str) -> None:
        try:
            got[name] = store.observe("src", {"a": "m1"}, at[name])
        except BaseException as exc:  # reported by the assertion below
            errors.append(exc)

    threads = [threading.Thread(target=tick, args=(n,)) for n in at]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
    finally:
        event.remove(engine, "before_cursor_execute", hold_insert)
    assert not any(t.is_alive() for t in threads)
    assert errors == [], errors
    assert len(inserts) == 2  # both really raced: each read "no row" and inserted
    first = got["one"]["a"]
    assert first in at.values()
    assert got == {"one": {"a": first}, "two": {"a": first}}
    with transaction(sessions) as s:
        rows = s.execute(
            select(QueueHeadSighting.message_id, QueueHeadSighting.first_seen_at)
        ).all()
    assert [tuple(r) for r in rows] == [("m1", first)]


def test_marks_round_trip_update_and_forget_in_one_transaction(sessions):
    """`update_marks`: the stored marks of the keys asked are handed over, what comes back is
    written (None deletes), other keys and sources are untouched; an old head row is readable."""
    store = StoredSightings(sessions)
    long_key = "q\x06\x169" + "y" * 400
    store.observe("src", {"old": "m1"}, T0)  # a row the head-only tracker wrote
    seen: list[dict] = []

    def first(prior):
        seen.append(dict(prior))
        return {"a": ("w1|abc:0", T0), long_key: ("w1|def:0;0123456789:5000", T0), "b": None}

    store.update_marks("src", ["a", long_key, "old", "b"], first)
    assert seen[-1] == {"old": ("m1", T0)}

    def second(prior):
        seen.append(dict(prior))
        return {"a": None, long_key: ("w1|def:0", T0 + timedelta(seconds=1))}

    store.update_marks("src", ["a", long_key, "old"], second)
    assert seen[-1] == {
        "a": ("w1|abc:0", T0),
        long_key: ("w1|def:0;0123456789:5000", T0),
        "old": ("m1", T0),
    }
    store.update_marks("src", ["a", long_key], lambda prior: seen.append(dict(prior)) or {})
    assert seen[-1] == {long_key: ("w1|def:0", T0 + timedelta(seconds=1))}
    store.update_marks("other", [long_key], lambda prior: seen.append(dict(prior)) or {})
    assert seen[-1] == {}
