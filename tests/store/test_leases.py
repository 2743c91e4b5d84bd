"""Leases have one holder at a time and tick slots are claimed once, even under races."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta

from hypothesis import given, settings
from hypothesis import strategies as st

from autoscaler.store import leases, retention
from autoscaler.store.db import make_engine, session_factory, transaction
from autoscaler.store.models import Base
from tests.store.helpers import holder_of

T0 = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)


def test_one_holder_until_expiry_then_takeover(sessions):
    with transaction(sessions) as s:
        assert leases.acquire(s, "beat", "a", 30, T0)
    with transaction(sessions) as s:
        assert not leases.acquire(s, "beat", "b", 30, T0 + timedelta(seconds=29))
        assert holder_of(s, "beat", T0 + timedelta(seconds=29)) == "a"
    with transaction(sessions) as s:  # the holder renews
        assert leases.acquire(s, "beat", "a", 30, T0 + timedelta(seconds=29))
    with transaction(sessions) as s:
        assert not leases.acquire(s, "beat", "b", 30, T0 + timedelta(seconds=58))
        assert leases.acquire(s, "beat", "b", 30, T0 + timedelta(seconds=60))
    with transaction(sessions) as s:
        leases.release(s, "beat", "a")  # not a's anymore: no effect
        assert holder_of(s, "beat", T0 + timedelta(seconds=61)) == "b"
        leases.release(s, "beat", "b")
        assert holder_of(s, "beat", T0 + timedelta(seconds=61)) is None


def test_tick_slot_is_claimed_once(sessions):
    with transaction(sessions) as s:
        assert leases.claim_ticks(s, [("q", 100)], "beat-1", T0) == {"q"}
    with transaction(sessions) as s:
        assert leases.claim_ticks(s, [("q", 100)], "beat-2", T0) == set()
        assert leases.claim_ticks(s, [("other", 100)], "beat-2", T0) == {"other"}
        assert leases.claim_ticks(s, [("q", 101)], "beat-2", T0) == {"q"}
    with transaction(sessions) as s:  # forgotten by retention an hour on
        rule = next(r for r in retention.RULES if r.table == "tick_slots")
        assert retention.forget(s, rule, T0 + timedelta(minutes=59)) == 0
        assert retention.forget(s, rule, T0 + timedelta(hours=1, seconds=1)) == 3


def test_racing_processes_get_exactly_one_lease_and_one_claim(pg_url):
    engine = make_engine(pg_url, pool_size=10)
    Base.metadata.create_all(engine)
    factory = session_factory(engine)
    start = threading.Barrier(8)
    won_lease: list[str] = []
    won_tick: list[str] = []

    def contender(name: str) -> None:
        start.wait()
        with transaction(factory) as s:
            if leases.acquire(s, "loop", name, 30, T0):
                won_lease.append(name)
        with transaction(factory) as s:
            if leases.claim_ticks(s, [("q", 7)], name, T0):
                won_tick.append(name)

    threads = [threading.Thread(target=contender, args=(f"w{i}",)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    engine.dispose()
    assert len(won_lease) == 1
    assert len(won_tick) == 1


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from("abc"), st.integers(0, 120)), min_size=1, max_size=15))
def test_no_two_holders_at_any_time(tmp_path_factory, events):
    """Whatever order of attempts, a granted lease never overlaps another holder's."""
    path = tmp_path_factory.mktemp("lease") / "s.db"
    engine = make_engine(f"sqlite:///{path}")
    Base.metadata.create_all(engine)
    factory = session_factory(engine)
    granted: list[tuple[str, datetime, datetime]] = []
    for holder, offset in sorted(events, key=lambda e: e[1]):
        now = T0 + timedelta(seconds=offset)
        with transaction(factory) as s:
            if leases.acquire(s, "x", holder, 30, now):
                granted.append((holder, now, now + timedelta(seconds=30)))
    engine.dispose()
    for i, (h1, _start1, end1) in enumerate(granted):
        for h2, start2, _end2 in granted[i + 1 :]:
            if h1 != h2:
                assert start2 >= end1, (h1, h2)


def test_racing_shard_leases_never_overlap(pg_url):
    """8 threads take and give up evaluation leases of random splits (1, 2 or 3 shards) for
    a few hundred rounds: whatever is held at once is one split, each shard by one holder (the
    check and the take are one step under an advisory lock; without it two splits overlap)."""
    import random
    import time

    engine = make_engine(pg_url, pool_size=10)
    Base.metadata.create_all(engine)
    factory = session_factory(engine)
    held: dict[str, tuple[int, int]] = {}
    guard = threading.Lock()
    problems: list[str] = []
    start = threading.Barrier(8)

    def contender(me: str, seed: int) -> None:
        rng = random.Random(seed)
        start.wait()
        for _ in range(40):
            shards = rng.choice((1, 2, 3))
            shard = rng.randrange(shards)
            now = datetime.now(UTC)
            with transaction(factory) as s:
                got = leases.acquire_evaluation(s, shard, shards, me, 30, now)
            if not got:
                continue
            with guard:
                others = set(held.values())
                if any(n != shards or i == shard for n, i in others):
                    problems.append(f"{me} took {shard}/{shards} while {sorted(others)} held")
                held[me] = (shards, shard)
            with transaction(factory) as s:  # the decision: renewed, its lock held to commit
                renewed = leases.acquire_evaluation(s, shard, shards, me, 30, now, renew=True)
                time.sleep(rng.random() * 0.003)
            if not renewed:
                problems.append(f"{me} could not renew {shard}/{shards} it held")
            with guard:
                del held[me]
            with transaction(factory) as s:
                leases.release(s, leases.evaluation_lease(shard, shards), me)

    threads = [threading.Thread(target=contender, args=(f"w{i}", i)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    engine.dispose()
    assert not problems, problems[:5]
