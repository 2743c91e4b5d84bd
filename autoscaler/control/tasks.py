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

from typing import Any

from autoscaler.control import drain as drain_step
from autoscaler.control import handback as handback_step
from autoscaler.control import launch as launch_step
from autoscaler.control import manual, reconciler
from autoscaler.control import resume as resume_step
from autoscaler.control import stop as stop_step
from autoscaler.control import terminate as terminate_step
from autoscaler.control.app import app
from autoscaler.control.runtime import log, runtime, utc_now
from autoscaler.control.tick import fast_path as fast_path_tick
from autoscaler.control.tick.evaluate import evaluate
from autoscaler.settings import Settings, redact_url
from autoscaler.store.db import make_engine, session_factory, transaction
from autoscaler.store.inspect import store_summary
from autoscaler.store.retention import sweep

STEP_EXPIRES = 600.0


def enqueue(step: str, launch_id: str) -> None:
    """Send the lifecycle task `step` for one machine (the loop's `Enqueue` port); `evaluate`
    takes a queue's name instead, and evaluates that queue now (after a warm miss)."""
    if step == "evaluate":
        tick.apply_async(kwargs={"trigger": "warm_miss", "queue": launch_id}, expires=STEP_EXPIRES)
        return
    if step == "shard":  # one shard's poll tick: stale once the next poll has come
        tick.apply_async(kwargs={"trigger": "poll", "shard": int(launch_id)}, expires=60)
        return
    STEPS[step].apply_async((launch_id,), expires=STEP_EXPIRES)


def send_step(step: str, launch_id: str) -> None:
    """`enqueue` from outside a worker (the CLI, the API): best effort, since reconcile sends
    every unfinished step again a poll later; a broker that cannot be reached is logged."""
    try:
        enqueue(step, launch_id)
    except Exception as exc:
        log.warning("could not send %s of %s (%s); reconcile will", step, launch_id, exc)


@app.task(name="autoscaler.tick")
def tick(
    trigger: str = "poll", queue: str | None = None, shard: int | None = None
) -> dict[str, Any]:
    """Evaluate (see `evaluate`); with `evaluation.shards` > 1 the poll tick sends one
    tick per shard, each with its `shard` number."""
    queues = [queue] if queue else None
    rt = runtime()
    return evaluate(rt, enqueue, trigger=trigger, queues=queues, shard=shard).as_dict()


@app.task(name="autoscaler.fast_path", ignore_result=True)  # every second: keep no result
def fast_path() -> dict[str, Any]:
    return fast_path_tick.fast_path(runtime(), enqueue).as_dict()


@app.task(name="autoscaler.launch", acks_late=True)
def launch(launch_id: str) -> str:
    return launch_step.run_launch(runtime(), launch_id, enqueue=enqueue)


@app.task(name="autoscaler.drain", acks_late=True)
def drain(launch_id: str) -> str:
    """Drain one machine (a machine not ready yet is cancelled; see `control.drain`)."""
    why = "asked to drain it through autoscaler.drain"
    return drain_step.run_drain(runtime(), launch_id, why, enqueue=enqueue)


@app.task(name="autoscaler.terminate", acks_late=True)
def terminate(launch_id: str) -> str:
    return terminate_step.run_terminate(runtime(), launch_id)


@app.task(name="autoscaler.stop", acks_late=True)
def stop(launch_id: str) -> str:
    return stop_step.run_stop(runtime(), launch_id, enqueue=enqueue)


@app.task(name="autoscaler.resume", acks_late=True)
def resume(launch_id: str) -> str:
    return resume_step.run_resume(runtime(), launch_id, enqueue=enqueue)


@app.task(name="autoscaler.handback", acks_late=True)
def handback(launch_id: str) -> str:
    """Hand a lost machine's jobs back to the broker (sent again with a countdown when not due
    yet; reconcile sends it every round until it is done)."""

    def later(seconds: float) -> None:
        handback.apply_async((launch_id,), countdown=seconds, expires=STEP_EXPIRES)

    return handback_step.run_handback(runtime(), launch_id, later)


STEPS = {
    "launch": launch,
    "drain": drain,
    "terminate": terminate,
    "stop": stop,
    "resume": resume,
    "handback": handback,
}
"""The lifecycle tasks by step name, each taking one launch id."""


@app.task(name="autoscaler.reconcile")
def reconcile() -> dict[str, Any]:
    """One reconcile round, then the watched brokers' forged unacked mutexes cleared."""
    rt = runtime()
    done = reconciler.run_reconcile(rt, enqueue)
    handback_step.sweep_forged_mutexes(rt)
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
    evaluate(rt, enqueue, trigger="manual", queues=[queue])
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
