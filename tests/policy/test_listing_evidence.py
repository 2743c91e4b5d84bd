"""A listing is evidence only about what existed before it was taken (#34), tried by hypothesis
over every ordering of one step's commit with a reconcile round.

A round reads the rows (R0), lists the provider (L), reads the rows again (R1) and judges
(`unsettled`, then `reconcile`). A step (a stop for the warm pool, a create, a resume and its
worker coming up, a boot coming up) changes the machine at the provider (P) and then commits
its row (C, P < C). Wherever P and C fall, a healthy machine is never destroyed, lost or
failed, nor its machine taken for an orphan. Before the rule, a stop committed between L and
R1 destroyed the machine and a create committed there lost it (tests/control/
test_listing_race.py has both with the loop's own steps)."""

from __future__ import annotations

from datetime import datetime, timedelta

import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from autoscaler.config import load_config_text
from autoscaler.lifecycle import InstanceState, MachineStatus
from autoscaler.policy import warm
from autoscaler.policy.reconcile import (
    Listed,
    ProviderView,
    Row,
    reconcile,
    unsettled,
)

from .helpers import PROVIDERS
from .test_reconcile import NOW, label

S = InstanceState
M = MachineStatus
R0, L, R1 = 3.0, 5.0, 7.0
"""Seconds after the round's clock: the first read of the rows, the listing, the second read."""

# kind -> (row state before, row state after, provider before, provider after); None: not
# listed. Each step as the loop runs it: its intent is committed before it calls the provider
# (the drain's STOPPING, the launch's CREATING, the tick's RESUMING), its outcome after.
STEPS = {
    "stop": (S.STOPPING, S.STOPPED, M.RUNNING, M.STOPPED),
    "create": (S.CREATING, S.BOOTING, None, M.RUNNING),
    "resume intent": (S.STOPPED, S.RESUMING, M.STOPPED, M.STOPPED),
    "resumed and ready": (S.RESUMING, S.READY, M.STOPPED, M.RUNNING),
    "ready": (S.BOOTING, S.READY, M.RUNNING, M.RUNNING),
}
HARM = {S.TERMINATING, S.LOST, S.FAILED}
AUTO = {
    "provider": "gpu",
    "max_workers": 4,
    "instance": {"gpu": "RTX 4090", "max_price_per_hour": 0.6},
    "warm_pool": {"size": 1, "keep_for": "1h"},
}
CFG = load_config_text(
    yaml.safe_dump({"queues": {"q": {"autoscale": AUTO}}}), registered_providers=PROVIDERS
)
SPEC = warm.spec_key(CFG.queues["q"].autoscale)  # type: ignore[arg-type]


def at(seconds: float) -> datetime:
    return NOW + timedelta(seconds=seconds)


def row(kind: str, state: InstanceState, since: datetime, committed: bool) -> Row:
    created = kind == "create"
    return Row(
        launch_id="L1",
        queue="q",
        provider="gpu",
        state=state,
        since=since,
        provider_instance_id="p1" if (committed or not created) else None,
        last_seen_at=since if state == S.READY else None,
        spec_key=SPEC,
    )


@settings(max_examples=400, deadline=None)
@given(
    kind=st.sampled_from(sorted(STEPS)),
    p=st.floats(min_value=0.0, max_value=10.0),
    gap=st.floats(min_value=0.001, max_value=10.0),
)
def test_no_ordering_of_a_step_and_a_round_harms_a_healthy_machine(kind, p, gap):
    before_state, after_state, listed_before, listed_after = STEPS[kind]
    c = p + gap
    start = at(-1.0)  # the row's state before the step began
    done_by = {t: c < t for t in (R0, R1)}  # the row committed by the first / second read

    def read(t: float) -> Row:
        if done_by[t]:
            return row(kind, after_state, at(c), committed=True)
        return row(kind, before_state, start, committed=False)

    first, second = read(R0), read(R1)
    before = {first.launch_id: (first.state, first.since)}
    status = listed_after if p < L else listed_before
    machines = () if status is None else (Listed("p1", "L1", label("L1"), status),)
    views = {"gpu": ProviderView("gpu", True, machines)}
    moved = unsettled((second,), before)
    assert (second.launch_id in moved) == (R0 <= c < R1)

    # the round's clock is read before R0, as run_reconcile reads it
    plan = reconcile((second,), views, {}, CFG, NOW, moved)
    harmed = [t for t in plan.transitions if t.dst in HARM]
    assert not harmed, (kind, p, c, harmed)
    assert not plan.destroys and not plan.orphans


def test_without_the_rule_the_races_of_the_issue_harm_the_machine():
    """The two cases of the issue, judged without `unsettled`: the property above is not
    vacuous."""
    views = {"gpu": ProviderView("gpu", True, (Listed("p1", "L1", label("L1"), M.RUNNING),))}
    stopped = row("stop", S.STOPPED, at(6.0), committed=True)
    (t,) = reconcile((stopped,), views, {}, CFG, NOW).transitions
    assert t.dst == S.TERMINATING
    booting = row("create", S.BOOTING, at(6.0), committed=True)
    (t,) = reconcile((booting,), {"gpu": ProviderView("gpu", True, ())}, {}, CFG, NOW).transitions
    assert t.dst in HARM
