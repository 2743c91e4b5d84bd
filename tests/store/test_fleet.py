"""The control loop's reads and writes of machines, backoffs, manual targets, ticks and events,
on SQLite and PostgreSQL."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from autoscaler.config.models import Backoff
from autoscaler.control import machines
from autoscaler.lifecycle import ALLOWED_TRANSITIONS, InstanceState
from autoscaler.policy.snapshot import BackoffState, Machine, ManualTarget, RateLimit
from autoscaler.store import (
    backoffs,
    events,
    instances,
    intents,
    leases,
    manual_targets,
    migrate,
    moves,
    rate_limits,
    retention,
)
from autoscaler.store.db import JSON_ROWS_FROM, make_engine, session_factory, transaction
from autoscaler.store.instances import InstanceDetails
from autoscaler.store.models import (
    Base,
    Instance,
    ManualTargetRow,
    ProviderRateLimit,
    RentalBackoff,
    ScaleEvent,
    TickSlot,
)

S = InstanceState
T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def add(factory: sessionmaker[Session], lid: str, state: InstanceState, **kw) -> None:
    with transaction(factory) as s:
        s.add(
            Instance(launch_id=lid, queue=kw.pop("queue", "q"), provider="gpu", state=state, **kw)
        )


def load(factory: sessionmaker[Session], lid: str) -> InstanceDetails:
    with factory() as s:
        row = instances.get(s, lid)
        assert row is not None
        return row


# --------------------------------------------------------------------------- move


def test_of_two_moves_from_the_same_state_exactly_one_wins(sessions):
    add(sessions, "L1", S.READY)
    with transaction(sessions) as s:
        first = moves.move(s, "L1", S.READY, S.DRAINING, at(1), "idle")
    with transaction(sessions) as s:
        second = moves.move(s, "L1", S.READY, S.TERMINATING, at(2), "silent")
        again = moves.move(s, "L1", S.READY, S.DRAINING, at(2), "idle again")
    assert (first, second, again) == (True, False, False)
    row = load(sessions, "L1")
    assert row.state == S.DRAINING and row.state_reason == "idle"
    assert row.draining_at == at(1) and row.terminating_at is None


def test_racing_moves_on_postgresql_have_one_winner(pg_url):
    engine = make_engine(pg_url, pool_size=10)
    Base.metadata.create_all(engine)
    factory = session_factory(engine)
    add(factory, "L1", S.READY)
    start = threading.Barrier(8)
    won: list[InstanceState] = []

    def contender(i: int) -> None:
        dst = S.DRAINING if i % 2 else S.TERMINATING
        start.wait()
        with transaction(factory) as s:
            if moves.move(s, "L1", S.READY, dst, at(i), f"w{i}"):
                won.append(dst)

    threads = [threading.Thread(target=contender, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    try:
        assert len(won) == 1
        assert load(factory, "L1").state == won[0]
    finally:
        engine.dispose()


def test_move_refuses_every_transition_outside_the_table(sessions):
    add(sessions, "L1", S.READY)
    refused = 0
    with transaction(sessions) as s:
        for src in S:
            for dst in S:
                if dst in ALLOWED_TRANSITIONS[src]:
                    continue
                with pytest.raises(ValueError):
                    moves.move(s, "L1", src, dst, at(1), "no")
                refused += 1
        # one bad source among good ones is refused too, and nothing is written
        with pytest.raises(ValueError):
            moves.move(s, "L1", (S.READY, S.TERMINATED), S.TERMINATING, at(1), "no")
    assert refused == len(S) ** 2 - sum(len(v) for v in ALLOWED_TRANSITIONS.values())
    row = load(sessions, "L1")
    assert row.state == S.READY and row.terminating_at is None


def test_each_move_sets_its_states_timestamp_and_the_given_fields(sessions):
    add(sessions, "L1", S.PENDING, pending_at=T0, created_at=T0)
    path = [S.CREATING, S.BOOTING, S.READY, S.DRAINING, S.DRAINED, S.TERMINATING, S.TERMINATED]
    src = S.PENDING
    for i, dst in enumerate(path, start=1):
        extra = {"provider_instance_id": "p9", "host_id": "h9"} if dst == S.BOOTING else {}
        with transaction(sessions) as s:
            assert moves.move(s, "L1", src, dst, at(i), f"to {dst.value}", **extra)
        row = load(sessions, "L1")
        assert row.state == dst and row.state_reason == f"to {dst.value}"
        assert getattr(row, instances.STATE_SINCE[dst]) == at(i)
        assert row.updated_at == at(i)
        with sessions() as s:
            (record,) = instances.rows_of(s, ["L1"])
        assert record.since == at(i) and record.state == dst
        assert instances.as_row(record).since == at(i)
        src = dst
    row = load(sessions, "L1")
    assert (row.provider_instance_id, row.host_id) == ("p9", "h9")
    for i, state in enumerate(path, start=1):  # earlier timestamps are kept
        assert getattr(row, instances.STATE_SINCE[state]) == at(i)
    # the two other final states, from a set of sources
    add(sessions, "L2", S.CREATING)
    add(sessions, "L3", S.DRAINING)
    with transaction(sessions) as s:
        assert moves.move(s, "L2", (S.PENDING, S.CREATING), S.FAILED, at(50), "x" * 5000)
        assert moves.move(s, "L3", (S.READY, S.DRAINING, S.DRAINED), S.LOST, at(51), "gone")
    assert load(sessions, "L2").failed_at == at(50)
    assert load(sessions, "L2").state_reason == "x" * 2000
    assert load(sessions, "L3").lost_at == at(51) and load(sessions, "L3").state == S.LOST


@pytest.mark.parametrize("extra", [0, JSON_ROWS_FROM])  # the big batch: one JSON document
def test_move_many_moves_only_rows_still_in_the_source_state_each_with_its_reason(sessions, extra):
    """On both databases, and on PostgreSQL through CASE and through a joined JSON document."""
    add(sessions, "A", S.READY)
    add(sessions, "B", S.READY)
    add(sessions, "C", S.BOOTING)
    for i in range(extra):
        add(sessions, f"X{i}", S.READY if i % 2 else S.BOOTING)
    others = {f"X{i}": f"idle x{i} 'quoted' \\ é" for i in range(extra)}
    with transaction(sessions) as s:
        assert moves.move_many(s, {}, S.READY, S.DRAINING, at(1)) == []
        moved = moves.move_many(
            s,
            {"A": "idle a", "B": "idle b", "C": "idle c", "nope": "x", **others},
            S.READY,
            S.DRAINING,
            at(1),
            drain_requested=False,
        )
    assert sorted(moved) == sorted(["A", "B", *(f"X{i}" for i in range(1, extra, 2))])
    for lid, reason in (("A", "idle a"), ("B", "idle b"), *list(others.items())[1::2]):
        row = load(sessions, lid)
        assert (row.state, row.state_reason, row.draining_at) == (S.DRAINING, reason, at(1))
    assert load(sessions, "C").state == S.BOOTING and load(sessions, "C").draining_at is None
    if extra:
        assert load(sessions, "X0").state == S.BOOTING
    with transaction(sessions) as s:  # a second process making the same moves wins nothing
        assert (
            moves.move_many(s, {"A": "again", "B": "again", **others}, S.READY, S.DRAINING, at(2))
            == []
        )
        with pytest.raises(ValueError):
            moves.move_many(s, {"A": "x"}, S.DRAINING, S.READY, at(2))
    assert load(sessions, "A").state_reason == "idle a"


# --------------------------------------------------------------------------- reads


def test_intents_round_trip_through_live_rows_and_machines_by_queue(sessions):
    with transaction(sessions) as s:
        intents.add_intents(s, [], T0)  # nothing to write: no statement, no error
        intents.add_intents(
            s,
            [
                ("L1", "q", "gpu", "queue_depth 5 > 3"),
                ("L2", "q", "gpu", "r" * 3000),
                ("L3", "r", "vast", "schedule"),
            ],
            T0,
        )
    with transaction(sessions) as s:
        assert moves.move(s, "L2", S.PENDING, S.FAILED, at(5), "create failed")
        assert moves.move(s, "L3", S.PENDING, S.CREATING, at(6), "creating")
    with transaction(sessions) as s:
        live = instances.live_rows(s)
        assert [r.launch_id for r in live] == ["L1", "L3"]
        l1, l3 = live
        assert (l1.queue, l1.provider, l1.state) == ("q", "gpu", S.PENDING)
        assert l1.since == T0 and l1.created_at == T0
        assert (l1.drain_requested, l1.running_tasks, l1.provider_instance_id) == (False, 0, None)
        assert (l3.state, l3.since) == (S.CREATING, at(6))
        assert instances.as_row(l3).since == at(6)
        by_queue = instances.machines_by_queue(live)
        reasons = {lid: instances.get(s, lid).state_reason for lid in ("L1", "L2", "L3")}
        assert instances.get(s, "L1").pending_at == T0 and instances.get(s, "L1").updated_at == T0
        assert [r.launch_id for r in instances.rows_of(s, ["L2", "L3", "nope"])] == ["L2", "L3"]
        assert instances.rows_of(s, []) == []
    assert reasons == {"L1": "queue_depth 5 > 3", "L2": "create failed", "L3": "creating"}
    assert by_queue == {
        "q": (Machine("L1", S.PENDING, T0, "gpu"),),
        "r": (Machine("L3", S.CREATING, T0, "vast"),),
    }


def test_drain_requested_marks_only_ready_rows(sessions):
    add(sessions, "R", S.READY)
    add(sessions, "B", S.BOOTING)
    with transaction(sessions) as s:
        moves.set_drain_requested(s, ["R", "B"], True)
    assert load(sessions, "R").drain_requested is True
    assert load(sessions, "B").drain_requested is False
    with transaction(sessions) as s:
        moves.set_drain_requested(s, ["R"], False)
    assert load(sessions, "R").drain_requested is False


# --------------------------------------------------------------------------- backoffs


def test_rental_failures_grow_the_backoff_up_to_its_cap_and_survive_a_restart(db_url, sessions):
    cfg = Backoff(base=30, cap=100, jitter=0)
    waits = []
    for n in range(1, 6):
        with transaction(sessions) as s:
            state = machines.rental_failed(s, "q", "gpu", T0, cfg, f"error {n}")
        assert state.failures == n
        waits.append((state.until - T0).total_seconds())
    assert waits == [30, 60, 100, 100, 100]
    with transaction(sessions) as s:  # another (queue, provider) starts from its own count
        assert machines.rental_failed(s, "r", "gpu", T0, cfg, "x" * 3000).failures == 1
    # a new engine (a restarted process) reads what was written
    engine = make_engine(db_url)
    try:
        with session_factory(engine)() as s:
            got = backoffs.by_queue(s)
    finally:
        engine.dispose()
    assert got == {
        "q": (BackoffState("gpu", 5, at(100), "error 5", "error"),),
        "r": (BackoffState("gpu", 1, at(30), "x" * 2000, "error"),),
    }


def test_jitter_only_shortens_and_the_cap_is_hard(sessions):
    cfg = Backoff(base=30, cap=100, jitter=0.5)
    for n in range(1, 12):
        with transaction(sessions) as s:
            state = machines.rental_failed(s, "q", "gpu", T0, cfg, "e")
        exp = min(100, 30 * 2 ** (n - 1))
        assert 0.5 * exp <= (state.until - T0).total_seconds() <= exp
        assert state.failures == n


def test_a_rate_limit_never_shortens_counts_no_failure_and_is_one_stretch(sessions):
    """A provider's reset is kept per provider, for every queue: a later reset extends it, an
    earlier one changes nothing; a new stretch (worth one event) starts only once it expired."""
    with transaction(sessions) as s:
        assert rate_limits.record(s, "gpu", at(60), "429 reset=60", T0)
    with transaction(sessions) as s:
        assert not rate_limits.record(s, "gpu", at(30), "earlier reset", at(1))
        assert rate_limits.active(s, at(1)) == (RateLimit("gpu", at(60), "429 reset=60"),)
        assert not rate_limits.record(s, "gpu", at(120), "later reset", at(2))
    with transaction(sessions) as s:
        assert rate_limits.of(s, "gpu", at(119)) == RateLimit("gpu", at(120), "later reset")
        assert rate_limits.of(s, "gpu", at(120)) is None  # the reset has come
        assert rate_limits.active(s, at(120)) == ()
        assert backoffs.by_queue(s) == {}  # no failure of any rental was counted
        assert rate_limits.record(s, "gpu", at(200), "again", at(150))  # a new stretch
        assert s.get(ProviderRateLimit, "gpu").since == at(150)
        rule = next(r for r in retention.RULES if r.table == "provider_rate_limits")
        assert retention.forget(s, rule, at(200)) == 1


def test_a_no_answer_hold_is_lifted_only_by_its_own_cause(sessions):
    """A provider held for no answer is lifted when it answers; lifting never ends a rate
    limit, and the hold that reaches furthest names the cause."""
    with transaction(sessions) as s:
        assert rate_limits.record(s, "gpu", at(60), "no answer in 10s", T0, "unanswered")
        assert rate_limits.of(s, "gpu", at(1)) == RateLimit(
            "gpu", at(60), "no answer in 10s", "unanswered"
        )
        assert not rate_limits.lift(s, "gpu", "rate_limit", at(1))
        assert rate_limits.lift(s, "gpu", "unanswered", at(1))
        assert rate_limits.of(s, "gpu", at(1)) is None
        assert not rate_limits.lift(s, "gpu", "unanswered", at(2))  # nothing in force
    with transaction(sessions) as s:
        assert rate_limits.record(s, "gpu", at(60), "no answer", at(3), "unanswered")
        assert not rate_limits.record(s, "gpu", at(90), "429 reset=87", at(4))
        assert rate_limits.of(s, "gpu", at(5)) == RateLimit("gpu", at(90), "429 reset=87")
        assert not rate_limits.lift(s, "gpu", "unanswered", at(5))  # a rate limit stays
        assert rate_limits.of(s, "gpu", at(5)) is not None


def test_clear_backoff_removes_only_its_queue_and_provider(sessions):
    cfg = Backoff(base=30, jitter=0)
    with transaction(sessions) as s:
        for q, p in (("q", "gpu"), ("q", "vast"), ("r", "gpu")):
            machines.rental_failed(s, q, p, T0, cfg, "e")
    with transaction(sessions) as s:
        backoffs.clear(s, "q", "gpu")
    with transaction(sessions) as s:
        got = backoffs.by_queue(s)
        assert {(q, b.provider) for q, bs in got.items() for b in bs} == {
            ("q", "vast"),
            ("r", "gpu"),
        }


# --------------------------------------------------------------------------- manual targets


def test_manual_targets_are_set_replaced_and_expire(sessions):
    with transaction(sessions) as s:
        manual_targets.put(s, "q", 2, at(600), "alice", T0)
        manual_targets.put(s, "r", 0, at(60), "bob", T0)
    with transaction(sessions) as s:
        manual_targets.put(s, "q", 5, at(1200), "carol", at(10))
    with transaction(sessions) as s:
        assert manual_targets.in_force(s, at(59)) == {
            "q": ManualTarget(5, at(1200), "carol"),
            "r": ManualTarget(0, at(60), "bob"),
        }
        assert s.scalar(select(func.count()).select_from(ManualTargetRow)) == 2
    with transaction(sessions) as s:  # r expires at exactly its deadline, and is deleted
        assert manual_targets.in_force(s, at(60)) == {"q": ManualTarget(5, at(1200), "carol")}
    with transaction(sessions) as s:
        assert s.scalars(select(ManualTargetRow.queue)).all() == ["q"]
        assert s.get(ManualTargetRow, "q").set_at == at(10)
        assert manual_targets.clear(s, "q") is True
        assert manual_targets.clear(s, "q") is False
        assert manual_targets.in_force(s, T0) == {}


# --------------------------------------------------------------------------- tick slots


def test_claim_ticks_claims_each_slot_once_and_returns_only_this_calls_claims(sessions):
    with transaction(sessions) as s:
        assert leases.claim_ticks(s, [], "t", T0) == set()
        assert leases.claim_ticks(s, [("a", 1), ("b", 1)], "t1", T0) == {"a", "b"}
    with transaction(sessions) as s:
        assert leases.claim_ticks(s, [("a", 1), ("b", 2), ("c", 1)], "t2", T0) == {"b", "c"}
        assert leases.claim_ticks(s, [("a", 1), ("b", 2), ("c", 1)], "t3", T0) == set()
    with transaction(sessions) as s:
        rows = {(t.queue, t.slot): t.claimed_by for t in s.scalars(select(TickSlot))}
    assert rows == {("a", 1): "t1", ("b", 1): "t1", ("b", 2): "t2", ("c", 1): "t2"}


def test_racing_claims_on_postgresql_split_the_slots_without_overlap(pg_url):
    engine = make_engine(pg_url, pool_size=10)
    Base.metadata.create_all(engine)
    factory = session_factory(engine)
    slots = [(f"q{i}", 0) for i in range(40)]

    def claim(name: str, slot: int, start: threading.Barrier, got: dict[str, set[str]]) -> None:
        start.wait()
        with transaction(factory) as s:
            got[name] = leases.claim_ticks(s, [(q, slot) for q, _ in slots], name, T0)

    for slot in range(5):
        start = threading.Barrier(2)
        got: dict[str, set[str]] = {}
        threads = [threading.Thread(target=claim, args=(n, slot, start, got)) for n in ("x", "y")]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not got["x"] & got["y"]
        assert got["x"] | got["y"] == {q for q, _ in slots}
        with factory() as s:
            owners = dict(
                s.execute(
                    select(TickSlot.queue, TickSlot.claimed_by).where(TickSlot.slot == slot)
                ).all()
            )
        assert {q for q, who in owners.items() if who == "x"} == got["x"]
    engine.dispose()


# --------------------------------------------------------------------------- events


def test_record_events_writes_every_field(sessions):
    with transaction(sessions) as s:
        events.record(s, [], T0)
        events.record(
            s,
            [
                events.event(
                    "scale_up",
                    "launch",
                    "queue_depth 5 > 3",
                    queue="q",
                    launch_id="L1",
                    details={"trigger": "queue_depth", "provider": "gpu"},
                ),
                events.event("reconcile", "destroy_orphan", "y" * 5000),
            ],
            at(7),
        )
    with transaction(sessions) as s:
        got = [
            (e.at, e.queue, e.kind, e.action, e.launch_id, e.reason, e.details)
            for e in s.scalars(select(ScaleEvent).order_by(ScaleEvent.id))
        ]
    assert got == [
        (
            at(7),
            "q",
            "scale_up",
            "launch",
            "L1",
            "queue_depth 5 > 3",
            {"trigger": "queue_depth", "provider": "gpu"},
        ),
        (at(7), None, "reconcile", "destroy_orphan", None, "y" * 4000, None),
    ]


# --------------------------------------------------------------------------- real schema


def test_the_fleet_queries_run_on_the_migrated_schema(db_url):
    migrate.upgrade(db_url)
    engine = make_engine(db_url)
    factory = session_factory(engine)
    try:
        with transaction(factory) as s:
            intents.add_intents(s, [("L1", "q", "gpu", "launch")], T0)
            machines.rental_failed(s, "q", "gpu", T0, Backoff(base=30, jitter=0), "e")
            rate_limits.record(s, "gpu", at(90), "rate limited", T0)
            manual_targets.put(s, "q", 1, at(60), "alice", T0)
            events.record(s, [events.event("k", "a", "r", details={"n": 1})], T0)
            assert leases.claim_ticks(s, [("q", 1)], "t", T0) == {"q"}
        with transaction(factory) as s:
            assert moves.move(s, "L1", S.PENDING, S.CREATING, at(1), "creating")
            assert moves.move(s, "L1", S.CREATING, S.BOOTING, at(2), "up", provider_instance_id="p")
            live = instances.live_rows(s)
            assert [(r.launch_id, r.state, r.since) for r in live] == [("L1", S.BOOTING, at(2))]
            assert backoffs.by_queue(s)["q"][0].failures == 1
            assert rate_limits.active(s, T0) == (RateLimit("gpu", at(90), "rate limited"),)
            assert manual_targets.in_force(s, T0) == {"q": ManualTarget(1, at(60), "alice")}
            assert manual_targets.in_force(s, at(60)) == {}
            assert s.scalar(select(ScaleEvent.details)) == {"n": 1}
            assert s.scalar(select(func.count()).select_from(RentalBackoff)) == 1
    finally:
        engine.dispose()


def test_a_retried_step_is_noted_once_per_stretch_and_again_after_the_row_moves(sessions):
    """Reconcile retries a waiting drain every round: the row says so once (`note_retry`, whose
    True audits the retry), `unnoted_retries` leaves it out of later rounds without a write, and
    a move (a new state reason) makes the next retry noted again."""
    add(sessions, "a", InstanceState.DRAINING, state_reason="idle")
    add(sessions, "b", InstanceState.DRAINING, state_reason="retrying drain: 40s")
    with transaction(sessions) as s:
        assert moves.unnoted_retries(s, [("a", "drain"), ("b", "drain"), ("gone", "drain")]) == {
            "a"
        }
        assert moves.unnoted_retries(s, [("b", "terminate")]) == {"b"}  # another step
        assert moves.unnoted_retries(s, []) == set()
        assert moves.note_retry(s, "a", "drain", "draining for 60s")
    with transaction(sessions) as s:
        assert moves.unnoted_retries(s, [("a", "drain")]) == set()
        assert not moves.note_retry(s, "a", "drain", "draining for 90s")  # (a racing round)
        assert moves.move(s, "a", InstanceState.DRAINING, InstanceState.DRAINED, at(5), "idle")
        assert moves.unnoted_retries(s, [("a", "terminate")]) == {"a"}
    assert load(sessions, "a").state_reason == "idle"
