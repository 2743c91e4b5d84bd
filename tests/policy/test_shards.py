"""Sharded evaluation, the pure part: every queue is decided by exactly one shard, the shards'
launches committed one after another never pass an account-wide cap, and without caps the
shards decide exactly what one evaluation of every queue decides.

The commit protocol is the loop's (`tick.evaluate._evaluate`): a shard lists its own queues and
counts every other machine of the account (`Snapshot.elsewhere`) as the store counts it at its
commit (`store.instances.billing_elsewhere`: a launch intent has no price yet, so it counts at its
queue's cap). The same protocol against PostgreSQL, with the account lock held by another
writer, is `tests/control/test_shards.py`.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

from hypothesis import event, given, settings
from hypothesis import strategies as st

from autoscaler.config.models import Config
from autoscaler.lifecycle import InstanceState
from autoscaler.policy.caps import still_granted, usage
from autoscaler.policy.decide import decide
from autoscaler.policy.plan import Plan
from autoscaler.policy.shards import queues_of, shard_of
from autoscaler.policy.snapshot import Billing, Machine, QueueSnapshot, Snapshot
from tests.policy.helpers import NOW, config, metrics, ready


@dataclass(frozen=True)
class World:
    pending: tuple[int, ...]
    busy: tuple[int, ...]
    priorities: tuple[int, ...]
    prices: tuple[float, ...]
    max_machines: int | None
    max_dollars: float | None
    shards: int
    order: tuple[int, ...]

    @property
    def names(self) -> list[str]:
        return [f"q{i}" for i in range(len(self.pending))]


@st.composite
def worlds(draw: st.DrawFn) -> World:
    n = draw(st.integers(2, 8))
    shards = draw(st.integers(2, 4))
    return World(
        pending=tuple(draw(st.lists(st.integers(0, 6), min_size=n, max_size=n))),
        busy=tuple(draw(st.lists(st.integers(0, 2), min_size=n, max_size=n))),
        priorities=tuple(draw(st.lists(st.integers(0, 2), min_size=n, max_size=n))),
        prices=tuple(draw(st.lists(st.sampled_from([0.3, 0.6, 1.0]), min_size=n, max_size=n))),
        max_machines=draw(st.none() | st.integers(0, 14)),
        max_dollars=draw(st.none() | st.sampled_from([0.0, 0.5, 1.2, 2.5, 4.0, 8.0])),
        shards=shards,
        order=tuple(draw(st.permutations(range(shards)))),
    )


def _config(w: World, capped: bool = True) -> Config:
    limits: dict[str, float] = {}
    if capped and w.max_machines is not None:
        limits["max_machines"] = w.max_machines
    if capped and w.max_dollars is not None:
        limits["max_price_per_hour"] = w.max_dollars
    return config(
        [{"trigger": "queue_depth", "target_per_worker": 1}],
        max_workers=8,
        queues={
            name: {
                "priority": w.priorities[i],
                "instance": {"gpu": "RTX 4090", "max_price_per_hour": w.prices[i]},
            }
            for i, name in enumerate(w.names)
        },
        limits=limits or None,
    )


def _machines(w: World) -> dict[str, list[Machine]]:
    """Busy machines already serving (priced), never drained by a tick."""
    return {
        name: [ready(f"{name}-m{k}", running=1, price=w.prices[i]) for k in range(w.busy[i])]
        for i, name in enumerate(w.names)
    }


def _billing(machines: dict[str, list[Machine]], queues: Iterable[str]) -> tuple[Billing, ...]:
    """What `store.instances.billing_elsewhere` returns for these queues' machines."""
    out = []
    for q in queues:
        by_state: dict[InstanceState, list[Machine]] = {}
        for m in machines.get(q, ()):
            by_state.setdefault(m.state, []).append(m)
        for state, ms in by_state.items():
            priced = [m.price_per_hour for m in ms if m.price_per_hour is not None]
            out.append(Billing(q, state, len(ms), sum(priced), len(ms) - len(priced)))
    return tuple(out)


def _snapshot(w: World, machines: dict[str, list[Machine]], held: list[str]) -> Snapshot:
    pending = dict(zip(w.names, w.pending, strict=True))
    return Snapshot(
        tuple(
            QueueSnapshot(q, metrics(pending[q], queue=q), tuple(machines.get(q, ()))) for q in held
        ),
        elsewhere=_billing(machines, [q for q in machines if q not in held]),
    )


