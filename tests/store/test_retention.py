"""No table grows for ever, and retention never forgets what is still needed.

- every table of the schema says how it stays bounded (a rule, its own pruning, or a human's
  growth), and a new table that says nothing fails;
- hypothesis over rows of every ruled table at random ages and states, swept at a random time:
  everything past its keep is gone; a live machine, a hold or avoidance in force and anything
  younger than its keep is still there; a machine's state history goes with its row, and only
  then;
- tick slots after 1,000 polls × 100 queues with the sweep on its schedule stay within an
  hour's worth (they reached 100,000 rows without it).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import Column, Integer, Table, func, select

from autoscaler.lifecycle import LIVE_STATES, InstanceState
from autoscaler.store import leases, retention
from autoscaler.store.db import make_engine, session_factory, transaction
from autoscaler.store.models import (
    AvoidedHost,
    Base,
    Instance,
    InstanceTransition,
    MockMachine,
    ProviderRateLimit,
    ScaleEvent,
    TickSlot,
)
from tests.store.helpers import unaccounted

T0 = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)
KEEP = {r.table: r.keep for r in retention.RULES}


def test_every_table_says_how_it_stays_bounded() -> None:
    assert unaccounted() == set()
    throwaway = Table("throwaway_growth", Base.metadata, Column("id", Integer, primary_key=True))
    try:
        assert unaccounted() == {"throwaway_growth"}
    finally:
        Base.metadata.remove(throwaway)
    ruled = {r.table for r in retention.RULES}
    assert not ruled & set(retention.SELF_PRUNED) and not ruled & set(retention.BOUNDED)


ages = st.integers(min_value=0, max_value=200 * 86400)  # seconds before the sweep


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    slots=st.lists(ages, max_size=6),
    events=st.lists(ages, max_size=6),
    machines=st.lists(st.tuples(ages, st.sampled_from(list(InstanceState))), max_size=8),
    holds=st.lists(st.integers(-86400, 86400), max_size=3),
    avoided=st.lists(st.integers(-86400, 86400), max_size=3),
    mocks=st.lists(st.one_of(st.none(), ages), max_size=4),
    orphans=st.integers(0, 3),
)
def test_retention_forgets_exactly_what_is_past_its_keep(
    tmp_path_factory, slots, events, machines, holds, avoided, mocks, orphans
) -> None:
    path = tmp_path_factory.mktemp("retention") / "s.db"
    engine = make_engine(f"sqlite:///{path}")
    Base.metadata.create_all(engine)
    factory = session_factory(engine)
    now = T0 + timedelta(days=365)

    def ago(seconds: int) -> datetime:
        return now - timedelta(seconds=seconds)

    with transaction(factory) as s:
        for i, age in enumerate(slots):
            s.add(TickSlot(queue="q", slot=i, claimed_by="b", claimed_at=ago(age)))
        for age in events:
            s.add(ScaleEvent(at=ago(age), kind="k", action="a", reason="r"))
        for i, (age, state) in enumerate(machines):
            s.add(
                Instance(
                    launch_id=f"m{i}", queue="q", provider="p", state=state, updated_at=ago(age)
                )
            )
            for dst in (InstanceState.PENDING, state):  # its history, as old as it is
                s.add(InstanceTransition(launch_id=f"m{i}", dst=dst, at=ago(age)))
        for i in range(orphans):  # a history whose machine's row is gone
            s.add(InstanceTransition(launch_id=f"gone{i}", dst=InstanceState.PENDING, at=now))
        for i, left in enumerate(holds):
            s.add(
                ProviderRateLimit(
                    provider=f"p{i}",
                    until=now + timedelta(seconds=left),
                    reason="r",
                    since=ago(3600),
                )
            )
        for i, left in enumerate(avoided):
            s.add(
                AvoidedHost(
                    provider="p", host_id=f"h{i}", reason="r", until=now + timedelta(seconds=left)
                )
            )
        for i, age in enumerate(mocks):
            s.add(
                MockMachine(
                    provider="p",
                    label=f"l{i}",
                    gpu="g",
                    price_per_hour=1.0,
                    status="destroyed" if age is not None else "running",
                    boots_at=ago(0),
                    destroyed_at=None if age is None else ago(age),
                )
            )
    retention.sweep(lambda: transaction(factory), now)
    with transaction(factory) as s:
        kept_slots = sorted(a for a in slots if timedelta(seconds=a) <= KEEP["tick_slots"])
        assert s.scalar(select(func.count()).select_from(TickSlot)) == len(kept_slots)
        kept_events = [a for a in events if timedelta(seconds=a) <= KEEP["scale_events"]]
        assert s.scalar(select(func.count()).select_from(ScaleEvent)) == len(kept_events)
        left = {r.launch_id: r.state for r in s.scalars(select(Instance))}
        for i, (age, state) in enumerate(machines):
            live_or_young = state in LIVE_STATES or timedelta(seconds=age) <= KEEP["instances"]
            assert (f"m{i}" in left) == live_or_young, (age, state)
        histories = [t.launch_id for t in s.scalars(select(InstanceTransition))]
        assert sorted(histories) == sorted(2 * list(left))  # kept as long as its machine's row
        assert s.scalar(select(func.count()).select_from(ProviderRateLimit)) == sum(
            1 for x in holds if x > 0
        )
        assert s.scalar(select(func.count()).select_from(AvoidedHost)) == sum(
            1 for x in avoided if x > 0
        )
        assert s.scalar(select(func.count()).select_from(MockMachine)) == sum(
            1 for a in mocks if a is None or timedelta(seconds=a) <= KEEP["mock_machines"]
        )
    engine.dispose()


def test_tick_slots_stay_within_an_hour_of_polls(tmp_path) -> None:
    """1,000 polls of 30 s × 100 queues, the sweep every 10 minutes as beat sends it."""
    engine = make_engine(f"sqlite:///{tmp_path / 's.db'}")
    Base.metadata.create_all(engine)
    factory = session_factory(engine)
    queues, poll = 100, 30
    every = int(retention.EVERY.total_seconds() // poll)
    for n in range(1000):
        now = T0 + timedelta(seconds=n * poll)
        with transaction(factory) as s:
            claimed = leases.claim_ticks(s, [(f"q{i}", n) for i in range(queues)], "beat", now)
            assert len(claimed) == queues
        if n % every == 0:
            retention.sweep(lambda: transaction(factory), now)
    with transaction(factory) as s:
        rows = s.scalar(select(func.count()).select_from(TickSlot))
    engine.dispose()
    hour = int(KEEP["tick_slots"].total_seconds() // poll)
    assert rows <= queues * (hour + every + 1), rows  # 100,000 without the sweep
