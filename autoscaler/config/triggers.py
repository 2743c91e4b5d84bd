"""The `scale_up:` and `scale_down:` trigger models, one per kind, each saying what it does.

Its own module because a trigger kind is added here with its `describe()` and its place in the
`ScaleUpTrigger` or `ScaleDownTrigger` union, beside the cron and time zone checks the schedules
use; its vote lives in `policy/triggers.py`.
"""

from __future__ import annotations

import re
from datetime import datetime
from typing import Annotated, Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import CroniterError, croniter
from pydantic import Field, field_validator, model_validator

from autoscaler.config.durations import Duration, format_duration
from autoscaler.config.fields import (
    MAX_WORKERS,
    EnvName,
    HttpUrl,
    Strict,
    Text,
    control_chars,
    shown,
)
from autoscaler.config.machine_specs import WarmPool

CRON_FIELDS = (
    ("minute", 0, 59, ""),
    ("hour", 0, 23, ""),
    ("day-of-month", 1, 31, ""),
    ("month", 1, 12, " or jan-dec"),
    ("day-of-week", 0, 7, " or sun-sat, 0 and 7 both Sunday"),
)
CRON_FIX = (
    'write five fields "minute hour day-of-month month day-of-week", e.g. "0 8 * * 1-5" '
    "(8:00 on weekdays); each takes a number, '*', a list 1,5, a range 1-5 or a step */15"
)


def _cron_field_problem(fields: list[str]) -> str | None:
    """Which of five cron fields is wrong and why, judged one field at a time."""
    for i, (field, (name, low, high, names)) in enumerate(zip(fields, CRON_FIELDS, strict=True)):
        alone = ["*"] * 5
        alone[i] = field
        if croniter.is_valid(" ".join(alone)):
            continue
        # numbers of values and ranges (not of steps: */90 is a step, not a minute)
        values = [
            int(n) for part in field.split(",") for n in re.findall(r"[0-9]+", part.split("/")[0])
        ]
        bad = [n for n in values if not low <= n <= high]
        where = f"field {i + 1} ({name}) {field!r}"
        if bad and str(bad[0]) == field:
            return f"{where} is out of range {low}-{high}{names}"
        if bad:
            return f"{where}: {bad[0]} is out of range {low}-{high}{names}"
        return f"{where} is not valid (it takes {low}-{high}{names})"
    return None


CRON_HORIZON_FROM = datetime(2025, 3, 1)
"""Every cron must fire within a year of this date (after a February 29: "0 0 29 2 *", which
fires once in four years, is refused like "0 0 31 2 *", which never fires and stalls beat)."""


def _check_cron(expr: str) -> str:
    # croniter also takes a sixth (seconds) field; a Quartz-style "0 0 8 * * *" would then fire
    # at a different time than its author meant, so exactly five fields are accepted.
    if len(expr) > 100:
        raise ValueError(f"the cron expression is {len(expr)} characters long; {CRON_FIX}")
    if not expr.isascii():
        raise ValueError(
            f"{shown(expr)} has characters outside ASCII (another script's digits, a no-break "
            f"or zero-width space?); write it in ASCII digits 0-9 and symbols: {CRON_FIX}"
        )
    if expr != expr.strip() or control_chars(expr) or any(c.isspace() and c != " " for c in expr):
        raise ValueError(
            f"{shown(expr)} has blanks around it, tabs, newlines or control characters; "
            f"write the five fields separated by single spaces: {CRON_FIX}"
        )
    fields = expr.split()
    if len(fields) != 5:
        extra = " (a sixth, seconds field is not accepted)" if len(fields) == 6 else ""
        raise ValueError(f"{expr!r} has {len(fields)} fields, not 5{extra}; {CRON_FIX}")
    if not croniter.is_valid(expr):
        problem = _cron_field_problem(fields) or "croniter does not accept it"
        raise ValueError(f"{expr!r} is not a valid cron expression: {problem}; {CRON_FIX}")
    try:
        croniter(expr, CRON_HORIZON_FROM, max_years_between_matches=1).get_next(datetime)
    except (CroniterError, ValueError, OverflowError):
        raise ValueError(
            f"{expr!r} does not fire within a year (a day that does not exist in its month, "
            "such as February 30, or February 29 only); use days every month has (1-28), or "
            "'L' for the month's last day"
        ) from None
    return expr