def _run_shards(w: World, capped: bool = True) -> tuple[dict[str, int], Counter[str]]:
    """Every shard in `w.order`, each committing its launches (as unpriced intents) before the
    next counts them. Returns the launches per queue and how often each queue was decided."""
    cfg = _config(w, capped)
    machines = _machines(w)
    launched: dict[str, int] = {}
    decided: Counter[str] = Counter()
    for shard in w.order:
        held = queues_of(w.names, shard, w.shards)
        plan = decide(_snapshot(w, machines, held), cfg, NOW, held)
        for qp in plan.queues:
            decided[qp.queue] += 1
            launched[qp.queue] = len(qp.launches)
            machines[qp.queue] = machines[qp.queue] + [
                Machine(f"{qp.queue}-new{k}", InstanceState.PENDING, NOW, provider="gpu")
                for k in range(len(qp.launches))
            ]
    return launched, decided


@settings(max_examples=300, deadline=None)
@given(worlds())
def test_every_queue_is_decided_by_one_shard(w: World) -> None:
    _, decided = _run_shards(w)
    assert decided == Counter(w.names)
    assert {shard_of(q, w.shards) for q in w.names} <= set(range(w.shards))


@settings(max_examples=300, deadline=None)
@given(worlds())
def test_shards_committing_one_after_another_never_pass_a_cap(w: World) -> None:
    launched, _ = _run_shards(w)
    new = sum(launched.values())
    # counted here, not with `caps.usage`: the test must not share what it checks
    count = sum(w.busy) + new
    dollars = sum((w.busy[i] + launched.get(q, 0)) * w.prices[i] for i, q in enumerate(w.names))
    if w.max_machines is not None:
        assert new == 0 or count <= w.max_machines
    if w.max_dollars is not None:
        assert new == 0 or dollars <= w.max_dollars + 1e-6


@settings(max_examples=300, deadline=None)
@given(worlds())
def test_without_caps_the_shards_decide_what_one_evaluation_decides(w: World) -> None:
    launched, _ = _run_shards(w, capped=False)
    cfg = _config(w, capped=False)
    whole = decide(_snapshot(w, _machines(w), w.names), cfg, NOW)
    assert launched == {qp.queue: len(qp.launches) for qp in whole.queues}


def test_an_unpriced_machine_elsewhere_counts_at_its_queues_cap() -> None:
    """A launch intent another shard committed has no price yet: it counts at its queue's
    `max_price_per_hour`, as it does when listed."""
    w = World((0, 3), (0, 0), (0, 0), (1.0, 0.3), None, 1.5, 2, (0, 1))
    cfg = _config(w)
    listed = Snapshot(
        (QueueSnapshot("q0", None, (Machine("x", InstanceState.PENDING, NOW, provider="gpu"),)),)
    )
    counted = Snapshot(elsewhere=(Billing("q0", InstanceState.PENDING, 1, 0.0, 1),))
    assert usage(listed, cfg) == usage(counted, cfg) == (1, 1.0)
    shard = Snapshot((QueueSnapshot("q1", metrics(3, queue="q1")),), elsewhere=counted.elsewhere)
    plan = decide(shard, cfg, NOW, ["q1"])
    assert [qp.queue for qp in plan.queues] == ["q1"]
    assert len(plan.queues[0].launches) == 1  # $1.00 + $0.30 <= $1.50 < $1.00 + 2 x $0.30


def _summary(plan: Plan) -> list[tuple[str, int, int, tuple[str, ...]]]:
    return [
        (qp.queue, len(qp.launches), len(qp.resumes), tuple(sorted(w.kind for w in qp.waits)))
        for qp in plan.queues
    ]


@settings(max_examples=400, deadline=None)
@given(worlds(), st.lists(st.tuples(st.integers(0, 7), st.integers(1, 4)), max_size=4))
def test_a_plan_still_granted_after_the_recount_is_what_decide_makes_again(
    w: World, extra: list[tuple[int, int]]
) -> None:
    """Between a shard's decide() and its account lock, other shards commit launches; where
    `still_granted` keeps the plan, deciding again would have made the very same one."""
    cfg = _config(w)
    machines = _machines(w)
    held = queues_of(w.names, 0, w.shards)
    plan = decide(_snapshot(w, machines, held), cfg, NOW, held)
    others = [q for q in w.names if q not in held]
    for i, n in extra if others else ():
        q = others[i % len(others)]
        machines[q] = machines[q] + [
            Machine(f"{q}-x{i}-{k}", InstanceState.PENDING, NOW, provider="gpu") for k in range(n)
        ]
    after = _snapshot(w, machines, held)
    if still_granted(plan, after, cfg):
        event("kept")
        assert _summary(decide(after, cfg, NOW, held)) == _summary(plan)
    else:
        event("decided again")
