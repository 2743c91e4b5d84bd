"""The tables `status`, `instances` and `events` print: read-only views of the state store
(`autoscaler/store/`: `queue_views`, `machine_views`, `spend`, `event_views`, `boots`) laid out
for a terminal, or as the JSON document of `--json`."""

from __future__ import annotations

import textwrap
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy.orm import Session

from autoscaler.cli.tables import age, clock, money, table
from autoscaler.settings import Settings, redact_url
from autoscaler.store import (
    boot_phases,
    config_versions,
    event_views,
    machine_views,
    queue_views,
    spend,
)
from autoscaler.store.boots import BootTimeView, boot_times


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


def _backoff_text(q: queue_views.QueueView, now: datetime) -> str:
    if not q.backoffs:
        return "—"
    return "; ".join(
        f"{b.provider} ×{b.failures} for {age((b.until - now).total_seconds())}" for b in q.backoffs
    )


def _provider_text(p: queue_views.ProviderStateView, now: datetime) -> str:
    """One provider of a queue that lists several: `gpu-runpod serving (2 machines)`,
    `gpu-vast key refused until 14:05 (401 …)`."""
    text = f"{p.provider} {p.state}"
    if p.machines:
        text += f" ({p.machines} machine{'s' if p.machines != 1 else ''})"
    if p.until is not None:
        text += f" until {clock(p.until, now)}"
    if p.detail:
        text += f": {p.detail[:120]}"
    return text


def _manual_text(q: queue_views.QueueView, now: datetime) -> str:
    t = q.manual_target
    if t is None:
        return "auto"
    return f"{t.workers} for {age((t.until - now).total_seconds())} ({t.set_by})"


def _desired_text(q: queue_views.QueueView) -> str:
    return "—" if q.desired is None else str(q.desired)


def _stopped_text(q: queue_views.QueueView) -> str:
    """Stopped machines of the queue's warm pool, out of its size: 1/2."""
    w = q.warm_pool
    if w.size:
        return f"{w.stopped}/{w.size}"
    return str(w.stopped) if w.stopped else "—"


def _warm_line(q: queue_views.QueueView) -> str | None:
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
    machines = machine_views.instances(session, now, queue=queue)
    queues = queue_views.queues(session, now, machines=machines, only=queue)
    spent = spend.spend(session, now)
    note = embedded_broker_note(settings)
    boots = boot_times(session, now, queue=queue)
    return {
        "generated_at": now.isoformat(),
        "config_version": config_versions.current_version(session),
        "control_broker": {"url": redact_url(settings.broker_url), "embedded": note is not None},
        "notes": [note] if note else [],
        "queues": [q.as_json() for q in queues],
        "instances": [m.as_json() for m in machines],
        "spend": spent.as_json(),
        "boots": [b.as_json() for b in boots],
    }