def _check_timezone(name: str) -> str:
    try:
        if len(name) > 64 or control_chars(name):
            raise ValueError(name)
        ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        raise ValueError(
            f"{shown(name)} is not an IANA time zone; use a name like 'UTC' or 'Europe/Paris'"
        ) from None
    return name


def next_firing(cron: str, tz: str, now: datetime) -> str:
    """When `cron` next fires after `now`, in its time zone, as the dry run shows it."""
    local_now = now.astimezone(ZoneInfo(tz))
    try:  # the schema refuses crons that do not fire within a year; never crash the dry run
        nxt = croniter(cron, local_now, max_years_between_matches=2).get_next(datetime)
    except (CroniterError, ValueError, OverflowError):
        return "not within a year"
    return f"{nxt:%Y-%m-%d %H:%M} {tz}"


class _Trigger(Strict):
    """What every trigger kind (one class per kind, in `ScaleUpTrigger` or `ScaleDownTrigger`)
    has beside its options: it says what it does (`tests/config/test_trigger_kinds.py` fails
    when a kind does not)."""

    def describe(self, now: datetime, warm_pool: WarmPool | None = None) -> str:
        """What the trigger does, on one line of the dry run (`autoscaler validate`): `now`
        dates a schedule's next firing; `warm_pool`, the queue's, says what becomes of a
        drained machine."""
        raise NotImplementedError(f"trigger kind {type(self).__name__} does not describe itself")


class NoWorkersTrigger(_Trigger):
    """Jobs are pending and no live worker serves the queue: start one machine."""

    trigger: Literal["no_workers"]

    def describe(self, now: datetime, warm_pool: WarmPool | None = None) -> str:
        return "jobs pending and no live worker serves the queue → start 1 machine"


class QueueDepthTrigger(_Trigger):
    """More than `threshold` pending: one more machine; or `target_per_worker` jobs per machine."""

    trigger: Literal["queue_depth"]
    threshold: int | None = Field(default=None, ge=0, le=10**9)
    target_per_worker: int | None = Field(default=None, gt=0, le=10**9)

    @model_validator(mode="after")
    def _one_mode(self) -> QueueDepthTrigger:
        if (self.threshold is None) == (self.target_per_worker is None):
            raise ValueError(
                "queue_depth needs exactly one of 'threshold' or 'target_per_worker'; set "
                "'threshold: N' (add a machine above N pending) or 'target_per_worker: N' "
                "(one machine per N pending)"
            )
        return self

    def describe(self, now: datetime, warm_pool: WarmPool | None = None) -> str:
        if self.target_per_worker is not None:
            return f"queue depth → ceil(pending / {self.target_per_worker}) machines"
        return f"more than {self.threshold} jobs pending → add 1 machine"


class LatencyTrigger(_Trigger):
    """The oldest pending job has waited longer than `max_latency`: add a machine."""

    trigger: Literal["latency"]
    max_latency: Duration = Field(gt=0)

    def describe(self, now: datetime, warm_pool: WarmPool | None = None) -> str:
        return f"oldest pending job older than {format_duration(self.max_latency)} → add 1 machine"


