"""A machine's state history (`instance_transitions`), on SQLite and PostgreSQL.

- a machine stopped and resumed twice through the store's lifecycle writes (the ones the launch,
  drain, stop, resume and ready steps make) is billed exactly: each stop at its storage price,
  where the row's columns (the latest stop only) billed the first stop at the full price;
- every state write leaves its history row in its own transaction, and only a move that was
  made does (a lost race, a rolled-back step leave none); `move_many` records the rows it moved;
- a row with a history of its own that does not start at its birth (written directly, then
  moved) reads its columns for the time before its first recorded move.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import select

from autoscaler.lifecycle import InstanceState
from autoscaler.store import machine_views, spend, transitions
from autoscaler.store.db import transaction
from autoscaler.store.intents import Intent, add_intents, claim_intent
from autoscaler.store.models import Instance, InstanceTransition
from autoscaler.store.moves import KEPT_WARM, move, move_many, set_keep_warm, start_resumes

S = InstanceState
T0 = datetime(2026, 6, 1, tzinfo=UTC)  # a Monday, 00:00 UTC: all of it is "today"
M = timedelta(minutes=1)
H = timedelta(hours=1)
PRICE, STORAGE = 2.0, 0.01
LID = "warm-1"


def at(minutes: float) -> datetime:
    return T0 + minutes * M


def _history(sessions, launch_id: str = LID) -> list[tuple[S | None, S, datetime]]:
    with transaction(sessions) as s:
        return [tuple(t) for t in transitions.history(s, [launch_id]).get(launch_id, [])]


def _serve_then_stop(sessions, stopped: float) -> None:
    """ready -> draining -> drained -> stopping -> stopped, as the drain and stop steps move it
    (`control.steps.drain`, `control.steps.stop`), the stop answered 2 minutes after it was sent."""
    with transaction(sessions) as s:
        set_keep_warm(s, [LID], True)  # decide() gave it a place in the pool
        assert move(s, LID, S.READY, S.DRAINING, at(stopped - 10), "idle", drain_requested=False)
    with transaction(sessions) as s:
        assert move(s, LID, S.DRAINING, S.DRAINED, at(stopped - 5), "drained")
        assert move(s, LID, S.DRAINED, S.STOPPING, at(stopped - 2), "stop", only_if=KEPT_WARM)
    with transaction(sessions) as s:
        assert move(
            s,
            LID,
            S.STOPPING,
            S.STOPPED,
            at(stopped),
            "stopped at the provider",
            storage_price_per_hour=STORAGE,
        )


def _resume(sessions, resumed: float, ready: float) -> None:
    """stopped -> resuming (the tick's `start_resumes`) -> ready (its worker's first word)."""
    with transaction(sessions) as s:
        assert start_resumes(s, {LID: "a burst"}, at(resumed)) == [LID]
    with transaction(sessions) as s:
        assert move(s, LID, S.RESUMING, S.READY, at(ready), "its worker is up again")


def test_a_machine_stopped_and_resumed_twice_is_billed_exactly(sessions):
    with transaction(sessions) as s:
        add_intents(s, [Intent(LID, "q", "pods", "a burst")], at(-3))
    with transaction(sessions) as s:
        assert claim_intent(s, LID, at(-2), "token-hash")
    with transaction(sessions) as s:  # the create answered: billing from here
        assert move(s, LID, S.CREATING, S.BOOTING, at(0), "rented", price_per_hour=PRICE)
    with transaction(sessions) as s:
        assert move(s, LID, S.BOOTING, S.READY, at(10), "its worker is up")
    _serve_then_stop(sessions, stopped=60)  # 1 h at full price, stopped at 01:00
    _resume(sessions, resumed=240, ready=250)  # stopped 3 h, resumed at 04:00
    _serve_then_stop(sessions, stopped=300)  # stopped again at 05:00
    _resume(sessions, resumed=480, ready=490)  # stopped 3 h, resumed at 08:00
    now = at(600)  # 10:00: 2 h more at full price

    history = _history(sessions)
    dst = [d for _, d, _ in history]
    assert dst == [
        S.PENDING, S.CREATING, S.BOOTING, S.READY,
        S.DRAINING, S.DRAINED, S.STOPPING, S.STOPPED, S.RESUMING, S.READY,
        S.DRAINING, S.DRAINED, S.STOPPING, S.STOPPED, S.RESUMING, S.READY,
    ]  # fmt: skip
    assert [src for src, _, _ in history] == [None, *dst[:-1]]
    assert [a for _, _, a in history] == sorted(a for _, _, a in history)

    exact = 4 * PRICE + 6 * STORAGE  # 0-1 h, 4-5 h, 8-10 h at $2; 1-4 h, 5-8 h at $0.01
    with transaction(sessions) as s:
        (machine,) = machine_views.instances(s, now)
        spent = spend.spend(s, now)
        row = s.scalar(select(Instance).where(Instance.launch_id == LID))
        assert row is not None
        _, from_columns = spend.billed(row, now, histories={})
    assert machine.billed_seconds == pytest.approx(10 * 3600)
    assert machine.cost_so_far == pytest.approx(exact)  # $8.06
    assert spent.today == pytest.approx(exact)
    assert spent.rate_per_hour == pytest.approx(PRICE)
    assert machine.resumes == 2
    # Before: the row keeps its latest stop only (05:00-08:00), so the first stop (01:00-04:00)
    # was billed at the full price: 7 h × $2 + 3 h × $0.01 = $14.03, $5.97 too much.
    assert from_columns == pytest.approx(7 * PRICE + 3 * STORAGE)  # $14.03

    # stopped a third time and destroyed from there: the stop bills its disk, the end nothing
    _serve_then_stop(sessions, stopped=540)  # 09:00
    with transaction(sessions) as s:
        assert move(s, LID, S.STOPPED, S.TERMINATING, at(570), "keep_for ran out")
    with transaction(sessions) as s:
        assert move(s, LID, S.TERMINATING, S.TERMINATED, at(572), "destroyed")
    with transaction(sessions) as s:
        (machine,) = machine_views.instances(s, at(900), include_closed=True)
        spent = spend.spend(s, at(900))
    ended = 3 * PRICE + 2 * 60 * PRICE / 3600 + 6.5 * STORAGE  # 08-09 h, 09:30-09:32 at $2
    assert machine.cost_so_far == pytest.approx(ended)
    assert spent.today == pytest.approx(ended)
    assert spent.rate_per_hour == 0.0


def test_only_a_move_made_leaves_a_history_row_in_its_own_transaction(sessions):
    with transaction(sessions) as s:
        add_intents(
            s,
            [Intent("a", "q", "pods", "r"), Intent("b", "q", "pods", "r"), ("c", "q", "pods", "r")],
            at(0),
        )
    with transaction(sessions) as s:  # a lost race: the row is not where the mover read it
        assert not move(s, "a", S.CREATING, S.BOOTING, at(1), "rented")
    assert _history(sessions, "a") == [(None, S.PENDING, at(0))]

    with pytest.raises(RuntimeError), transaction(sessions) as s:  # a step that fails
        assert claim_intent(s, "a", at(2), "hash-a")
        raise RuntimeError("the create call failed before commit")
    assert _history(sessions, "a") == [(None, S.PENDING, at(0))]

    with transaction(sessions) as s:  # several at once: only those still in `src` moved
        assert claim_intent(s, "b", at(3), "hash-b")
        moved = move_many(s, {"a": "never rented", "b": "x", "c": "never rented"},
                          S.PENDING, S.FAILED, at(4))  # fmt: skip
    assert sorted(moved) == ["a", "c"]
    assert _history(sessions, "a")[-1] == (S.PENDING, S.FAILED, at(4))
    assert _history(sessions, "b") == [(None, S.PENDING, at(0)), (S.PENDING, S.CREATING, at(3))]

    with transaction(sessions) as s:  # from one of several states: the one it left
        assert move(s, "b", (S.PENDING, S.CREATING), S.FAILED, at(5), "cancelled")
    assert _history(sessions, "b")[-1] == (S.CREATING, S.FAILED, at(5))
    with transaction(sessions) as s:
        count = len(list(s.scalars(select(InstanceTransition))))
    assert count == 2 + 3 + 2  # a, c: pending, failed; b: pending, creating, failed


def test_a_row_written_directly_reads_its_columns_before_its_first_recorded_move(sessions):
    """Rows from before the history (a store not backfilled) or written by hand: the time
    before their first recorded move is what their columns say, the rest is recorded."""
    with transaction(sessions) as s:
        s.add(
            Instance(
                launch_id=LID,
                queue="q",
                provider="pods",
                state=S.READY,
                price_per_hour=PRICE,
                storage_price_per_hour=STORAGE,
                created_at=at(-5),
                pending_at=at(-5),
                booting_at=at(0),
                ready_at=at(10),
                keep_warm=True,
                running_tasks=0,
                updated_at=at(10),
            )
        )
    _serve_then_stop(sessions, stopped=60)
    _resume(sessions, resumed=240, ready=250)
    _serve_then_stop(sessions, stopped=300)
    with transaction(sessions) as s:
        (machine,) = machine_views.instances(s, at(360))
    assert _history(sessions)[0][0] == S.READY  # its first recorded move left `ready`
    assert machine.cost_so_far == pytest.approx(2 * PRICE + 4 * STORAGE)
