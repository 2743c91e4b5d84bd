"""The configuration schema: one pydantic model per block of the YAML.

Every model forbids unknown keys so a typo is refused rather than silently ignored, and every
number that spends money or bounds capacity is range-checked here, once, for every caller.
"""

from __future__ import annotations

import re
from typing import Annotated, Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import croniter
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from autoscaler.config.durations import Duration

DEFAULT_WORKER_IMAGE = "ghcr.io/gpu-queue-autoscaler/worker:latest"


class Strict(BaseModel):
    """Unknown keys are refused (typos), and so are NaN and infinity (an infinite price cap)."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


# --------------------------------------------------------------------------- triggers


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
            int(n) for part in field.split(",") for n in re.findall(r"\d+", part.split("/")[0])
        ]
        bad = [n for n in values if not low <= n <= high]
        where = f"field {i + 1} ({name}) {field!r}"
        if bad and str(bad[0]) == field:
            return f"{where} is out of range {low}-{high}{names}"
        if bad:
            return f"{where}: {bad[0]} is out of range {low}-{high}{names}"
        return f"{where} is not valid (it takes {low}-{high}{names})"
    return None


def _check_cron(expr: str) -> str:
    # croniter also takes a sixth (seconds) field; a Quartz-style "0 0 8 * * *" would then fire
    # at a different time than its author meant, so exactly five fields are accepted.
    fields = expr.split()
    if len(fields) != 5:
        extra = " (a sixth, seconds field is not accepted)" if len(fields) == 6 else ""
        raise ValueError(f"{expr!r} has {len(fields)} fields, not 5{extra}; {CRON_FIX}")
    if not croniter.is_valid(expr):
        problem = _cron_field_problem(fields) or "croniter does not accept it"
        raise ValueError(f"{expr!r} is not a valid cron expression: {problem}; {CRON_FIX}")
    return expr


def _check_timezone(name: str) -> str:
    try:
        ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise ValueError(
            f"{name!r} is not an IANA time zone; use a name like 'UTC' or 'Europe/Paris'"
        ) from None
    return name


class NoWorkersTrigger(Strict):
    """Jobs are pending and no live worker serves the queue: start one machine."""

    trigger: Literal["no_workers"]


class QueueDepthTrigger(Strict):
    """More than `threshold` pending: one more machine; or `target_per_worker` jobs per machine."""

    trigger: Literal["queue_depth"]
    threshold: int | None = Field(default=None, ge=0)
    target_per_worker: int | None = Field(default=None, gt=0)

    @model_validator(mode="after")
    def _one_mode(self) -> QueueDepthTrigger:
        if (self.threshold is None) == (self.target_per_worker is None):
            raise ValueError(
                "queue_depth needs exactly one of 'threshold' or 'target_per_worker'; set "
                "'threshold: N' (add a machine above N pending) or 'target_per_worker: N' "
                "(one machine per N pending)"
            )
        return self


class LatencyTrigger(Strict):
    """The oldest pending job has waited longer than `max_latency`: add a machine."""

    trigger: Literal["latency"]
    max_latency: Duration = Field(gt=0)


class MetricTrigger(Strict):
    """An external value (a Prometheus instant query) above a threshold or per-worker target."""

    trigger: Literal["metric"]
    query: str = Field(min_length=1)
    url: str | None = None
    url_env: str | None = None
    threshold: float | None = Field(default=None, ge=0)
    target_per_worker: float | None = Field(default=None, gt=0)
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


class ScheduleUpTrigger(Strict):
    """Each cron firing holds a floor of `workers` machines for `duration` (pre-warming)."""

    trigger: Literal["schedule"]
    cron: str
    timezone: str = "UTC"
    workers: int = Field(ge=1)
    duration: Duration = Field(gt=0)

    _cron = field_validator("cron")(_check_cron)
    _tz = field_validator("timezone")(_check_timezone)


class IdleTrigger(Strict):
    """A worker that has run no task for `timeout` is drained, most idle first."""

    trigger: Literal["idle"]
    timeout: Duration = Field(gt=0)


class ScheduleDownTrigger(Strict):
    """At each cron firing, go back to `min_workers`: idle drained now, busy once finished."""

    trigger: Literal["schedule"]
    cron: str
    timezone: str = "UTC"

    _cron = field_validator("cron")(_check_cron)
    _tz = field_validator("timezone")(_check_timezone)


ScaleUpTrigger = Annotated[
    NoWorkersTrigger | QueueDepthTrigger | LatencyTrigger | MetricTrigger | ScheduleUpTrigger,
    Field(discriminator="trigger"),
]
ScaleDownTrigger = Annotated[IdleTrigger | ScheduleDownTrigger, Field(discriminator="trigger")]

SCALE_UP_TRIGGERS = ("no_workers", "queue_depth", "latency", "metric", "schedule")
SCALE_DOWN_TRIGGERS = ("idle", "schedule")


# --------------------------------------------------------------------------- queues


class Deployment(Strict):
    """What a rented machine runs: the team's task code and how to start its worker."""

    git_url: str = Field(min_length=1)
    startup_cmd: str = Field(min_length=1)
    git_ref: str | None = None


class InstanceSpec(Strict):
    """The machine to rent for a queue."""

    gpu: str = Field(min_length=1)
    gpu_count: int = Field(default=1, ge=1, le=16)
    disk_gb: int = Field(default=50, ge=1)
    max_price_per_hour: float = Field(gt=0)
    image: str = DEFAULT_WORKER_IMAGE


