"""`autoscaler status`, `autoscaler instances`, `autoscaler events`: what the fleet is doing.

Read-only: every number comes from the state store through `autoscaler/store/views.py` (the
same views the API and the dashboard can use). Tables for a terminal, `--json` for scripts
(with `--watch`, one JSON document per line), `--watch` to refresh every `--interval` seconds.
"""

from __future__ import annotations

import json
import textwrap
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import click
from sqlalchemy.orm import Session, sessionmaker

from autoscaler.config.durations import parse_duration
from autoscaler.lifecycle import InstanceState
from autoscaler.settings import Settings, redact_url
from autoscaler.store import config_versions, views
from autoscaler.store.db import transaction

MAX_CELL = 48


# ---------------------------------------------------------------------------- formatting


def age(seconds: float | None) -> str:
    """45s, 12m05s, 3h05m, 2d04h: two units at most."""
    if seconds is None:
        return "—"
    s = int(max(0.0, seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


def money(value: float | None, digits: int = 2) -> str:
    return "?" if value is None else f"${value:,.{digits}f}"


def clock(at: datetime | None, now: datetime) -> str:
    if at is None:
        return "—"
    return f"{at:%H:%M:%S}" if at.date() == now.date() else f"{at:%Y-%m-%d %H:%M}"


def _cell(value: Any) -> str:
    text = " ".join(str(value).split())
    return text if len(text) <= MAX_CELL else text[: MAX_CELL - 1] + "…"


def table(
    headers: Sequence[str],
    rows: Sequence[Sequence[Any]],
    right: Sequence[int] = (),
    *,
    wide_last: bool = False,
) -> str:
    """Columns padded to their widest cell; `right` columns (numbers) aligned right. Cells are
    one line and at most MAX_CELL characters, but the last column with `wide_last`."""
    cells = [
        [
            _cell(v) if (i < len(r) - 1 or not wide_last) else " ".join(str(v).split())
            for i, v in enumerate(r)
        ]
        for r in rows
    ]
    widths = [len(h) for h in headers]
    for r in cells:
        for i, v in enumerate(r[:-1] if wide_last else r):
            widths[i] = max(widths[i], len(v))
    lines = []
    for r in [list(headers), *cells]:
        parts = []
        for i, v in enumerate(r):
            last = i == len(r) - 1
            if last and wide_last:
                parts.append(v)
            elif i in right:
                parts.append(v.rjust(widths[i]))
            else:
                parts.append(v if last else v.ljust(widths[i]))
        lines.append("  ".join(parts).rstrip())
    return "\n".join(lines)


# ---------------------------------------------------------------------------- renderers


def embedded_broker_note(settings: Settings) -> str | None:
    """What an operator cannot do on the embedded broker, and what to use instead."""
    if not settings.broker_url.startswith("sqla+"):
        return None
    return (
        f"note: the control plane runs on the embedded broker ({redact_url(settings.broker_url)}): "
        "Celery's remote control cannot reach its workers there, so `celery inspect`/`control` "
        "and Flower's worker pages and buttons show nothing live. Use `autoscaler status`, "
        "`autoscaler events` and `autoscaler scale`/`drain` (they work through the store), "
        "`celery -A autoscaler call autoscaler.scale --args '[\"QUEUE\", N]'` for a task, and "
        "set AUTOSCALER_BROKER_URL=redis://… (see deploy/PRODUCTION.md) for remote control."
    )


def _backoff_text(q: views.QueueView, now: datetime) -> str:
    if not q.backoffs:
        return "—"
    return "; ".join(
        f"{b.provider} ×{b.failures} for {age((b.until - now).total_seconds())}" for b in q.backoffs
    )


def _manual_text(q: views.QueueView, now: datetime) -> str:
    t = q.manual_target
    if t is None:
        return "auto"
    return f"{t.workers} for {age((t.until - now).total_seconds())} ({t.set_by})"


def _desired_text(q: views.QueueView) -> str:
    return "—" if q.desired is None else str(q.desired)


def status_document(
    session: Session, settings: Settings, now: datetime, queue: str | None = None
) -> dict[str, Any]:
    machines = views.instances(session, now, queue=queue)
    queues = views.queues(session, now, machines=machines, only=queue)
    spent = views.spend(session, now)
    note = embedded_broker_note(settings)
    return {
        "generated_at": now.isoformat(),
        "config_version": config_versions.current_version(session),
        "control_broker": {"url": redact_url(settings.broker_url), "embedded": note is not None},
        "notes": [note] if note else [],
        "queues": [q.as_json() for q in queues],
        "instances": [m.as_json() for m in machines],
        "spend": spent.as_json(),
    }


def render_status(
    session: Session, settings: Settings, now: datetime, queue: str | None = None
) -> str:
    machines = views.instances(session, now, queue=queue)
    queues = views.queues(session, now, machines=machines, only=queue)
    spent = views.spend(session, now)
    version = config_versions.current_version(session)
    out = [
        f"autoscaler status at {now:%Y-%m-%d %H:%M:%S}Z — config "
        + (f"v{version}" if version else "not applied yet (autoscaler apply FILE)")
    ]
    note = embedded_broker_note(settings)
    if note:
        out.append(textwrap.fill(note, width=100, subsequent_indent="  ", break_on_hyphens=False))
    out.append("")
    if not queues:
        out.append(
            f"no queue named {queue!r}"
            if queue is not None
            else "no queue yet: apply a config with `autoscaler apply FILE`"
        )
    else:
        rows = []
        for q in queues:
            rows.append(
                [
                    q.queue,
                    "—" if q.pending is None else q.pending,
                    age(q.oldest_age_seconds),
                    q.live,
                    q.busy,
                    q.booting,
                    q.draining,
                    _desired_text(q),
                    _manual_text(q, now),
                    _backoff_text(q, now),
                    money(q.spend_per_hour) + "/h",
                ]
            )
        out.append(
            table(
                [
                    "QUEUE",
                    "PENDING",
                    "OLDEST",
                    "LIVE",
                    "BUSY",
                    "BOOTING",
                    "DRAINING",
                    "DESIRED",
                    "MANUAL",
                    "BACKOFF",
                    "SPEND",
                ],
                rows,
                right=(1, 2, 3, 4, 5, 6, 7, 10),
            )
        )
        details = []
        for q in queues:
            lines = []
            if q.desired is not None:
                bounds = f"capacity {q.capacity}, floor {q.floor}, ceiling {q.ceiling}"
                lines.append(
                    f"desired {q.desired} ({bounds}; evaluated {clock(q.evaluated_at, now)})"
                )
            elif q.autoscaled:
                lines.append("not evaluated yet (is beat running?)")
            else:
                lines.append("not autoscaled")
            lines += [f"why: {w}" for w in q.why]
            if q.reading_at is not None:
                stale = (
                    " (stale: last good numbers"
                    + (f"; {q.reading_error})" if q.reading_error else ")")
                    if q.reading_stale
                    else ""
                )
                extra = ""
                if q.running is not None:
                    extra += f", running {q.running}"
                if q.scheduled:
                    extra += f", scheduled {q.scheduled}"
                lines.append(f"read {age((now - q.reading_at).total_seconds())} ago{extra}{stale}")
            else:
                lines.append("no reading yet")
            for b in q.backoffs:
                lines.append(
                    f"backoff: {b.provider} after {b.failures} failure(s), no launch until "
                    f"{clock(b.until, now)}" + (f": {b.last_error}" if b.last_error else "")
                )
            if q.manual_target is not None:
                t = q.manual_target
                lines.append(
                    f"manual target: {t.workers} worker(s) until {clock(t.until, now)}, set by "
                    f"{t.set_by} (`autoscaler scale {q.queue} --auto` returns it to its triggers)"
                )
            details.append(f"{q.queue}:\n" + "\n".join(f"  {line}" for line in lines))
        out += ["", *details]
    out += ["", render_instances(machines, now, empty="no machine that may bill")]
    unknown = (
        f" ({spent.unknown_price} machine(s) of unknown price not counted)"
        if spent.unknown_price
        else ""
    )
    out += [
        "",
        f"spend: {money(spent.rate_per_hour)}/h now; today {money(spent.today)} "
        f"(since 00:00 UTC, at the machines' real prices){unknown}",
    ]
    return "\n".join(out)


def _busy_text(m: views.InstanceView) -> str:
    if m.busy:
        return f"busy ({m.running_tasks})"
    if m.idle_seconds is not None:
        return f"idle {age(m.idle_seconds)}" + (" · drain when idle" if m.drain_requested else "")
    return "—"


def render_instances(
    machines: Sequence[views.InstanceView], now: datetime, empty: str = "no machine"
) -> str:
    if not machines:
        return empty
    rows = [
        [
            m.launch_id,
            m.queue,
            m.provider,
            m.gpu or "—",
            m.state,
            _busy_text(m),
            age(m.age_seconds),
            money(m.price_per_hour, 3),
            money(m.cost_so_far, 2),
        ]
        for m in machines
    ]
    return table(
        ["INSTANCE", "QUEUE", "PROVIDER", "GPU", "STATE", "WORK", "AGE", "$/H", "COST"],
        rows,
        right=(6, 7, 8),
    )


def render_events(events: Sequence[views.EventView], now: datetime) -> str:
    if not events:
        return "no event matches"
    rows = [
        [
            f"{e.at:%Y-%m-%d %H:%M:%S}",
            e.queue or "—",
            e.kind,
            e.action,
            (e.launch_id or "—")[:12],
            e.reason,
        ]
        for e in events
    ]
    return table(
        ["AT (UTC)", "QUEUE", "KIND", "ACTION", "INSTANCE", "REASON"], rows, wide_last=True
    )


# ---------------------------------------------------------------------------- plumbing


def _open() -> tuple[Settings, sessionmaker[Session]]:
    from autoscaler.cli import _sessions, _settings

    settings = _settings()
    return settings, _sessions(settings)


def _now() -> datetime:
    return datetime.now(UTC)


def _emit(text: str, watching: bool) -> None:
    if watching:
        click.clear()
    click.echo(text)


def run_view(
    produce: Callable[[Session, datetime], str],
    sessions: sessionmaker[Session],
    *,
    watch: bool,
    interval: float,
    iterations: int | None,
    as_json: bool,
) -> None:
    """Print once, or (watch) every `interval` seconds until ^C (or `iterations` times)."""
    done = 0
    try:
        while True:
            with transaction(sessions) as session:
                text = produce(session, _now())
            _emit(text, watch and not as_json)
            done += 1
            if not watch or (iterations is not None and done >= iterations):
                return
            time.sleep(interval)
    except KeyboardInterrupt:
        return


def _dump(doc: Any, watch: bool) -> str:
    return json.dumps(doc, sort_keys=True) if watch else json.dumps(doc, indent=2, sort_keys=True)


def _when(value: str | None, option: str, now: datetime) -> datetime | None:
    """--since/--until: a duration ago ("2h", "90") or an ISO time (UTC unless it says)."""
    if value is None:
        return None
    try:
        return now - timedelta(seconds=parse_duration(value))
    except (ValueError, TypeError):
        pass
    try:
        at = datetime.fromisoformat(value.strip())
    except ValueError:
        raise click.BadParameter(
            f"{value[:40]!r} is neither a duration (e.g. 30m, 2h, 1d) nor a time "
            "(e.g. 2026-11-30T08:00, UTC unless a zone is given)",
            param_hint=option,
        ) from None
    return at if at.tzinfo else at.replace(tzinfo=UTC)


def _watch_options(f: Callable[..., Any]) -> Callable[..., Any]:
    f = click.option("--json", "as_json", is_flag=True, help="JSON for scripts.")(f)
    f = click.option("--watch", is_flag=True, help="Refresh until ^C.")(f)
    f = click.option(
        "--interval",
        type=click.FloatRange(0.5, 3600),
        default=2.0,
        show_default=True,
        help="Seconds between refreshes with --watch.",
    )(f)
    f = click.option("--iterations", type=click.IntRange(1, 1_000_000), hidden=True)(f)
    return f


# ---------------------------------------------------------------------------- commands


@click.command()
@click.option("--queue", help="Only this queue and its machines (spend stays account-wide).")
@_watch_options
def status(
    queue: str | None, as_json: bool, watch: bool, interval: float, iterations: int | None
) -> None:
    """Per queue: pending, oldest job, machines (live, busy, booting, draining), what the last
    evaluation wants and why, backoffs, manual target; per machine: queue, provider, GPU,
    state, busy/idle, age, $/h and cost so far at its real price; spend now and today."""
    settings, sessions = _open()

    def produce(session: Session, now: datetime) -> str:
        if as_json:
            return _dump(status_document(session, settings, now, queue), watch)
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
@_watch_options
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
    idle, age, $/h and cost so far at the real price."""
    _, sessions = _open()

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
            return _dump([m.as_json() for m in found], watch)
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
    "drain, terminate, manual, agent, reconcile…",
)
@click.option("--since", help="From this long ago (30m, 2h, 1d) or this time (ISO, UTC).")
@click.option("--until", help="Up to this long ago or this time.")
@click.option("--limit", type=click.IntRange(1, 10_000), default=50, show_default=True)
@_watch_options
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
    now = _now()
    start, end = _when(since, "--since", now), _when(until, "--until", now)
    _, sessions = _open()

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
            return _dump([e.as_json() for e in found], watch)
        return render_events(found, now)

    run_view(
        produce, sessions, watch=watch, interval=interval, iterations=iterations, as_json=as_json
    )


COMMANDS = (status, instances, events)
