"""The one money rule (`policy.billing`), by properties over random machine lives.

A life is a random walk along the lifecycle's allowed moves (`lifecycle.ALLOWED_TRANSITIONS`)
with random stays, stopped and resumed any number of times. Whatever the life and the window:

- every state says what it bills, and what a cap counts agrees with the lifecycle's
  `LIVE_STATES` (a live machine may bill; a stopped one its disk only);
- the billed dollars are the sum over the intervals of their overlap with the window at their
  state's price (an oracle that joins nothing and clips each interval on its own);
- additive over a split of the window, never negative, at most the window at the dearer price;
- its seconds are the create-to-end span: from its move to `booting` to its end, in the window;
- a window inside a stop bills the storage price only, however many stops came before;
- the rate now is the bill's slope;
- an unknown price makes the dollars unknown exactly when some of it may be at that price;
- datetimes and the simulator's float seconds give one bill;
- the simulator's spans (`SimMachine`) are what they were before the rule (the old code kept
  here as the oracle), so its figures do not move.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from itertools import pairwise

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from autoscaler.lifecycle import ALLOWED_TRANSITIONS, FINAL_STATES, LIVE_STATES, InstanceState
from autoscaler.policy import billing
from autoscaler.policy.billing import Charge
from autoscaler.sim.engine import SimMachine

S = InstanceState
T0 = datetime(2026, 3, 1, tzinfo=UTC)
REL = 1e-9


@st.composite
def lives(draw, max_moves: int = 24) -> list[tuple[InstanceState, float]]:
    """Moves (state, at seconds) from `pending` along allowed moves, stays of 0 to 3 h."""
    state, at = S.PENDING, draw(st.floats(0, 3600, allow_nan=False))
    moves = [(state, at)]
    for _ in range(draw(st.integers(0, max_moves))):
        nxt = sorted(ALLOWED_TRANSITIONS[state])
        if not nxt:
            break
        # lean towards the warm pool's cycle, so lives stop and resume often
        cycle = {S.DRAINED: S.STOPPING, S.STOPPED: S.RESUMING, S.RESUMING: S.READY}
        if state in cycle and draw(st.integers(0, 3)) > 0:
            state = cycle[state]
        elif state == S.READY and draw(st.integers(0, 3)) > 0:
            state = S.DRAINING
        elif state == S.DRAINING and draw(st.integers(0, 3)) > 0:
            state = S.DRAINED
        else:
            state = draw(st.sampled_from(nxt))
        at += draw(st.one_of(st.just(0.0), st.floats(0, 3 * 3600, allow_nan=False)))
        moves.append((state, at))
    return moves


prices = st.floats(0, 50, allow_nan=False)
maybe_prices = st.one_of(st.none(), prices)
offsets = st.floats(-3600, 40 * 3 * 3600, allow_nan=False)


def oracle(
    life: list[billing.Interval[float]],
    price: float,
    storage: float,
    until: float,
    since: float | None,
) -> tuple[float, float, float]:
    """(full seconds, storage seconds, dollars): each interval clipped alone, nothing joined."""
    full = stored = 0.0
    for i in life:
        lo = i.start if since is None else max(i.start, since)
        hi = min(until if i.end is None else i.end, until)
        seconds = max(0.0, hi - lo)
        c = billing.charge(i.state)
        if c is Charge.FULL:
            full += seconds
        elif c is Charge.STORAGE:
            stored += seconds
    return full, stored, (full * price + stored * storage) / 3600.0


def state_at(life: list[billing.Interval[float]], t: float) -> InstanceState | None:
    for i in life:
        if i.start <= t and (i.end is None or t < i.end):
            return i.state
    return None


def test_every_state_says_what_it_bills_and_caps_count_the_live_ones():
    assert set(billing.CHARGES) == set(InstanceState)
    assert {s for s in S if billing.committed(s) is not Charge.NONE} == set(LIVE_STATES)
    assert {s for s in S if billing.charge(s) is Charge.STORAGE} == {S.STOPPED}
    assert all(billing.charge(s) is Charge.NONE for s in FINAL_STATES)
    assert billing.charge(S.PENDING) is billing.charge(S.CREATING) is Charge.NONE
    assert billing.committed(S.PENDING) is billing.committed(S.CREATING) is Charge.FULL
    for s in S:
        if s not in billing.IN_FLIGHT:
            assert billing.committed(s) is billing.charge(s)
    assert billing.rate(S.STOPPED, 2.0, None) == 0.0
    assert billing.rate(S.STOPPED, 2.0, 0.01) == 0.01
    assert billing.rate(S.READY, None, 0.01) is None
    assert billing.rate(S.TERMINATED, 2.0, 0.01) == 0.0


@settings(max_examples=300, deadline=None)
@given(lives(), prices, prices, offsets, offsets, st.booleans())
def test_dollars_are_the_sum_over_intervals_and_never_negative(moves, price, storage, a, b, whole):
    life = billing.intervals(moves)
    since, until = (None, max(a, b)) if whole else (min(a, b), max(a, b))
    got = billing.bill(life, price, storage, until, since)
    full, stored, dollars = oracle(life, price, storage, until, since)
    assert got.full_seconds == pytest.approx(full, rel=REL, abs=1e-6)
    assert got.storage_seconds == pytest.approx(stored, rel=REL, abs=1e-6)
    assert got.dollars is not None
    assert got.dollars == pytest.approx(dollars, rel=REL, abs=1e-9)
    assert got.full_seconds >= 0 and got.storage_seconds >= 0 and got.dollars >= 0
    window = until - (since if since is not None else min(t for _, t in moves))
    assert got.seconds <= max(0.0, window) + 1e-6
    assert got.dollars <= max(price, storage) * max(0.0, window) / 3600.0 + 1e-9


@settings(max_examples=300, deadline=None)
@given(lives(), prices, prices, st.lists(offsets, min_size=2, max_size=6))
def test_additive_over_any_split_of_the_window(moves, price, storage, cuts):
    life = billing.intervals(moves)
    cuts = sorted(cuts)
    whole = billing.bill(life, price, storage, cuts[-1], cuts[0])
    parts = [billing.bill(life, price, storage, b, a) for a, b in pairwise(cuts)]
    assert whole.dollars is not None
    assert sum(p.dollars or 0.0 for p in parts) == pytest.approx(whole.dollars, rel=1e-9, abs=1e-9)
    assert sum(p.seconds for p in parts) == pytest.approx(whole.seconds, rel=1e-9, abs=1e-6)


@settings(max_examples=300, deadline=None)
@given(lives(), offsets, offsets)
def test_seconds_are_the_create_to_end_span(moves, a, b):
    life = billing.intervals(moves)
    since, until = min(a, b), max(a, b)
    created = next((i.start for i in life if i.state == S.BOOTING), None)
    if created is None:
        assert billing.bill(life, 1.0, 1.0, until, since).seconds == 0.0
        return
    ended = next((i.start for i in life if i.state in FINAL_STATES and i.start >= created), None)
    end = until if ended is None else min(ended, until)
    span = max(0.0, end - max(created, since))
    assert billing.bill(life, 1.0, 1.0, until, since).seconds == pytest.approx(span, abs=1e-6)


@settings(max_examples=300, deadline=None)
@given(lives(), prices, prices, st.floats(0, 1, allow_nan=False), st.floats(0, 1))
def test_a_window_inside_any_stop_bills_its_storage_price_only(moves, price, storage, x, y):
    life = billing.intervals(moves)
    stops = [i for i in life if i.state == S.STOPPED]
    for n, stop in enumerate(stops):
        end = stop.end if stop.end is not None else stop.start + 3600.0
        lo = stop.start + (end - stop.start) * min(x, y)
        hi = stop.start + (end - stop.start) * max(x, y)
        got = billing.bill(life, price, storage, hi, lo)
        assert got.full_seconds == 0.0, (n, stop)
        assert got.dollars == pytest.approx(storage * (hi - lo) / 3600.0, abs=1e-9)
        unknown = billing.bill(life, None, None, hi, lo)  # prices unknown: the disk's is 0
        assert unknown.dollars == 0.0


@settings(max_examples=300, deadline=None)
@given(lives(), prices, prices, offsets)
def test_the_rate_now_is_the_slope_of_the_bill(moves, price, storage, t):
    life = billing.intervals(moves)
    h = 1.0
    state = state_at(life, t)
    if state is None or state_at(life, t + h) != state:
        return
    before = billing.bill(life, price, storage, t)
    after = billing.bill(life, price, storage, t + h)
    assert before.dollars is not None and after.dollars is not None
    rate = billing.rate(state, price, storage)
    assert rate is not None
    assert after.dollars - before.dollars == pytest.approx(rate * h / 3600.0, abs=1e-9)


@settings(max_examples=300, deadline=None)
@given(lives(), maybe_prices, offsets, offsets)
def test_an_unknown_price_leaves_the_dollars_unknown_only_where_it_counts(moves, storage, a, b):
    life = billing.intervals(moves)
    since, until = min(a, b), max(a, b)
    got = billing.bill(life, None, storage, until, since)
    ran = any(billing.charge(i.state) is Charge.FULL for i in life)
    stopped = any(i.state == S.STOPPED for i in life)
    if got.full_seconds > 0 or (ran and not stopped):
        assert got.dollars is None
    else:
        assert got.dollars == pytest.approx((storage or 0.0) * got.storage_seconds / 3600.0)


@settings(max_examples=200, deadline=None)
@given(lives(), prices, prices, offsets, offsets)
def test_datetimes_and_virtual_seconds_bill_alike(moves, price, storage, a, b):
    since, until = min(a, b), max(a, b)
    by_float = billing.bill(billing.intervals(moves), price, storage, until, since)

    def at(s: float) -> datetime:
        return T0 + timedelta(seconds=s)

    dated = billing.intervals([(state, at(s)) for state, s in moves])
    by_date = billing.bill(dated, price, storage, at(until), at(since))
    assert by_date.seconds == pytest.approx(by_float.seconds, abs=1e-3)
    assert by_date.dollars == pytest.approx(by_float.dollars, abs=1e-6)


def test_moves_out_of_clock_order_are_taken_in_the_order_made():
    life = billing.intervals([(S.BOOTING, 100.0), (S.READY, 90.0), (S.TERMINATED, 200.0)])
    assert [(i.state, i.start, i.end) for i in life] == [
        (S.BOOTING, 100.0, 100.0),
        (S.READY, 100.0, 200.0),
        (S.TERMINATED, 200.0, None),
    ]
    assert billing.bill(life, 3.6, 0.0, 1000.0).dollars == pytest.approx(0.1)


def test_a_machine_stopped_and_resumed_twice_bills_both_stops_at_storage():
    hour = 3600.0
    moves = [
        (S.BOOTING, 0.0),
        (S.READY, 0.1 * hour),
        (S.STOPPED, 1 * hour),  # stopping left out: full price either way
        (S.RESUMING, 4 * hour),
        (S.READY, 4.1 * hour),
        (S.STOPPED, 5 * hour),
        (S.RESUMING, 8 * hour),
    ]
    got = billing.bill(billing.intervals(moves), 2.0, 0.01, 10 * hour)
    assert got.full_seconds == pytest.approx(4 * hour)
    assert got.storage_seconds == pytest.approx(6 * hour)
    assert got.dollars == pytest.approx(4 * 2.0 + 6 * 0.01)


# ---------------------------------------------------------------------- the simulator's spans


def old_running_spans(m: SimMachine, end: float) -> list[tuple[float, float]]:
    """`SimMachine.running_spans` before the rule (the oracle)."""
    until = m.ended_s if m.ended_s is not None else end
    spans, start = [], m.created_s
    for a, b in m.stopped:
        spans.append((start, min(a, until)))
        start = b if b is not None else until
    spans.append((start, until))
    return [(a, b) for a, b in spans if b > a]


def old_stopped_seconds(m: SimMachine, end: float) -> float:
    until = m.ended_s if m.ended_s is not None else end
    return sum(max(0.0, min(b if b is not None else until, until) - a) for a, b in m.stopped)


@st.composite
def sim_machines(draw) -> tuple[SimMachine, float]:
    t = draw(st.floats(0, 86400, allow_nan=False))
    created = t
    stopped: list[tuple[float, float | None]] = []
    for _ in range(draw(st.integers(0, 5))):
        t += draw(st.floats(0, 7200, allow_nan=False))
        a = t
        if draw(st.integers(0, 4)) == 0:
            stopped.append((a, None))
            break
        t += draw(st.floats(0, 7200, allow_nan=False))
        stopped.append((a, t))
    ended = None if draw(st.booleans()) else t + draw(st.floats(0, 7200, allow_nan=False))
    end = t + draw(st.floats(0, 7200, allow_nan=False))
    return SimMachine("m", created, 0.6, ended_s=ended, stopped=stopped), end


@settings(max_examples=500, deadline=None)
@given(sim_machines())
def test_the_simulators_spans_are_unchanged_to_the_last_bit(machine_end):
    m, end = machine_end
    assert m.running_spans(end) == old_running_spans(m, end)
    assert m.stopped_seconds(end) == old_stopped_seconds(m, end)