class MetricsSource(Strict):
    """Where a queue's numbers come from.

    `celery` picks the transport from the URL scheme (redis/rediss, amqp, sqla+); `asynq` reads
    the Go queue runqy is built on; `redis-list` / `redis-stream` serve any other producer
    (`pop_side`: the end of the list workers take from; `group`: the stream's consumer group).
    `timeout` bounds one read; a failing source keeps its last numbers for `stale_after`.
    Without a URL the watched broker of the environment (AUTOSCALER_WATCH_BROKER_URL) is used.
    """

    source: Literal["celery", "asynq", "redis-list", "redis-stream"] = "celery"
    url: str | None = None
    url_env: str | None = None
    queue: str | None = None
    management_url: str | None = None
    global_keyprefix: str = ""
    sep: str = "\x06\x16"
    priority_steps: tuple[int, ...] = (0, 3, 6, 9)
    group: str | None = None
    pop_side: Literal["right", "left"] = "right"
    timeout: Duration = Field(default=5.0, gt=0)
    stale_after: Duration = Field(default=300.0, gt=0)

    @model_validator(mode="after")
    def _one_url(self) -> MetricsSource:
        if self.url is not None and self.url_env is not None:
            raise ValueError("both 'url' and 'url_env' are set; keep only one")
        return self


class Autoscale(Strict):
    """A queue's scaling rules. `priority` matters under `limits`: higher is served first,
    equal priorities take turns one machine at a time."""

    enabled: bool = True
    provider: str = Field(min_length=1)
    min_workers: int = Field(default=0, ge=0)
    max_workers: int = Field(ge=0)
    priority: int = 0
    scale_up: tuple[ScaleUpTrigger, ...] = ()
    scale_down: tuple[ScaleDownTrigger, ...] = ()
    instance: InstanceSpec
    poll_interval: Duration | None = Field(default=None, gt=0)
    boot_timeout: Duration | None = Field(default=None, gt=0)

    @model_validator(mode="after")
    def _bounds(self) -> Autoscale:
        if self.max_workers < self.min_workers:
            raise ValueError(
                f"max_workers ({self.max_workers}) is below min_workers ({self.min_workers}); "
                "raise max_workers or lower min_workers"
            )
        for trig in self.scale_up:
            if isinstance(trig, ScheduleUpTrigger) and trig.workers > self.max_workers:
                raise ValueError(
                    f"a schedule asks for {trig.workers} workers but max_workers is "
                    f"{self.max_workers}; lower the schedule's workers or raise max_workers"
                )
        return self


class Queue(Strict):
    deployment: Deployment | None = None
    metrics: MetricsSource = MetricsSource()
    autoscale: Autoscale | None = None


# --------------------------------------------------------------------------- providers

PROVIDER_KINDS = ("runpod", "vast", "mock", "local")


class _ProviderBase(Strict):
    """Credentials are never written in the YAML: by env var name, or stored encrypted."""

    api_key_env: str | None = None


class RunPodProvider(_ProviderBase):
    kind: Literal["runpod"]
    gpu_types: tuple[str, ...] = ()
    cloud_type: Literal["SECURE", "COMMUNITY"] = "SECURE"
    data_centers: tuple[str, ...] = ()
    base_url: str = "https://api.runpod.io"


class VastProvider(_ProviderBase):
    kind: Literal["vast"]
    verified: bool = True
    countries: tuple[str, ...] = ()
    min_bandwidth_mbps: float | None = Field(default=None, ge=0)
    min_cuda_version: float | None = Field(default=None, gt=0)
    min_reliability: float | None = Field(default=None, ge=0, le=1)
    avoid_host_for: Duration = Field(default=86400.0, gt=0)
    base_url: str = "https://console.vast.ai"


class MockProvider(_ProviderBase):
    """Simulated machines in the database: test triggers without renting anything."""

    kind: Literal["mock"]
    boot_delay: Duration = Field(default=5.0, ge=0)
    boot_failure_rate: float = Field(default=0.0, ge=0, le=1)
    capacity_error_rate: float = Field(default=0.0, ge=0, le=1)
    price_per_hour: float = Field(default=0.40, ge=0)


class LocalProvider(_ProviderBase):
    """ "Rents" by starting a local process per machine; destroys by stopping its process group."""

    kind: Literal["local"]
    command: str | None = None
    price_per_hour: float = Field(default=0.0, ge=0)


ProviderConfig = Annotated[
    RunPodProvider | VastProvider | MockProvider | LocalProvider, Field(discriminator="kind")
]


# --------------------------------------------------------------------------- top level


class Backoff(Strict):
    """Exponential backoff of a failed rental per (queue, provider)."""

    base: Duration = Field(default=30.0, gt=0)
    cap: Duration = Field(default=600.0, gt=0, le=86400)
    jitter: float = Field(default=0.2, ge=0, le=1)

    @model_validator(mode="after")
    def _cap_above_base(self) -> Backoff:
        if self.cap < self.base:
            raise ValueError("backoff cap is below its base; raise 'cap' or lower 'base'")
        return self


class Limits(Strict):
    """Account-wide spend caps shared by all queues, served by `autoscale.priority`."""

    max_machines: int | None = Field(default=None, ge=0)
    max_price_per_hour: float | None = Field(default=None, ge=0)


class Config(Strict):
    poll_interval: Duration = Field(default=30.0, gt=0)
    boot_timeout: Duration = Field(default=900.0, gt=0)
    heartbeat_timeout: Duration = Field(default=300.0, gt=0)
    drain_timeout: Duration = Field(default=3600.0, gt=0)
    backoff: Backoff = Backoff()
    limits: Limits = Limits()
    providers: dict[str, ProviderConfig] = {}
    queues: dict[str, Queue] = {}
