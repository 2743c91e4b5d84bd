"""Control-plane tasks: thin glue, one per lifecycle stage. Arguments are names and ids only
(Flower shows task arguments): no URL, key or token ever travels in a task message.

    autoscaler.tick        evaluate the queues whose poll slot is due (beat, every poll; with
                           evaluation.shards > 1 it sends one tick per shard)
    autoscaler.fast_path   scale from zero within seconds (beat, every second)
    autoscaler.launch      rent the machine of one launch intent
    autoscaler.drain       drain one machine (also the operator's drain)
    autoscaler.terminate   destroy one machine, until the provider confirms
    autoscaler.stop        stop one drained machine for its queue's warm pool
    autoscaler.resume      start one stopped machine of a warm pool again
    autoscaler.handback    give a lost machine's jobs back to the broker
    autoscaler.reconcile   observe workers, compare with the providers, mend (beat)
    autoscaler.retention   forget what no table needs any more (beat, every 10 minutes)
    autoscaler.scale       an operator's target: ["queue", workers] or ["queue", workers, "2h"]
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from celery import Task

from autoscaler.control import manual, reconciler
from autoscaler.control.app import app
from autoscaler.control.outbox import StepName
from autoscaler.control.runtime import log, runtime, utc_now
from autoscaler.control.steps import drain, handback, launch, resume, stop, terminate
from autoscaler.control.steps.frame import Step, run_step
from autoscaler.control.tick import fast_path as fast_path_tick
from autoscaler.control.tick.evaluate import evaluate
from autoscaler.settings import Settings, redact_url
from autoscaler.store.db import make_engine, session_factory, transaction
from autoscaler.store.inspect import store_summary
from autoscaler.store.retention import sweep

STEP_EXPIRES = 600.0


class CeleryOutbox:
    """The `Outbox` on the control broker: each message a task whose arguments are names and
    ids only. `best_effort` (the CLI, the API: outside a worker): a broker that cannot be
    reached is logged, never raised, since reconcile sends every unfinished step again a poll
    later."""

    def __init__(self, *, best_effort: bool = False) -> None:
        self.best_effort = best_effort

    def step(self, step: StepName, launch_id: str, *, after: float | None = None) -> None:
        task = STEPS[step].task
        later = {} if after is None else {"countdown": after}
        self._send(
            f"{step} of {launch_id}",
            lambda: task.apply_async((launch_id,), expires=STEP_EXPIRES, **later),
        )

    def evaluate(self, queue: str) -> None:
        kwargs = {"trigger": "warm_miss", "queue": queue}
        self._send(
            f"the evaluation of {queue}",
            lambda: tick.apply_async(kwargs=kwargs, expires=STEP_EXPIRES),
        )

    def shard(self, number: int) -> None:
        # one shard's poll tick: stale once the next poll has come
        kwargs = {"trigger": "poll", "shard": number}
        self._send(
            f"the tick of shard {number}", lambda: tick.apply_async(kwargs=kwargs, expires=60)
        )

    def _send(self, what: str, send: Callable[[], object]) -> None:
        if not self.best_effort:
            send()
            return
        try:
            send()
        except Exception as exc:
            log.warning("could not send %s (%s); reconcile will", what, exc)


OUTBOX = CeleryOutbox()
"""What the tasks send (in a worker: an error fails the task, whose step is sent again)."""

BEST_EFFORT = CeleryOutbox(best_effort=True)
"""What the CLI and the API send."""


@app.task(name="autoscaler.tick")
def tick(
    trigger: str = "poll", queue: str | None = None, shard: int | None = None
) -> dict[str, Any]:
    """Evaluate (see `evaluate`); with `evaluation.shards` > 1 the poll tick sends one
    tick per shard, each with its `shard` number."""
    queues = [queue] if queue else None
    rt = runtime()
    return evaluate(rt, OUTBOX, trigger=trigger, queues=queues, shard=shard).as_dict()


@app.task(name="autoscaler.fast_path", ignore_result=True)  # every second: keep no result
def fast_path() -> dict[str, Any]:
    return fast_path_tick.fast_path(runtime(), OUTBOX).as_dict()


@dataclass(frozen=True)
class RegisteredStep:
    """A lifecycle step: its declaration (`control/steps/`) and its Celery task."""

    declaration: Step[Any]
    task: Task


def _register(step: Step[Any]) -> tuple[StepName, RegisteredStep]:
    """The step's task `autoscaler.<name>`, taking one launch id (acks late: a worker lost
    mid-step leaves it to be run again), returning the outcome's text."""

    def task(launch_id: str) -> str:
        return str(run_step(step, runtime(), launch_id, OUTBOX))

    task.__name__ = task.__qualname__ = step.name
    task.__doc__ = type(step).__doc__
    return step.name, RegisteredStep(
        step, app.task(name=f"autoscaler.{step.name}", acks_late=True)(task)
    )


STEPS: dict[StepName, RegisteredStep] = dict(
    _register(step)
    for step in (launch.STEP, drain.STEP, terminate.STEP, stop.STEP, resume.STEP, handback.STEP)
)
"""The lifecycle steps by name: each one's declaration and task (`tests/control/
test_step_registry.py` holds them, `outbox.StepName` and `settings.LIFECYCLE_TASKS` alike)."""


@app.task(name="autoscaler.reconcile")
def reconcile() -> dict[str, Any]:
    """One reconcile round, then the watched brokers' forged unacked mutexes cleared."""
    rt = runtime()
    done = reconciler.run_reconcile(rt, OUTBOX)
    handback.sweep_forged_mutexes(rt)
    return done


@app.task(name="autoscaler.retention", ignore_result=True)
def retention() -> dict[str, int]:
    """Old tick slots, events, closed machines and ended holds forgotten (`store.retention`)."""
    rt = runtime()
    return sweep(rt.transaction, utc_now())


@app.task(name="autoscaler.scale")
def scale(queue: str, workers: int | None, for_: str | None = None) -> str:
    """Pin QUEUE at WORKERS machines (within max_workers) for FOR_ (default 1h); null clears."""
    rt = runtime()
    reason = manual.set_target(rt, queue, workers, for_, by="celery call")
    evaluate(rt, OUTBOX, trigger="manual", queues=[queue])
    return reason


@app.task(name="autoscaler.check_store")
def check_store() -> dict[str, Any]:
    """Prove a worker reaches the state store at the migrated revision (operators' smoke test)."""
    settings = Settings.from_env()
    engine = make_engine(settings.database_url)
    try:
        with transaction(session_factory(engine)) as session:
            summary = store_summary(session)
    finally:
        engine.dispose()
    return {"database": redact_url(settings.database_url), **summary}
