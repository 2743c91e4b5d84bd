"""The executor hands a plan's actions to a port in a fixed order, for the queues asked."""

from __future__ import annotations

from datetime import UTC, datetime
from itertools import count

import pytest

from autoscaler.control.executor import PlanActions, execute
from autoscaler.policy.plan import Drain, Launch, Plan, QueuePlan, Reclaim, Wait

NOW = datetime(2025, 6, 2, 12, 0, tzinfo=UTC)


class Recorder(PlanActions):
    """A PlanActions port (the Protocol production and the simulator implement) that writes
    down every call, in order."""

    def __init__(self) -> None:
        self.calls: list[tuple[object, ...]] = []

    def reclaim(self, action: Reclaim) -> None:
        self.calls.append(("reclaim", action.queue, action.launch_id))

    def drain_now(self, action: Drain) -> None:
        self.calls.append(("drain_now", action.queue, action.launch_id))

    def drain_when_idle(self, action: Drain) -> None:
        self.calls.append(("drain_when_idle", action.queue, action.launch_id))

    def launch(self, action: Launch, launch_id: str) -> None:
        self.calls.append(("launch", action.queue, action.index, launch_id))

    def queue_done(self, plan: QueuePlan) -> None:
        self.calls.append(("queue_done", plan.queue, plan))


def ids(prefix: str = "id"):
    n = count(1)
    issued: list[str] = []

    def new() -> str:
        issued.append(f"{prefix}{next(n)}")
        return issued[-1]

    return new, issued


def qplan(name: str, *, reclaims=(), drains=(), launches=0, waits=()) -> QueuePlan:
    return QueuePlan(
        queue=name,
        capacity=1,
        floor=0,
        ceiling=8,
        desired=1 + launches,
        reclaims=tuple(Reclaim(name, lid, "wanted back") for lid in reclaims),
        drains=tuple(
            Drain(name, lid, "schedule", "back to the floor", when_idle=busy)
            for lid, busy in drains
        ),
        launches=tuple(
            Launch(name, "gpu", "queue_depth", "load", index=i + 1) for i in range(launches)
        ),
        waits=tuple(waits),
    )


PLAN = Plan(
    at=NOW,
    queues=(
        qplan("a", reclaims=("a-r1", "a-r2"), drains=(("a-d1", False), ("a-d2", True)), launches=2),
        qplan("b", drains=(("b-d1", True), ("b-d2", False), ("b-d3", False))),
        qplan("c", launches=1, waits=(Wait("c", "backoff", 2, "backoff"),)),
        qplan("d"),
    ),
)


def test_every_action_in_order_reclaims_then_drains_then_launches_then_queue_done():
    port = Recorder()
    new, issued = ids()
    launched = execute(PLAN, port, new)
    assert port.calls == [
        ("reclaim", "a", "a-r1"),
        ("reclaim", "a", "a-r2"),
        ("drain_now", "a", "a-d1"),
        ("drain_when_idle", "a", "a-d2"),
        ("launch", "a", 1, "id1"),
        ("launch", "a", 2, "id2"),
        ("queue_done", "a", PLAN.queues[0]),
        ("drain_when_idle", "b", "b-d1"),
        ("drain_now", "b", "b-d2"),
        ("drain_now", "b", "b-d3"),
        ("queue_done", "b", PLAN.queues[1]),
        ("launch", "c", 1, "id3"),
        ("queue_done", "c", PLAN.queues[2]),
        ("queue_done", "d", PLAN.queues[3]),
    ]
    assert launched == ["id1", "id2", "id3"] == issued


@pytest.mark.parametrize(
    ("queues", "expected"),
    [
        ({"b"}, ["b"]),
        (["c", "a"], ["a", "c"]),  # plan order, whatever the order asked
        ({"d", "nope"}, ["d"]),
        (set(), []),
        (None, ["a", "b", "c", "d"]),
    ],
)
def test_only_the_queues_asked_are_handed_over(queues, expected):
    port = Recorder()
    new, issued = ids("x")
    launched = execute(PLAN, port, new, queues)
    assert [c[1] for c in port.calls if c[0] == "queue_done"] == expected
    assert {c[1] for c in port.calls} == set(expected)
    # fresh ids only for the launches handed over, in order
    n_launches = sum(len(PLAN.for_queue(q).launches) for q in expected)
    assert issued == [f"x{i}" for i in range(1, n_launches + 1)]
    assert launched == issued
    assert [c[3] for c in port.calls if c[0] == "launch"] == launched


def test_a_busy_machine_only_ever_gets_drain_when_idle():
    plan = Plan(at=NOW, queues=(qplan("q", drains=(("busy", True), ("idle", False))),))
    port = Recorder()
    execute(plan, port, ids()[0])
    assert ("drain_when_idle", "q", "busy") in port.calls
    assert ("drain_now", "q", "busy") not in port.calls
    assert ("drain_now", "q", "idle") in port.calls


def test_each_launch_gets_its_own_id():
    plan = Plan(at=NOW, queues=(qplan("q", launches=5),))
    port = Recorder()
    launched = execute(plan, port, ids()[0])
    assert len(set(launched)) == 5
    assert [c[2] for c in port.calls if c[0] == "launch"] == [1, 2, 3, 4, 5]


def test_an_empty_plan_hands_over_nothing():
    port = Recorder()
    assert execute(Plan(at=NOW), port, ids()[0]) == []
    assert port.calls == []
