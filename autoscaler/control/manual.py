"""Operators' manual control (`autoscaler scale/drain`, `celery call autoscaler.scale`): audited."""

from __future__ import annotations

from datetime import datetime, timedelta

from autoscaler.config.durations import format_duration, parse_duration
from autoscaler.control.runtime import Runtime, utc_now
from autoscaler.lifecycle import FINAL_STATES
from autoscaler.store import events, instances, manual_targets

DEFAULT_FOR = 3600.0


class ManualError(ValueError):
    """A manual request that cannot be honoured; the message says why and what to do."""


def set_target(
    rt: Runtime,
    queue: str,
    workers: int | None,
    for_: str | float | None = None,
    by: str = "operator",
    now: datetime | None = None,
) -> str:
    """Pin `queue` at `workers` machines for `for_` (default 1 h); None returns it to its
    triggers. 0 releases every machine (idle ones now, busy ones once they finish)."""
    now = now or utc_now()
    with rt.transaction() as session:
        loaded = rt.load(session)
        if loaded is None:
            raise ManualError("no config applied yet; run 'autoscaler apply FILE' first")
        q = loaded.config.queues.get(queue)
        if q is None or q.autoscale is None:
            known = ", ".join(sorted(loaded.autoscaled)) or "none"
            raise ManualError(f"queue {queue!r} is not autoscaled (autoscaled queues: {known})")
        if workers is None:
            cleared = manual_targets.clear(session, queue)
            reason = f"{by} returned {queue} to its triggers" if cleared else "no manual target"
            events.record(session, [events.event("manual", "clear", reason, queue=queue)], now)
            return reason
        if isinstance(workers, bool) or not isinstance(workers, int) or workers < 0:
            raise ManualError(f"workers must be a whole number ≥ 0, not {workers!r}")
        if workers > q.autoscale.max_workers:
            raise ManualError(
                f"{workers} is above {queue}'s max_workers ({q.autoscale.max_workers}); ask for "
                "at most that, or raise max_workers in the config and apply it"
            )
        try:
            seconds = DEFAULT_FOR if for_ is None else parse_duration(for_)
        except ValueError as exc:
            raise ManualError(f"--for: {exc}") from None
        if seconds <= 0 or seconds > 30 * 86400:
            raise ManualError("the target must last more than 0 s and at most 30 days")
        until = now + timedelta(seconds=seconds)
        manual_targets.put(session, queue, workers, until, by, now)
        reason = (
            f"{by} pinned {queue} at {workers} worker(s) for {format_duration(seconds)} "
            f"(until {until.isoformat(timespec='seconds')})"
        )
        events.record(
            session,
            [
                events.event(
                    "manual",
                    "scale",
                    reason,
                    queue=queue,
                    details={"workers": workers, "until": until.isoformat()},
                )
            ],
            now,
        )
        return reason


def request_drain(rt: Runtime, launch_id: str, by: str = "operator") -> str:
    """Check that `launch_id` can be drained, and audit the request (the drain step does it:
    a machine not ready yet is cancelled, `control.steps.drain`). Only a machine that no longer
    exists is refused."""
    with rt.transaction() as session:
        row = instances.get(session, launch_id)
        if row is None:
            raise ManualError(f"no machine with launch id {launch_id!r} ('autoscaler instances')")
        if row.state in FINAL_STATES:
            raise ManualError(
                f"machine {launch_id} is already {row.state.value} ({row.state_reason or 'closed'})"
                ": there is nothing left to drain"
            )
        events.record(
            session,
            [
                events.event(
                    "manual",
                    "drain",
                    f"{by} asked to drain {launch_id}",
                    queue=row.queue,
                    launch_id=launch_id,
                )
            ],
            utc_now(),
        )
    return f"drain of {launch_id} requested"
