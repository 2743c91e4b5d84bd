"""The age marks of unstamped queues: never an age above the truth, and no reset on every pop."""

from __future__ import annotations

from collections import deque
from datetime import UTC, datetime

from hypothesis import given, settings
from hypothesis import strategies as st

from autoscaler.brokers.marks import (
    MAX_TEXT,
    DeliveryMarks,
    WindowMarks,
    advance_deliveries,
    advance_window,
    id_hash,
)

steps = st.lists(
    st.tuples(st.integers(0, 4), st.integers(0, 4), st.booleans()), min_size=1, max_size=60
)


@settings(max_examples=300, deadline=None)
@given(steps, st.integers(1, 12))
def test_window_marks_never_claim_a_message_waited_longer_than_it_did(ticks, window):
    """A FIFO list: each tick pushes some, pops some, and sometimes the reader looks at the
    oldest `window` ids. Every first-sighting time is at or after the message's push, the bound
    always fits the store, and a message seen once keeps its sighting while it stays in view."""
    queue: deque[tuple[str, int]] = deque()
    marks = WindowMarks()
    seen_at: dict[str, float] = {}
    n = 0
    for t, (push, pop, look) in enumerate(ticks):
        for _ in range(push):
            queue.append((f"m{n}", t))
            n += 1
        for _ in range(min(pop, len(queue))):
            queue.popleft()
        if not look:
            continue
        view = list(queue)[:window]
        stored = marks.encode()
        marks = WindowMarks.decode(*stored) if stored else WindowMarks()
        marks, first = advance_window(marks, [id_hash(m) for m, _ in view], float(t))
        assert len(first) == len(view)
        for (m, pushed), at in zip(view, first, strict=True):
            assert pushed <= at <= t  # a lower bound on the wait, never more
            if m in seen_at and len(marks.groups) < 8:
                assert at <= seen_at[m]  # not reset while it stays in view
            seen_at.setdefault(m, at)
        encoded = marks.encode()
        assert encoded is None or len(encoded[0]) <= MAX_TEXT


def test_under_a_steady_drain_the_head_keeps_its_first_sighting():
    """One job leaves every minute, one arrives: the head's bound is when it was first seen near
    the head, so it grows with the queue's real wait instead of resetting to zero."""
    queue = deque(f"m{i}" for i in range(10))
    marks = WindowMarks()
    firsts = []
    for minute in range(30):
        marks, first = advance_window(marks, [id_hash(m) for m in queue], minute * 60.0)
        firsts.append(minute * 60.0 - first[0])
        queue.popleft()
        queue.append(f"m{10 + minute}")
    # the queue holds 10 jobs and drains one a minute: every head has waited 10 minutes; the
    # bound (8 marks for 10 sightings) says at least 8, where the head alone said 0
    assert all(8 * 60 <= f <= 10 * 60 for f in firsts[10:]), firsts


def test_an_old_head_row_keeps_its_age_after_an_upgrade():
    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    old = WindowMarks.decode("3c9f-task-id", t0)
    now = t0.timestamp() + 50
    _, first = advance_window(old, [id_hash("3c9f-task-id"), id_hash("next")], now)
    assert first == [t0.timestamp(), now]
    assert WindowMarks.decode("x|y", t0) == WindowMarks(((id_hash("x|y"), t0.timestamp()),))
    assert WindowMarks.decode("w1|abc:notanumber", t0) == WindowMarks()


ops = st.lists(
    st.tuples(st.integers(0, 5), st.integers(0, 5), st.integers(0, 3)), min_size=1, max_size=60
)


@settings(max_examples=300, deadline=None)
@given(ops)
def test_delivery_marks_never_claim_more_than_the_oldest_ready_message_waited(ticks):
    """A queue with publishes and deliveries (some redelivered after a requeue): from the ready
    depth and the cumulative deliveries alone, the bound is never above the true wait."""
    ready: deque[int] = deque()
    delivered = 0
    marks = DeliveryMarks()
    for t, (publish, deliver, requeue) in enumerate(ticks):
        for _ in range(publish):
            ready.append(t)
        taken = []
        for _ in range(min(deliver, len(ready))):
            taken.append(ready.popleft())
            delivered += 1
        for pushed in taken[:requeue]:  # rejected and requeued at the head
            ready.appendleft(pushed)
        stored = marks.encode()
        marks = DeliveryMarks.decode(*stored) if stored else DeliveryMarks()
        marks, since = advance_deliveries(marks, len(ready), delivered, float(t))
        if since is not None:
            assert ready, "a bound for an empty queue"
            assert since >= min(ready), (since, min(ready))
        encoded = marks.encode()
        assert encoded is None or len(encoded[0]) <= MAX_TEXT


def test_delivery_marks_hold_while_fewer_than_the_depth_were_delivered():
    marks, since = advance_deliveries(DeliveryMarks(), ready=4, delivered=10, now=100.0)
    assert since is None or since == 100.0
    marks, since = advance_deliveries(marks, ready=4, delivered=10, now=160.0)
    assert since == 160.0 or since == 100.0
    marks, since = advance_deliveries(DeliveryMarks((), 10), ready=4, delivered=10, now=100.0)
    assert since == 100.0
    marks, since = advance_deliveries(marks, ready=3, delivered=13, now=200.0)
    assert since == 100.0  # 3 delivered of the 4 seen: one of them still waits
    marks, since = advance_deliveries(marks, ready=3, delivered=14, now=260.0)
    assert since != 100.0  # all 4 delivered: that sighting says nothing any more
    marks, since = advance_deliveries(marks, ready=0, delivered=17, now=300.0)
    assert since is None and marks.marks == ()
