"""The configuration schema's top: `Config`, its queues and the settings that tie them together.

A queue (`Queue`: its `Deployment`, metrics source and `Autoscale` rules), the account-wide
blocks (`Backoff`, `Limits`, `Evaluation`) and each queue's effective settings
(`QueueSettings`). The blocks they hold have modules of their own: `triggers`,
`metrics_sources`, `machine_specs` and `provider_options`, all over `fields.Strict`, which
refuses unknown keys; every number that spends money or bounds capacity is range-checked in
these models, once, for every caller.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, Literal, Self

from pydantic import Field, PrivateAttr, field_validator, model_validator

from autoscaler.config.durations import Duration
from autoscaler.config.fields import (
    MAX_POLL_INTERVAL,
    MAX_WORKERS,
    MIN_POLL_INTERVAL,
    EnvName,
    Line,
    Name,
    Strict,
    Text,
    distinct,
    shown,
)
from autoscaler.config.machine_specs import InstanceSpec, WarmPool
from autoscaler.config.metrics_sources import CelerySource, MetricsSource
from autoscaler.config.provider_options import ProviderConfig
from autoscaler.config.triggers import ScaleDownTrigger, ScaleUpTrigger, ScheduleUpTrigger

# --------------------------------------------------------------------------- queues


RESERVED_ENV_PREFIX = "AUTOSCALER_"


class Deployment(Strict):
    """What a rented machine runs: the team's task code and how to start its worker.

    `env`: variables the worker starts with (never secrets of the control plane's: they would
    sit on a marketplace host). `git_token_env`: the name of a variable, on the control plane,
    holding a token that can read a private HTTPS repository; the machine gets the token (and
    only it) through its own authenticated deployment request, never in its environment.
    """

    git_url: Line = Field(min_length=1)
    startup_cmd: Text = Field(min_length=1)
    git_ref: Line | None = None
    git_token_env: EnvName | None = None
    env: dict[EnvName, Line] = Field(default_factory=dict, max_length=100)

    @field_validator("git_url", "git_ref")
    @classmethod
    def _not_an_option(cls, value: str | None) -> str | None:
        if value is not None and value.startswith("-"):
            raise ValueError(
                f"{shown(value)} starts with '-', which git reads as an option (a ref such as "
                "'--orphan=x' or a URL such as '--upload-pack=…' would run as one); give a "
                "branch, tag or commit, or a URL with its scheme"
            )
        return value

    @field_validator("env")
    @classmethod
    def _no_reserved_names(cls, env: dict[str, str]) -> dict[str, str]:
        taken = sorted(k for k in env if k.startswith(RESERVED_ENV_PREFIX))
        if taken:
            raise ValueError(
                f"{', '.join(taken)} start with {RESERVED_ENV_PREFIX!r}, which the autoscaler "
                "sets itself; rename them"
            )
        return env


class Autoscale(Strict):
    """A queue's scaling rules. `priority` matters under `limits`: higher is served first,
    equal priorities take turns one machine at a time."""

    enabled: bool = True
    provider: Name | tuple[Name, ...]
    """One provider, or several (`providers` reads both forms): rented where `placement` says
    is best now, failing over to the others."""
    placement: Literal["cheapest", "in_order", "fastest"] = "cheapest"
    """How the offers of several providers are ranked: `cheapest` (price; ties within
    `policy.placement.TIE` go to the lower observed boot time), `in_order` (the list is a
    preference), `fastest` (the lowest observed boot time first)."""
    offer_timeout: Duration = Field(default=10.0, gt=0, le=120)
    """How long a launch waits for each provider's offers (asked in parallel): a provider that
    has not answered by then is skipped for this launch, and backs off."""
    min_workers: int = Field(default=0, ge=0, le=MAX_WORKERS)
    max_workers: int = Field(ge=0, le=MAX_WORKERS)
    priority: int = Field(default=0, ge=-1_000_000, le=1_000_000)
    scale_up: tuple[ScaleUpTrigger, ...] = ()
    scale_down: tuple[ScaleDownTrigger, ...] = ()
    instance: InstanceSpec
    poll_interval: Duration | None = Field(default=None, ge=MIN_POLL_INTERVAL, le=MAX_POLL_INTERVAL)
    boot_timeout: Duration | None = Field(default=None, gt=0)
    max_lifetime: Duration | None = Field(default=None, ge=600)
    """How long one of its machines may serve after its worker came up (or came back from the
    warm pool): past it, the machine is drained whatever it says, and a replacement rented if
    the queue still wants one; still busy `drain_timeout` later, it is destroyed. The one
    bound a machine's own word cannot hold off (a machine that always says `busy` is never
    idle): set it above your longest job. None (the default): no bound."""
    warm_pool: WarmPool = WarmPool()
    hand_made: Literal["auto", "broker", "enrolled"] = "auto"
    """Which workers we did not rent count as capacity. `enrolled`: hand-made machines whose
    agent heartbeats with an enrolment key. `broker`: also Celery workers seen through the
    watched broker's remote control. `auto`: `broker`, except on a watched Redis where rented
    machines get users of their own (AUTOSCALER_API_URL set) — a rented machine can answer
    remote control under any name there, and forged replies must not stop renting."""

    @field_validator("provider")
    @classmethod
    def _provider_list(cls, value: str | tuple[str, ...]) -> str | tuple[str, ...]:
        return value if isinstance(value, str) else distinct(value, "providers")

    @property
    def providers(self) -> tuple[str, ...]:
        """The providers a queue rents from, in the order written."""
        return (self.provider,) if isinstance(self.provider, str) else self.provider

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
        if self.warm_pool.size > self.max_workers:
            raise ValueError(
                f"warm_pool.size ({self.warm_pool.size}) is above max_workers "
                f"({self.max_workers}): the pool only ever holds machines the queue had running; "
                "lower warm_pool.size or raise max_workers"
            )
        return self


class Queue(Strict):
    deployment: Deployment | None = None
    metrics: MetricsSource = CelerySource()
    autoscale: Autoscale | None = None


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

    max_machines: int | None = Field(default=None, ge=0, le=100_000)
    max_price_per_hour: float | None = Field(default=None, ge=0, le=1_000_000)


class Evaluation(Strict):
    """How the evaluation tick is split. `shards: n` evaluates the queues in n parts (a stable
    hash of each name), each its own Celery task under its own lease, so n worker processes
    evaluate at once; account-wide caps stay exact (the shards' launches are checked one shard
    at a time against every machine of the account). PostgreSQL only: SQLite runs one."""

    shards: int = Field(default=1, ge=1, le=64)


class Config(Strict):
    poll_interval: Duration = Field(default=30.0, ge=MIN_POLL_INTERVAL, le=MAX_POLL_INTERVAL)
    boot_timeout: Duration = Field(default=900.0, gt=0)
    heartbeat_timeout: Duration = Field(default=300.0, gt=0)
    drain_timeout: Duration = Field(default=3600.0, gt=0)
    backoff: Backoff = Backoff()
    limits: Limits = Limits()
    evaluation: Evaluation = Evaluation()
    # pydantic copies a mutable default per instance; ruff cannot see across modules that
    # Strict is a pydantic model, so it takes these for class attributes
    providers: dict[Name, ProviderConfig] = {}  # noqa: RUF012
    queues: dict[Name, Queue] = {}  # noqa: RUF012

    _queue_settings: dict[str, QueueSettings] = PrivateAttr(default_factory=dict)
    _config_wide: QueueSettings = PrivateAttr()

    @model_validator(mode="after")
    def _settle_queues(self) -> Config:
        self._settle()
        return self

    def _settle(self) -> None:
        """Every queue's effective settings, once per config (and again on `model_copy`)."""
        self._config_wide = QueueSettings(
            **{f.name: getattr(self, f.name) for f in dataclasses.fields(QueueSettings)}
        )
        self._queue_settings = {
            name: QueueSettings.of(q.autoscale, self._config_wide)
            for name, q in self.queues.items()
        }

    def model_copy(self, *, update: Mapping[str, Any] | None = None, deep: bool = False) -> Self:
        """A copy whose queue settings follow its own fields (an update skips validators)."""
        copied = super().model_copy(update=update, deep=deep)
        copied._settle()
        return copied

    def queue_settings(self, name: str) -> QueueSettings:
        """The effective settings of queue `name`: its own where it sets one, else the
        config-wide ones (all of them for a queue not configured or not autoscaled)."""
        return self._queue_settings.get(name, self._config_wide)


@dataclasses.dataclass(frozen=True)
class QueueSettings:
    """A queue's effective value of every setting it may set for itself in `autoscale:` in
    place of the config-wide one of the same name (`Config.queue_settings`). A setting added
    to both `Autoscale` and `Config` belongs here too (`tests/config/test_queue_settings.py`
    fails until it is)."""

    poll_interval: float
    boot_timeout: float

    @classmethod
    def of(cls, auto: Autoscale | None, config_wide: QueueSettings) -> QueueSettings:
        """`auto`'s own values, the config-wide ones where it sets none (or is None)."""
        if auto is None:
            return config_wide
        own = {f.name: getattr(auto, f.name) for f in dataclasses.fields(cls)}
        return dataclasses.replace(config_wide, **{k: v for k, v in own.items() if v is not None})
