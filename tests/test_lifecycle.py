"""The lifecycle table (`autoscaler.lifecycle.STATES`): every state described once, and the
sets the rest of the code reads follow from it."""

from __future__ import annotations

import dataclasses

from autoscaler import lifecycle
from autoscaler.lifecycle import STATES, InstanceState, Traits

S = InstanceState


def test_every_state_has_its_row_and_moves_only_to_states():
    assert set(STATES) == set(InstanceState)
    for state, traits in STATES.items():
        assert traits.next <= set(InstanceState), state
        assert state not in traits.next, f"{state} moves to itself"
    assert {s: t.next for s, t in STATES.items()} == lifecycle.ALLOWED_TRANSITIONS


def test_each_named_set_is_exactly_the_states_with_its_trait():
    named = {
        "live": lifecycle.LIVE_STATES,
        "booting": lifecycle.BOOTING_STATES,
        "leaving": lifecycle.LEAVING_STATES,
        "warm": lifecycle.WARM_STATES,
        "token_opens": lifecycle.TOKEN_STATES,
        "may_serve": lifecycle.MAY_SERVE,
        "heard": lifecycle.HEARD_STATES,
    }
    flags = {f.name for f in dataclasses.fields(Traits)} - {"next"}
    assert set(named) == flags, "a trait without its named set, or the other way round"
    for trait, states in named.items():
        assert set(states) == {s for s, t in STATES.items() if getattr(t, trait)}, trait


def test_the_rules_money_depends_on_hold_in_the_table():
    """A final state bills nothing and opens nothing; every other state can still reach an
    end (nothing is stuck paying for ever); a machine only serves from a state its token
    opens; a warm machine is not capacity."""
    for state, traits in STATES.items():
        if not traits.next:
            assert not (traits.live or traits.token_opens or traits.may_serve), state
        else:
            assert traits.live, f"{state} can still move: it may exist at the provider"
            seen, todo = set(), [state]
            while todo:
                for nxt in STATES[todo.pop()].next - seen:
                    seen.add(nxt)
                    todo.append(nxt)
            assert seen & lifecycle.FINAL_STATES, f"{state} never reaches an end"
        if traits.may_serve or traits.heard:
            assert traits.token_opens, state
        if traits.warm:
            assert not (traits.booting or traits.leaving or traits.may_serve), state
    assert S.TERMINATING in lifecycle.LEAVING_STATES and S.PENDING not in lifecycle.TOKEN_STATES
