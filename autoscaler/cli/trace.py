"""`autoscaler trace export`: the jobs a queue ran, as a trace `simulate` and `tune` replay.

The jobs come from `job_records` (the agents' reports). A job's arrival is the producer's
publish stamp (`autoscaler.brokers.stamp`); an unstamped job's is when it started, so its wait
reads zero and the trace shows the traffic the workers served, not how long it queued. The
summary on stderr says how many jobs are so.
"""

from __future__ import annotations

import contextlib
import csv
import os
import sys
from dataclasses import dataclass
from datetime import datetime
from typing import TextIO

import click

from autoscaler.cli import common
from autoscaler.cli.common import open_store, when
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
    now = common.now()
    start = when(since, "--since", now)
    assert start is not None
    _, sessions = open_store()
    partial = None if output == "-" else f"{output}.partial"
    sink: TextIO | None = None
    try:
        with transaction(sessions) as session:
            rows = job_records.since(session, queue, start, MAX_JOBS + 1)
            for n, (arrived, started, runtime) in enumerate(rows):
                if n == MAX_JOBS:
                    click.echo(
                        f"warning: more than {MAX_JOBS:,} jobs since {start.isoformat()}: the "
                        "trace holds the first ones only (the most a trace may hold); use a "
                        "shorter --since",
                        err=True,
                    )
                    break
                if sink is None:  # the first job: only now is there a trace to write
                    sink = sys.stdout if partial is None else open(partial, "w", encoding="utf-8")  # noqa: SIM115
                    writer = csv.writer(sink, lineterminator="\n")
                    writer.writerow(["arrival_s", "runtime_s", "queue"])
                    summary = _Summary(queue, arrived or started)
                at = arrived or started
                writer.writerow(
                    [
                        f"{summary.add(at, runtime, arrived is None):.3f}",
                        f"{max(0.0, runtime):.3f}",
                        queue,
                    ]
                )
        if sink is None:
            raise click.UsageError(
                f"no jobs of queue {queue!r} recorded since {start.isoformat(timespec='seconds')}: "
                "jobs are recorded from the worker agents' heartbeats (the worker's app must call "
                "autoscaler.agent.hook.install()); check the queue name and --since"
            )
        if partial is not None:
            sink.close()
            os.replace(partial, output)
    finally:
        if partial is not None and sink is not None and not sink.closed:
            sink.close()
            with contextlib.suppress(OSError):
                os.remove(partial)
    click.echo(summary.text(), err=True)


@dataclass
class _Summary:
    """What the export tells on stderr: how many jobs, over how long, how much work, how many
    arrivals are start times (unstamped producers)."""

    queue: str
    first: datetime
    jobs: int = 0
    span: float = 0.0
    work: float = 0.0
    unstamped: int = 0

    def add(self, at: datetime, runtime: float, unstamped: bool) -> float:
        """Count one job; its arrival in seconds from the first (rows come in arrival order)."""
        self.span = (at - self.first).total_seconds()
        self.jobs += 1
        self.work += max(0.0, runtime)
        self.unstamped += unstamped
        return self.span

    def text(self) -> str:
        text = (
            f"{self.jobs} job(s) of {self.queue!r} from {self.first.isoformat(timespec='seconds')}"
            f" over {self.span / 3600:.1f} h, {self.work / 3600:.1f} h of work"
        )
        if self.unstamped:
            text += (
                f"; {self.unstamped} without a publish stamp: their arrival is when they started "
                "(stamp the producers with autoscaler.brokers.stamp.install() for true waits)"
            )
        return text
