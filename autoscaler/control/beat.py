"""Beat's schedule, built from the stored config (`beat_scheduler` in celeryconfig.py).

Entries: the evaluation tick (every poll interval), the scale-from-zero fast path (every
second), reconcile (every poll interval), retention (every 10 minutes: `store.retention`), and
one entry per `schedule` trigger, fired on its cron minute in its time zone (croniter, the
policy's DST rules), so a pre-warm window opens on its minute rather than up to a poll later.
The schedule is rebuilt when a new config version is applied. Nothing is written to disk. Two
beats at once are harmless: a tick slot is claimed once, one evaluation runs at a time, and
intents count as machines on their way.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from typing import Any

from celery import beat
from celery.schedules import BaseSchedule, schedstate

from autoscaler.config.triggers import ScheduleDownTrigger, ScheduleUpTrigger
from autoscaler.control.runtime import Loaded, log, runtime
from autoscaler.policy.schedule import latest_firing
from autoscaler.store import retention

FAST_PATH_EVERY = 1.0
CONFIG_CHECK_EVERY = 5.0
DEFAULT_INTERVAL = 30.0


class CronSchedule(BaseSchedule):  # type: ignore[misc]
    """A five-field cron in an IANA zone: due once per firing, checked at every minute."""

    def __init__(self, expr: str, timezone: str, **kwargs: Any) -> None:
        self.expr = expr
        self.tz_name = timezone
        super().__init__(**kwargs)

    def is_due(self, last_run_at: datetime) -> schedstate:
        now = datetime.now(UTC)
        fired = latest_firing(self.expr, self.tz_name, now)
        last = last_run_at if last_run_at.tzinfo else last_run_at.replace(tzinfo=UTC)
        to_next_minute = 60.0 - (now.second + now.microsecond / 1e6) + 0.05
        return schedstate(fired > last, to_next_minute)

    def remaining_estimate(self, last_run_at: datetime) -> timedelta:
        return timedelta(seconds=self.is_due(last_run_at).next)

    def __repr__(self) -> str:
        return f"<cron {self.expr!r} {self.tz_name}>"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, CronSchedule) and (other.expr, other.tz_name) == (
            self.expr,
            self.tz_name,
        )

    def __hash__(self) -> int:
        return hash((self.expr, self.tz_name))

    def __reduce__(self) -> tuple[Any, ...]:
        return (self.__class__, (self.expr, self.tz_name))


def entries(loaded: Loaded | None) -> dict[str, dict[str, Any]]:
    """Beat entries for one config version (the defaults when nothing is applied yet)."""
    polls = [loaded.poll_interval(q) for q in loaded.autoscaled] if loaded else []
    tick_every = min(polls, default=loaded.config.poll_interval if loaded else DEFAULT_INTERVAL)
    reconcile_every = loaded.config.poll_interval if loaded else DEFAULT_INTERVAL
    out: dict[str, dict[str, Any]] = {
        "autoscaler-tick": {
            "task": "autoscaler.tick",
            "schedule": timedelta(seconds=tick_every),
            "options": {"expires": max(1.0, tick_every)},
        },
        "autoscaler-fast-path": {
            "task": "autoscaler.fast_path",
            "schedule": timedelta(seconds=FAST_PATH_EVERY),
            "options": {"expires": 2 * FAST_PATH_EVERY},
        },
        "autoscaler-reconcile": {
            "task": "autoscaler.reconcile",
            "schedule": timedelta(seconds=reconcile_every),
            "options": {"expires": max(1.0, reconcile_every)},
        },
        "autoscaler-retention": {
            "task": "autoscaler.retention",
            "schedule": retention.EVERY,
            "options": {"expires": retention.EVERY.total_seconds()},
        },
    }
    if loaded is None:
        return out
    for name, q in sorted(loaded.autoscaled.items()):
        assert q.autoscale is not None
        crons = [
            (f"up{i}", t)
            for i, t in enumerate(q.autoscale.scale_up)
            if isinstance(t, ScheduleUpTrigger)
        ] + [
            (f"down{i}", t)
            for i, t in enumerate(q.autoscale.scale_down)
            if isinstance(t, ScheduleDownTrigger)
        ]
        for tag, trig in crons:
            out[f"schedule:{name}:{tag}"] = {
                "task": "autoscaler.tick",
                "schedule": CronSchedule(trig.cron, trig.timezone),
                "kwargs": {"trigger": f"schedule {trig.cron} ({trig.timezone})", "queue": name},
                "options": {"expires": 120.0},
            }
    return out


class ConfigScheduler(beat.Scheduler):  # type: ignore[misc]
    """In-memory schedule from the store's newest config; rebuilt when the version changes."""

    max_interval = 1.0

    def setup_schedule(self) -> None:
        self._version: int | None = None
        self._checked = 0.0
        self.install_default_entries(self.data)
        self._rebuild(force=True)

    def _rebuild(self, force: bool = False) -> None:
        self._checked = time.monotonic()
        try:
            rt = runtime()
            with rt.transaction() as session:
                loaded = rt.load(session)
        except Exception as exc:  # the store is down: keep the schedule we have
            log.warning(
                "beat: cannot read the config (%s); keeping the schedule", type(exc).__name__
            )
            if not force:
                return
            loaded = None
        version = loaded.version if loaded else None
        if not force and version == self._version:
            return
        self._version = version
        wanted = entries(loaded)
        defaults = {k: v for k, v in self.schedule.items() if k.startswith("celery.")}
        self.merge_inplace(wanted)
        self.schedule.update(defaults)
        log.info("beat: schedule for config version %s: %s", version, ", ".join(sorted(wanted)))

    def tick(self, *args: Any, **kwargs: Any) -> float:
        if time.monotonic() - self._checked >= CONFIG_CHECK_EVERY:
            self._rebuild()
        return float(super().tick(*args, **kwargs))
