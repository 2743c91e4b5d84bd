"""`autoscaler scale` and `autoscaler drain`: an operator's orders to the control loop."""

from __future__ import annotations

import os

import click

from autoscaler.cli.common import fail, sessions, settings
from autoscaler.digits import ASCII_FORM, ascii_whole


@click.command()
@click.argument("queue")
@click.argument("workers", required=False)
@click.option("--for", "for_", help="How long the target holds (default 1h), e.g. 30m, 2h.")
@click.option("--auto", "auto", is_flag=True, help="Drop the manual target: triggers decide.")
@click.option("--by", default=lambda: os.environ.get("USER", "operator"), help="Who asks.")
def scale(queue: str, workers: str | None, for_: str | None, auto: bool, by: str) -> None:
    """Pin QUEUE at WORKERS machines (within max_workers) for a while; 0 releases them all.

    Busy workers are never stopped: they are drained once their task ends. The next tick acts
    on it (the same as `celery -A autoscaler call autoscaler.scale --args '["QUEUE", N]'`).
    """
    from autoscaler.control.manual import ManualError, set_target
    from autoscaler.control.runtime import Runtime

    if auto == (workers is not None):
        fail("give WORKERS (a whole number, 0 releases every machine) or --auto, not both")
    count: int | None = None
    if workers is not None:
        count = ascii_whole(workers)
        if count is None:
            fail(f"WORKERS must be a whole number ≥ 0 in {ASCII_FORM}, not {workers!r}")
    current = settings()
    sessions(current)  # refuses a store that was never migrated
    rt = Runtime(current)
    try:
        click.echo(set_target(rt, queue, count, for_, by=by))
    except ManualError as exc:
        fail(str(exc))
    finally:
        rt.close()


@click.command()
@click.argument("launch_id")
@click.option("--by", default=lambda: os.environ.get("USER", "operator"), help="Who asks.")
def drain(launch_id: str, by: str) -> None:
    """Drain one machine: it takes no new job, finishes its task, then is destroyed.

    A machine not ready yet (pending, creating, booting) is cancelled: never rented, or
    destroyed as soon as it exists. Only a machine already gone is refused."""
    from autoscaler.control.manual import ManualError, request_drain
    from autoscaler.control.runtime import Runtime
    from autoscaler.control.steps.drain import DrainStep
    from autoscaler.control.steps.frame import run_step
    from autoscaler.control.tasks import BEST_EFFORT

    current = settings()
    sessions(current)
    rt = Runtime(current)
    try:
        click.echo(request_drain(rt, launch_id, by))
        click.echo(str(run_step(DrainStep(f"{by} asked to drain it"), rt, launch_id, BEST_EFFORT)))
    except ManualError as exc:
        fail(str(exc))
    finally:
        rt.close()
