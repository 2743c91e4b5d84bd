"""One registration idiom for the lifecycle steps, held whole: a step's name
(`control.outbox.StepName`), its declaration (`control/steps/<name>.py`, `STEP`), its Celery task
and its route to the lifecycle queue (`settings.LIFECYCLE_TASKS`) all come through
`control.tasks.STEPS`. Forget any one and a test here fails."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
from types import ModuleType

import pytest

from autoscaler.control import steps
from autoscaler.control.outbox import STEP_NAMES
from autoscaler.control.steps.frame import Step
from autoscaler.settings import LIFECYCLE_TASKS

NOT_STEPS = {
    "autoscaler.tick",
    "autoscaler.fast_path",
    "autoscaler.reconcile",
    "autoscaler.retention",
    "autoscaler.scale",
    "autoscaler.check_store",
}
"""The control plane's tasks that are no lifecycle step (they take no launch id)."""


@pytest.fixture
def tasks(monkeypatch: pytest.MonkeyPatch, tmp_path) -> ModuleType:
    monkeypatch.setenv("AUTOSCALER_HOME", str(tmp_path))  # celeryconfig's embedded home
    from autoscaler.control import tasks

    return tasks


def test_every_step_name_has_its_declaration_and_its_task(tasks: ModuleType) -> None:
    assert sorted(tasks.STEPS) == sorted(STEP_NAMES), "a step name with no declaration or task"
    for name, registered in tasks.STEPS.items():
        assert registered.declaration.name == name
        task = tasks.app.tasks[f"autoscaler.{name}"]
        assert registered.task.name == task.name == f"autoscaler.{name}"
        assert task.acks_late, name  # a worker lost mid-step leaves it to run again


def test_every_declared_step_is_registered(tasks: ModuleType) -> None:
    registered = [r.declaration for r in tasks.STEPS.values()]
    declared = 0
    for info in pkgutil.iter_modules(steps.__path__):
        module = importlib.import_module(f"{steps.__name__}.{info.name}")
        for _, kind in inspect.getmembers(module, inspect.isclass):
            if kind is Step or not issubclass(kind, Step) or kind.__module__ != module.__name__:
                continue
            declared += 1
            step = getattr(module, "STEP", None)
            assert isinstance(step, kind), f"{module.__name__} declares {kind.__name__}: no STEP"
            assert any(step is r for r in registered), f"{module.__name__}.STEP is not in STEPS"
    assert declared == len(registered)


def test_every_lifecycle_task_is_a_step_routed_to_the_lifecycle_queue(tasks: ModuleType) -> None:
    ours = {name for name in tasks.app.tasks if name.startswith("autoscaler.")}
    step_tasks = {f"autoscaler.{name}" for name in tasks.STEPS}
    assert ours - step_tasks - NOT_STEPS == set(), "a task that is no step (nor named in NOT_STEPS)"
    assert set(LIFECYCLE_TASKS) == step_tasks | {"autoscaler.reconcile"}