def render_status(
    session: Session, settings: Settings, now: datetime, queue: str | None = None
) -> str:
    machines = machine_views.instances(session, now, queue=queue)
    queues = queue_views.queues(session, now, machines=machines, only=queue)
    spent = spend.spend(session, now)
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
            if q.providers:
                lines.append("providers: " + "; ".join(_provider_text(p, now) for p in q.providers))
            for b in q.backoffs if not q.providers else ():
                lines.append(
                    f"backoff: {b.provider} after {b.failures} failure(s), no launch until "
                    f"{clock(b.until, now)}" + (f": {b.last_error}" if b.last_error else "")
                )
            if q.preemptions_today or q.early_ack_losses_today or q.requeued_today:
                lines.append(
                    f"lost machines today: {q.preemptions_today} preempted; "
                    f"{q.requeued_today} with their jobs requeued by the broker, "
                    f"{q.early_ack_losses_today} lost while running early-acked jobs"
                    + (
                        "; preempting hosts: "
                        + ", ".join(f"{h} ×{n}" for h, n in sorted(q.preempting_hosts.items()))
                        if q.preempting_hosts
                        else ""
                    )
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
    boots = render_boot_times(boot_times(session, now, queue=queue), queue)
    if boots:
        out += ["", boots]
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


def _busy_text(m: machine_views.InstanceView) -> str:
    if m.state in ("stopping", "stopped", "resuming"):
        return "warm pool" + (f", resumed ×{m.resumes}" if m.resumes else "")
    if m.busy:
        return f"busy ({m.running_tasks})"
    if m.idle_seconds is not None:
        return f"idle {age(m.idle_seconds)}" + (" · drain when idle" if m.drain_requested else "")
    return "—"


def _storage_text(m: machine_views.InstanceView) -> str:
    if m.storage_price_per_hour is not None:
        return money(m.storage_price_per_hour, 3)
    return "?" if m.state in ("stopping", "stopped", "resuming") else "—"


def render_instances(
    machines: Sequence[machine_views.InstanceView], now: datetime, empty: str = "no machine"
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


def render_boot_times(boots: Sequence[BootTimeView], queue: str | None = None) -> str:
    """Median and p90 boot (launch decision → ready, cold boots of the last 7 days) per
    (provider, GPU), with how many boots; "" when there is none."""
    if not boots:
        return ""
    rows = [
        [b.provider, b.gpu or "—", age(b.median_seconds), age(b.p90_seconds), b.samples]
        for b in boots
    ]
    whose = f" of {queue}'s machines" if queue is not None else ""
    head = f"boot times{whose} (launch → ready, cold boots of the last 7 days):"
    return head + "\n" + table(["PROVIDER", "GPU", "MEDIAN", "P90", "BOOTS"], rows, right=(2, 3, 4))


PHASE_WORDS = {
    "started": "agent started",
    "registered": "registered",
    "code_fetched": "code fetched",
    "requirements_installed": "requirements installed",
    "worker_up": "worker up",
    "first_job": "first job",
}


def _boot_name(boot: boot_phases.BootView) -> str:
    return f"resume {boot.boot}" if boot.resume else "cold"


def render_machine_boots(m: boot_phases.MachineBoots, now: datetime) -> str:
    """One machine (`autoscaler instances LAUNCH_ID`): where it runs, when it was launched and
    ready, and the phases its agent reported for each boot (the machine's own clock, clamped),
    each with the time since its boot began and since the phase before."""
    where = f"{m.provider}, {m.gpu or 'GPU unknown'}, host {m.host_id or '?'}"
    lines = [f"machine {m.launch_id} (queue {m.queue}; {where}): {m.state}"]
    timing = f"launched {clock(m.created_at, now)}"
    latest = m.boots[-1] if m.boots else None
    if m.resumes:
        timing += f"; resumed ×{m.resumes} from the warm pool"
        if latest is not None and latest.boot == m.resumes and latest.started_at is not None:
            timing += f", the latest at {clock(latest.started_at, now)}"
    if m.ready_at is not None:
        timing += f"; ready {clock(m.ready_at, now)}"
    cold = m.boots[0] if m.boots and m.boots[0].boot == 0 else None
    if cold is not None and cold.ready_seconds is not None:
        timing += f" — boot {age(cold.ready_seconds)} (launch → ready, the control plane's clock)"
    lines.append(timing)
    rows = []
    for b in m.boots:
        previous = b.started_at
        for p in b.phases:
            since = age((p.at - b.started_at).total_seconds()) if b.started_at else "—"
            step = age((p.at - previous).total_seconds()) if previous is not None else "—"
            rows.append(
                [_boot_name(b), PHASE_WORDS.get(p.phase, p.phase), clock(p.at, now), since, step]
            )
            previous = p.at
    lines.append("")
    if rows:
        lines.append(
            table(["BOOT", "PHASE", "AT (UTC)", "SINCE START", "STEP"], rows, right=(3, 4))
        )
        lines.append(
            "(phase times are the machine's own word, for where the time went; boot statistics "
            "use the control plane's)"
        )
    else:
        lines.append("no boot phase reported (its agent reports them as it boots)")
    return "\n".join(lines)


def render_events(events: Sequence[event_views.EventView], now: datetime) -> str:
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
