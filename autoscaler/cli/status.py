"""`autoscaler status`, `autoscaler instances`, `autoscaler events`: what the fleet is doing.

Read-only: every number comes from the state store through its views (`autoscaler/store/`: the
same views the API and the dashboard can use). Tables for a terminal, `--json` for scripts
(with `--watch`, one JSON document per line), `--watch` to refresh every `--interval` seconds.
"""

from __future__ import annotations

from datetime import datetime

import click
from sqlalchemy.orm import Session

from autoscaler.cli import common
from autoscaler.cli.common import open_store, when
from autoscaler.cli.render import (
    render_events,
    render_instances,
    render_machine_boots,
    render_status,
    status_document,
)
from autoscaler.cli.watch import dump, run_view, watch_options
from autoscaler.lifecycle import InstanceState
from autoscaler.store import boot_phases, event_views, machine_views


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
    time); spend now and today (a stopped machine at its storage price); median and p90 boot
    per (provider, GPU) over the last 7 days' cold boots, with how many."""
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
@click.argument("launch_id", required=False)
@click.option("--queue", help="Only this queue's machines.")
@click.option(
    "--state", "states", multiple=True, type=click.Choice(STATES), help="Only these states."
)
@click.option("--all", "include_closed", is_flag=True, help="Closed machines too (newest first).")
@click.option("--limit", type=click.IntRange(1, 10_000), default=500, show_default=True)
@watch_options
def instances(
    launch_id: str | None,
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
    storage $/h, since when they are stopped and when they will be destroyed.

    With LAUNCH_ID (or a prefix of one, any state): that machine's provider, GPU and host,
    its boot time, and the phases its agent reported for each boot (started, registered, code
    fetched, requirements installed, worker up, first job)."""
    if launch_id is not None:
        if queue or states or include_closed:
            common.fail("give a LAUNCH_ID or --queue/--state/--all, not both")
        _, sessions = open_store()
        run_view(
            lambda session, now: _machine(session, now, launch_id, as_json, watch),
            sessions,
            watch=watch,
            interval=interval,
            iterations=iterations,
            as_json=as_json,
        )
        return
    _, sessions = open_store()

    def produce(session: Session, now: datetime) -> str:
        found = machine_views.instances(
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


def _machine(session: Session, now: datetime, launch_id: str, as_json: bool, watch: bool) -> str:
    found = boot_phases.machines(session, launch_id)
    if not found:
        common.fail(f"no machine {launch_id!r}: see `autoscaler instances --all`")
    if len(found) > 1:
        shown = ", ".join(m.launch_id for m in found[: boot_phases.MATCHES])
        more = " …" if len(found) > boot_phases.MATCHES else ""
        common.fail(f"{launch_id!r} is the start of several launch ids ({shown}{more}): give more")
    if as_json:
        return dump(found[0].as_json(), watch)
    return render_machine_boots(found[0], now)


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
        found = event_views.events(
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
