"""`autoscaler status`, `autoscaler instances`, `autoscaler events`: what the fleet is doing.

Read-only: every number comes from the state store through `autoscaler/store/views.py` (the
same views the API and the dashboard can use). Tables for a terminal, `--json` for scripts
(with `--watch`, one JSON document per line), `--watch` to refresh every `--interval` seconds.
"""

from __future__ import annotations

from datetime import datetime

import click
from sqlalchemy.orm import Session

from autoscaler.cli import common
from autoscaler.cli.common import open_store, when
from autoscaler.cli.render import render_events, render_instances, render_status, status_document
from autoscaler.cli.watch import dump, run_view, watch_options
from autoscaler.lifecycle import InstanceState
from autoscaler.store import views


@click.command()
@click.option("--queue", help="Only this queue and its machines (spend stays account-wide).")
@watch_options
def status(
    queue: str | None, as_json: bool, watch: bool, interval: float, iterations: int | None
) -> None:
    """Per queue: pending, oldest job, machines (live, busy, booting, draining), its warm pool
    (stopped of size, today's warm hits and misses, storage $/h), what the last evaluation
    wants and why, backoffs, manual target; per machine: queue, provider, GPU, state, busy/idle,
    age, $/h and cost so far at its real price (stopped ones: storage $/h, since, destroy
    time); spend now and today (a stopped machine at its storage price)."""
    settings, sessions = open_store()

    def produce(session: Session, now: datetime) -> str:
        if as_json:
            return dump(status_document(session, settings, now, queue), watch)
        return render_status(session, settings, now, queue)

    run_view(
        produce, sessions, watch=watch, interval=interval, iterations=iterations, as_json=as_json
    )


STATES = [s.value for s in InstanceState]


@click.command()
@click.option("--queue", help="Only this queue's machines.")
@click.option(
    "--state", "states", multiple=True, type=click.Choice(STATES), help="Only these states."
)
@click.option("--all", "include_closed", is_flag=True, help="Closed machines too (newest first).")
@click.option("--limit", type=click.IntRange(1, 10_000), default=500, show_default=True)
@watch_options
def instances(
    queue: str | None,
    states: tuple[str, ...],
    include_closed: bool,
    limit: int,
    as_json: bool,
    watch: bool,
    interval: float,
    iterations: int | None,
) -> None:
    """Machines that may bill (or --all / --state): id, queue, provider, GPU, state, busy or
    idle, age, $/h and cost so far at the real price; a warm pool's machines also their
    storage $/h, since when they are stopped and when they will be destroyed."""
    _, sessions = open_store()

    def produce(session: Session, now: datetime) -> str:
        found = views.instances(
            session,
            now,
            queue=queue,
            states=[InstanceState(s) for s in states] or None,
            include_closed=include_closed,
            limit=limit,
        )
        if as_json:
            return dump([m.as_json() for m in found], watch)
        return render_instances(found, now, empty="no machine matches")

    run_view(
        produce, sessions, watch=watch, interval=interval, iterations=iterations, as_json=as_json
    )


@click.command()
@click.option("--queue", help="Only this queue's events.")
@click.option("--instance", "launch_id", help="Only this machine's (its launch id or a prefix).")
@click.option(
    "--kind",
    "kinds",
    multiple=True,
    help="Only events of this kind or action (repeatable): scale_up, scale_down, wait, launch, "
    "drain, terminate, manual, agent, reconcile, warm_pool (hit, miss)…",
)
@click.option("--since", help="From this long ago (30m, 2h, 1d) or this time (ISO, UTC).")
@click.option("--until", help="Up to this long ago or this time.")
@click.option("--limit", type=click.IntRange(1, 10_000), default=50, show_default=True)
@watch_options
def events(
    queue: str | None,
    launch_id: str | None,
    kinds: tuple[str, ...],
    since: str | None,
    until: str | None,
    limit: int,
    as_json: bool,
    watch: bool,
    interval: float,
    iterations: int | None,
) -> None:
    """The audit trail: every decision and action with its reason, oldest first (the newest
    --limit that match)."""
    now = common.now()
    start, end = when(since, "--since", now), when(until, "--until", now)
    _, sessions = open_store()

    def produce(session: Session, now: datetime) -> str:
        found = views.events(
            session,
            queue=queue,
            launch_id=launch_id,
            kinds=kinds,
            since=start,
            until=end,
            limit=limit,
        )
        if as_json:
            return dump([e.as_json() for e in found], watch)
        return render_events(found, now)

    run_view(
        produce, sessions, watch=watch, interval=interval, iterations=iterations, as_json=as_json
    )
