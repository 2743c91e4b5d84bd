"""The reconcile port is complete: every action kind of `ReconcilePlan` has its method on the
`ReconcileActions` protocol, the applier hands it over, and both ports (production's and the
simulator's) implement it. mypy checks the signatures (both ports are passed to
`apply_reconcile`); these tests check nothing was forgotten, and that the check can fail."""

from __future__ import annotations

import dataclasses
import inspect
import typing

import pytest

from autoscaler.control import reconcile_executor
from autoscaler.control.reconcile_actions import StoreReconcileActions
from autoscaler.control.reconcile_executor import HANDLERS, ReconcileActions
from autoscaler.policy import reconcile_plan
from autoscaler.policy.reconcile_plan import ACTION_KINDS

JUDGEMENTS = {reconcile_plan.Transition, reconcile_plan.ReconcilePlan}
"""Dataclasses of the plan module that are no action: the rules' judgement, the plan itself."""


def _ports() -> list[type]:
    from autoscaler.sim.reconcile_port import SimReconcileActions

    return [StoreReconcileActions, SimReconcileActions]


def missing(port: type) -> list[str]:
    """The action kinds `port` has no method of its own for."""
    return [
        f"{kind.__name__} -> {name}"
        for kind, name in HANDLERS.items()
        if not callable(getattr(port, name, None))
        or getattr(port, name) is getattr(ReconcileActions, name, None)
    ]


def test_every_dataclass_of_the_plan_module_is_an_action_kind() -> None:
    kinds = {
        obj
        for obj in vars(reconcile_plan).values()
        if inspect.isclass(obj)
        and dataclasses.is_dataclass(obj)
        and obj.__module__ == reconcile_plan.__name__
    }
    assert kinds - JUDGEMENTS == set(ACTION_KINDS)


def test_every_action_kind_has_its_method_on_the_protocol() -> None:
    assert set(HANDLERS) == set(ACTION_KINDS)
    for kind, name in HANDLERS.items():
        method = getattr(ReconcileActions, name, None)
        assert method is not None, f"ReconcileActions has no {name} for {kind.__name__}"
        hints = typing.get_type_hints(method, vars(reconcile_executor))
        param = next(v for k, v in hints.items() if k != "return")
        args = typing.get_args(param)
        assert param is kind or kind in args, f"{name} does not take {kind.__name__}"


def test_the_applier_hands_every_kind_over() -> None:
    source = inspect.getsource(reconcile_executor.apply_reconcile) + inspect.getsource(
        reconcile_executor._consequence
    )
    for name in HANDLERS.values():
        assert f"actions.{name}(" in source, f"apply_reconcile never calls {name}"


@pytest.mark.parametrize("port", _ports(), ids=lambda p: p.__name__)
def test_both_ports_implement_every_action_kind(port: type) -> None:
    assert missing(port) == []


def test_the_check_fails_on_a_port_missing_a_method() -> None:
    class Partial(StoreReconcileActions):
        pass

    Partial.warm_miss = ReconcileActions.warm_miss  # type: ignore[method-assign,assignment]
    assert missing(Partial) == ["WarmMiss -> warm_miss"]

    class Empty:
        pass

    assert len(missing(Empty)) == len(ACTION_KINDS)
