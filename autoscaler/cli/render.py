"""The tables `status`, `instances` and `events` print: read-only views of the state store
(`autoscaler/store/views.py`) laid out for a terminal, or as the JSON document of `--json`."""

from __future__ import annotations

import textwrap
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy.orm import Session

from autoscaler.cli.tables import age, clock, money, table
from autoscaler.settings import Settings, redact_url
from autoscaler.store import config_versions, views


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


def _stopped_text(q: views.QueueView) -> str:
    """Stopped machines of the queue's warm pool, out of its size: 1/2."""
    w = q.warm_pool
    if w.size:
        return f"{w.stopped}/{w.size}"
    return str(w.stopped) if w.stopped else "—"


def _warm_line(q: views.QueueView) -> str | None:
    w = q.warm_pool
    if not w.shown:
        return None
    moving = [
        f"{n} {what}" for n, what in ((w.stopping, "stopping"), (w.resuming, "resuming")) if n
    ]
    kept = f", each destroyed {age(w.keep_for)} after its stop" if w.keep_for else ""
    size = f" of {w.size}" if w.size else " (no pool in the config: destroyed at reconcile)"
    return (
        f"warm pool: {w.stopped} stopped{size}"
        + (f" ({', '.join(moving)})" if moving else "")
        + f", storage {money(w.storage_per_hour, 3)}/h{kept}; today {w.hits_today} hit(s), "
        f"{w.misses_today} miss(es)"
    )


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
        # the warm pool's columns only where a queue has one (the seed's table otherwise)
        warm = any(q.warm_pool.shown for q in queues)
        rows = []
        for q in queues:
            w = q.warm_pool
            rows.append(
                [
                    q.queue,
                    "—" if q.pending is None else q.pending,
                    age(q.oldest_age_seconds),
                    q.live,
                    q.busy,
                    q.booting,
                    q.draining,
                    *([_stopped_text(q), f"{w.hits_today}/{w.misses_today}"] if warm else []),
                    _desired_text(q),
                    _manual_text(q, now),
                    _backoff_text(q, now),
                    money(q.spend_per_hour) + "/h",
                ]
            )
        headers = ["QUEUE", "PENDING", "OLDEST", "LIVE", "BUSY", "BOOTING", "DRAINING"]
        headers += ["STOPPED", "HIT/MISS"] if warm else []
        headers += ["DESIRED", "MANUAL", "BACKOFF", "SPEND"]
        right = [*range(1, headers.index("DESIRED") + 1), len(headers) - 1]
        out.append(table(headers, rows, right=right))
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
            warm_line = _warm_line(q)
            if warm_line:
                lines.append(warm_line)
            if q.manual_target is not None:
                t = q.manual_target
                lines.append(
                    f"manual target: {t.workers} worker(s) until {clock(t.until, now)}, set by "
                    f"{t.set_by} (`autoscaler scale {q.queue} --auto` returns it to its triggers)"
                )
            details.append(f"{q.queue}:\n" + "\n".join(f"  {line}" for line in lines))
        out += ["", *details]
    out += ["", render_instances(machines, now, empty="no machine that may bill")]
    stopped = any(m.state == "stopped" for m in machines)
    unknown = (
        f" ({spent.unknown_price} machine(s) of unknown price not counted)"
        if spent.unknown_price
        else ""
    )
    out += [
        "",
        f"spend: {money(spent.rate_per_hour)}/h now; today {money(spent.today)} "
        "(since 00:00 UTC, at the machines' real prices"
        + ("; stopped ones at their storage price" if stopped else "")
        + f"){unknown}",
    ]
    return "\n".join(out)


def _busy_text(m: views.InstanceView) -> str:
    if m.state in ("stopping", "stopped", "resuming"):
        return "warm pool" + (f", resumed ×{m.resumes}" if m.resumes else "")
    if m.busy:
        return f"busy ({m.running_tasks})"
    if m.idle_seconds is not None:
        return f"idle {age(m.idle_seconds)}" + (" · drain when idle" if m.drain_requested else "")
    return "—"


def _storage_text(m: views.InstanceView) -> str:
    if m.storage_price_per_hour is not None:
        return money(m.storage_price_per_hour, 3)
    return "?" if m.state in ("stopping", "stopped", "resuming") else "—"


def render_instances(
    machines: Sequence[views.InstanceView], now: datetime, empty: str = "no machine"
) -> str:
    if not machines:
        return empty
    # a warm pool's columns only when a machine shown is in one (the seed's table otherwise)
    warm = any(
        m.stopped_at is not None or m.state in ("stopping", "stopped", "resuming") for m in machines
    )
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
            *(
                [
                    _storage_text(m),
                    clock(m.stopped_at, now),
                    clock(m.destroy_at, now),
                ]
                if warm
                else []
            ),
        ]
        for m in machines
    ]
    headers = ["INSTANCE", "QUEUE", "PROVIDER", "GPU", "STATE", "WORK", "AGE", "$/H", "COST"]
    headers += ["STORAGE/H", "STOPPED", "DESTROY"] if warm else []
    return table(headers, rows, right=(6, 7, 8, 9) if warm else (6, 7, 8))


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