class MetricTrigger(_Trigger):
    """An external value (a Prometheus instant query) above a threshold or per-worker target."""

    trigger: Literal["metric"]
    query: Text = Field(min_length=1)
    url: HttpUrl | None = None
    url_env: EnvName | None = None
    threshold: float | None = Field(default=None, ge=0, le=1e15)
    target_per_worker: float | None = Field(default=None, gt=0, le=1e15)
    timeout: Duration = Field(default=5.0, gt=0)

    @model_validator(mode="after")
    def _one_mode(self) -> MetricTrigger:
        if (self.threshold is None) == (self.target_per_worker is None):
            raise ValueError(
                "metric needs exactly one of 'threshold' or 'target_per_worker'; set one of them"
            )
        if self.url is None and self.url_env is None:
            raise ValueError(
                "metric needs the Prometheus address; set 'url' (http://prometheus:9090) "
                "or 'url_env' (the name of an environment variable holding it)"
            )
        return self

    def describe(self, now: datetime, warm_pool: WarmPool | None = None) -> str:
        rule = (
            f"above {self.threshold:g} → add 1 machine"
            if self.threshold is not None
            else f"→ ceil(value / {self.target_per_worker:g}) machines"
        )
        return f"Prometheus {self.query!r} {rule}"


class ScheduleUpTrigger(_Trigger):
    """Each cron firing holds a floor of `workers` machines for `duration` (pre-warming)."""

    trigger: Literal["schedule"]
    cron: str
    timezone: str = "UTC"
    workers: int = Field(ge=1, le=MAX_WORKERS)
    duration: Duration = Field(gt=0)

    _cron = field_validator("cron")(_check_cron)
    _tz = field_validator("timezone")(_check_timezone)

    def describe(self, now: datetime, warm_pool: WarmPool | None = None) -> str:
        return (
            f"schedule {self.cron!r} ({self.timezone}) → keep at least {self.workers} "
            f"machine(s) for {format_duration(self.duration)}; next "
            f"{next_firing(self.cron, self.timezone, now)}"
        )


MIN_GAPS = 8
"""No idle timeout is learned from fewer quiet gaps: the configured one holds until then."""

LEARNED_MAX_FACTOR = 4.0
"""A learned idle timeout never exceeds this × the configured one."""


class IdleTrigger(_Trigger):
    """A worker that has run no task for `timeout` is drained, most idle first.

    `learn` (default on): once the queue has shown enough quiet gaps, and while no job waits,
    the timeout is the one that would have cost least over them
    (`policy.history.learned_idle_timeout`), up to 4 × `timeout`; `learn: false` keeps
    `timeout` exactly."""

    trigger: Literal["idle"]
    timeout: Duration = Field(gt=0)
    learn: bool = True

    def describe(self, now: datetime, warm_pool: WarmPool | None = None) -> str:
        fate = (
            "stop its machine while the warm pool has room, else destroy it"
            if warm_pool is not None and warm_pool.size
            else "destroy its machine"
        )
        return (
            f"a worker has run no task for {format_duration(self.timeout)} → drain it and "
            f"{fate} (most idle first, busy workers spared, never below the floor)"
            + (
                f"; once the queue has shown {MIN_GAPS} quiet gaps, the timeout that would have "
                f"cost least over them (up to "
                f"{format_duration(self.timeout * LEARNED_MAX_FACTOR)}; `learn: false` turns it "
                "off)"
                if self.learn
                else ""
            )
        )


class ScheduleDownTrigger(_Trigger):
    """At each cron firing, go back to `min_workers`: idle drained now, busy once finished."""

    trigger: Literal["schedule"]
    cron: str
    timezone: str = "UTC"

    _cron = field_validator("cron")(_check_cron)
    _tz = field_validator("timezone")(_check_timezone)

    def describe(self, now: datetime, warm_pool: WarmPool | None = None) -> str:
        return (
            f"schedule {self.cron!r} ({self.timezone}) → back to min_workers (idle drained "
            f"now, busy once they finish); next {next_firing(self.cron, self.timezone, now)}"
        )


ScaleUpTrigger = Annotated[
    NoWorkersTrigger | QueueDepthTrigger | LatencyTrigger | MetricTrigger | ScheduleUpTrigger,
    Field(discriminator="trigger"),
]
ScaleDownTrigger = Annotated[IdleTrigger | ScheduleDownTrigger, Field(discriminator="trigger")]

SCALE_UP_TRIGGERS = ("no_workers", "queue_depth", "latency", "metric", "schedule")
SCALE_DOWN_TRIGGERS = ("idle", "schedule")
