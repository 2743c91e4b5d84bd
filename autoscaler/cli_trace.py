"""`autoscaler trace export`: the jobs a queue ran, as a trace `simulate` and `tune` replay.

The jobs come from `job_records` (the agents' reports). A job's arrival is the producer's
publish stamp (`autoscaler.metrics.stamp`); an unstamped job's is when it started, so its wait
reads zero and the trace shows the traffic the workers served, not how long it queued. The
summary on stderr says how many jobs are so.
"""

from __future__ import annotations

import csv
import io
import sys
from datetime import datetime

import click

from autoscaler.cli_status import _now, _open, _when
from autoscaler.sim.trace import MAX_JOBS
from autoscaler.store import job_records
from autoscaler.store.db import transaction


@click.group()
def trace() -> None:
    """Traces of live traffic, for `simulate` and `tune`."""


@trace.command("export")
@click.option("--queue", required=True, help="The queue whose jobs to export.")
@click.option(
    "--since",
    default="7d",
    show_default=True,
    help="From this long ago (30m, 2h, 7d) or this time (ISO, UTC unless it says).",
)
@click.option(
    "--output",
    "-o",
    type=click.Path(dir_okay=False, writable=True, allow_dash=True),
    default="-",
    show_default=True,
    help="The CSV file to write (arrival_s,runtime_s,queue); '-' for standard output.",
)
def export(queue: str, since: str, output: str) -> None:
    """Write the jobs QUEUE ran since --since as a trace (CSV) for `autoscaler tune --trace`."""
    now = _now()
    start = _when(since, "--since", now)
    assert start is not None
    _, sessions = _open()
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(["arrival_s", "runtime_s", "queue"])
    count = unstamped = 0
    first: datetime | None = None
    work = span = 0.0
    with transaction(sessions) as session:
        for arrived, started, runtime in job_records.since(session, queue, start, MAX_JOBS + 1):
            if count == MAX_JOBS:
                click.echo(
                    f"warning: more than {MAX_JOBS:,} jobs since {start.isoformat()}: the trace "
                    "holds the first ones only (the most a trace may hold); use a shorter --since",
                    err=True,
                )
                break
            at = arrived or started
            first = first or at
            span = (at - first).total_seconds()
            writer.writerow([f"{span:.3f}", f"{max(0.0, runtime):.3f}", queue])
            count += 1
            unstamped += arrived is None
            work += max(0.0, runtime)
    if not count:
        raise click.UsageError(
            f"no jobs of queue {queue!r} recorded since {start.isoformat(timespec='seconds')}: "
            "jobs are recorded from the worker agents' heartbeats (the worker's app must call "
            "autoscaler.agent.hook.install()); check the queue name and --since"
        )
    if output == "-":
        sys.stdout.write(buf.getvalue())
    else:
        with open(output, "w", encoding="utf-8") as fh:
            fh.write(buf.getvalue())
    click.echo(_summary(queue, count, span, work, unstamped, first), err=True)


def _summary(
    queue: str, count: int, span: float, work: float, unstamped: int, first: datetime | None
) -> str:
    began = first.isoformat(timespec="seconds") if first else "?"
    text = (
        f"{count} job(s) of {queue!r} from {began} over {span / 3600:.1f} h, "
        f"{work / 3600:.1f} h of work"
    )
    if unstamped:
        text += (
            f"; {unstamped} without a publish stamp: their arrival is when they started (stamp "
            "the producers with autoscaler.metrics.stamp.install() for true waits)"
        )
    return text
