"""The configuration schema: one pydantic model per block of the YAML.

Every model forbids unknown keys so a typo is refused rather than silently ignored, and every
number that spends money or bounds capacity is range-checked here, once, for every caller.
"""

from __future__ import annotations

import dataclasses
import re
import unicodedata
from collections.abc import Mapping
from datetime import datetime
from typing import Annotated, Any, ClassVar, Literal, Self, get_args
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import CroniterError, croniter
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    PrivateAttr,
    Tag,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from autoscaler.config.durations import Duration, format_duration
from autoscaler.digits import ASCII_FORM
from autoscaler.urls import UrlError, parse_url, shown_url, split_url

DEFAULT_WORKER_IMAGE = "ghcr.io/gpu-queue-autoscaler/worker:latest"


class Strict(BaseModel):
    """Unknown keys are refused (typos), and so are NaN and infinity (an infinite price cap).

    A number or a duration written as text is read from ASCII only: pydantic strips a no-break
    space around "3" and Python reads "٣" as 3, so a pasted number would silently mean
    something else (see `autoscaler.digits`)."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    @model_validator(mode="before")
    @classmethod
    def _numbers_in_ascii(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        for name, value in data.items():
            if not (isinstance(name, str) and isinstance(value, str)) or value.isascii():
                continue
            field = cls.model_fields.get(name)
            if field is not None and _numeric(field.annotation):
                raise PydanticCustomError(
                    NOT_ASCII_NUMBER,
                    "{shown} is written with characters outside ASCII (another script's "
                    "digits, a superscript, a no-break or zero-width space?); write the number "
                    "in {form}",
                    {"field": name, "shown": _shown(value), "form": ASCII_FORM},
                )
        return data


NOT_ASCII_NUMBER = "not_ascii_number"
"""The pydantic error type of a number written outside ASCII (its ctx names the field)."""


def _numeric(annotation: Any) -> bool:
    """Does a field of this type hold numbers (int, float, durations; optional or in a tuple)?"""
    if annotation is bool:
        return False
    if annotation in (int, float):
        return True
    return any(_numeric(arg) for arg in get_args(annotation) if arg is not type(None))


# --------------------------------------------------------------------------- bounds and text

MAX_NAME_LENGTH = 100
"""Queue and provider names: the store's provider column holds 100 characters."""
MAX_WORKERS = 10_000
"""Machines per queue; far above any real fleet, low enough that worst-case costs stay finite."""
MAX_PRICE_PER_HOUR = 1_000.0
"""Dollars per hour for one machine."""
MAX_POLL_INTERVAL = 86_400.0
MIN_POLL_INTERVAL = 1.0


def _control_chars(value: str) -> list[str]:
    return [c for c in value if unicodedata.category(c)[0] == "C"]


def _shown(value: str, limit: int = 40) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 2] + "…" + text[0]


def _check_name(value: str) -> str:
    rule = (
        f"a name is 1 to {MAX_NAME_LENGTH} characters: letters, digits and punctuation such as "
        "- _ . : @ /, without spaces, tabs, newlines or control characters"
    )
    if not value:
        raise ValueError(f"the name is empty; {rule}")
    if len(value) > MAX_NAME_LENGTH:
        raise ValueError(f"the name is {len(value)} characters long; {rule}")
    if value.strip() != value or not value.strip():
        raise ValueError(f"the name {_shown(value)} starts or ends with blanks; {rule}")
    if any(c.isspace() for c in value) or _control_chars(value):
        raise ValueError(f"the name {_shown(value)} holds blanks or control characters; {rule}")
    return value


def _check_line(value: str) -> str:
    """One line of text: no control characters (a newline, a tab, a NUL byte...)."""
    bad = _control_chars(value)
    if bad:
        raise ValueError(
            f"{_shown(value)} holds the control character {bad[0]!r}; write it on one line "
            "without control characters"
        )
    return value


def _check_text(value: str) -> str:
    """Free text (a command, a query): anything but a NUL byte, which no database can store."""
    if "\x00" in value:
        raise ValueError("the text holds a NUL byte; remove it")
    return value


def _check_env_name(value: str) -> str:
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]{0,199}", value):
        # the value is not shown: a key pasted here by mistake must not be printed
        raise ValueError(
            "this is not the name of an environment variable; give a name such as "
            "VAST_API_KEY (letters, digits and _, not starting with a digit) — never the key"
        )
    return value


def _check_url(value: str) -> str:
    try:
        parse_url(value)
    except UrlError as exc:
        raise ValueError(str(exc)) from None
    return value


def _check_http_url(value: str) -> str:
    try:
        parse_url(value, schemes=("http", "https"), need_host=True, example="https://host:9090")
    except UrlError as exc:
        raise ValueError(str(exc)) from None
    return value


Name = Annotated[str, AfterValidator(_check_name)]
"""A queue or provider name."""
Line = Annotated[str, Field(max_length=1000), AfterValidator(_check_line)]
Text = Annotated[str, Field(max_length=20_000), AfterValidator(_check_text)]
EnvName = Annotated[str, AfterValidator(_check_env_name)]
Url = Annotated[str, AfterValidator(_check_url)]
HttpUrl = Annotated[str, AfterValidator(_check_http_url)]


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
            f"{_shown(expr)} has characters outside ASCII (another script's digits, a no-break "
            f"or zero-width space?); write it in ASCII digits 0-9 and symbols: {CRON_FIX}"
        )
    if expr != expr.strip() or _control_chars(expr) or any(c.isspace() and c != " " for c in expr):
        raise ValueError(
            f"{_shown(expr)} has blanks around it, tabs, newlines or control characters; "
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
        if len(name) > 64 or _control_chars(name):
            raise ValueError(name)
        ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        raise ValueError(
            f"{_shown(name)} is not an IANA time zone; use a name like 'UTC' or 'Europe/Paris'"
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
                f"{_shown(value)} starts with '-', which git reads as an option (a ref such as "
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


GpuName = Annotated[Line, Field(min_length=1, max_length=100)]


def _distinct(values: tuple[str, ...], what: str) -> tuple[str, ...]:
    """A list of names in preference order: at least one, none twice."""
    if not values:
        raise ValueError(f"the list of {what} is empty; name one at least")
    seen: set[str] = set()
    for value in values:
        if value in seen:
            raise ValueError(f"{value!r} is listed twice; keep one")
        seen.add(value)
    return values


class Interruptible(Strict):
    """Rent part of the queue's machines as interruptible (Vast's bid instances): at `bid` per
    hour per machine — dollars, or a share of the offer's on-demand price ("50%") — and at most
    `max_share` of the queue's machines; the rest on demand. An outbid machine is stopped by
    the provider: reconcile sees it, hands its jobs back, destroys it and rents a replacement."""

    bid: float | str
    max_share: float = Field(default=0.5, gt=0, le=1)

    @field_validator("bid")
    @classmethod
    def _bid(cls, value: float | str) -> float | str:
        if isinstance(value, str):
            text = value.strip()
            number = text[:-1].strip() if text.endswith("%") else None
            try:
                share = float(number) if number is not None and number.isascii() else None
            except ValueError:
                share = None
            if share is None or not 0 < share <= 100:
                raise ValueError(
                    f'bid {value!r} is neither dollars per hour nor a share like "50%" '
                    '(above 0, at most 100); write e.g. 0.30 or "50%"'
                )
            return f"{share:g}%"
        if not 0 < value <= MAX_PRICE_PER_HOUR:
            raise ValueError(f"bid {value} $/h must be above 0 and at most {MAX_PRICE_PER_HOUR:g}")
        return value

    def price(self, on_demand: float) -> float:
        """The bid in dollars per hour for an offer whose on-demand price is `on_demand`."""
        if isinstance(self.bid, str):
            return round(on_demand * float(self.bid[:-1]) / 100, 6)
        return self.bid


class InstanceSpec(Strict):
    """The machine to rent for a queue. `gpu`: one name or several acceptable GPUs in
    preference order (`gpus` reads both forms); names resolve to each provider's identifiers
    through `config.gpus`."""

    gpu: GpuName | tuple[GpuName, ...]
    gpu_count: int = Field(default=1, ge=1, le=16)
    disk_gb: int = Field(default=50, ge=1, le=100_000)
    max_price_per_hour: float = Field(gt=0, le=MAX_PRICE_PER_HOUR)
    image: Line = Field(default=DEFAULT_WORKER_IMAGE, min_length=1)
    interruptible: Interruptible | None = None
    """Part of the machines rented interruptible (Vast bids): off when absent."""

    @field_validator("gpu")
    @classmethod
    def _gpu_list(cls, value: str | tuple[str, ...]) -> str | tuple[str, ...]:
        return value if isinstance(value, str) else _distinct(value, "GPUs")

    @model_validator(mode="after")
    def _bid_under_the_cap(self) -> InstanceSpec:
        bid = self.interruptible.bid if self.interruptible is not None else None
        if isinstance(bid, float | int) and bid > self.max_price_per_hour:
            raise ValueError(
                f"interruptible.bid ({bid:g} $/h) is above max_price_per_hour "
                f"({self.max_price_per_hour:g}): no offer could be rented at it; lower the bid"
            )
        return self

    @property
    def gpus(self) -> tuple[str, ...]:
        """The acceptable GPUs, in preference order."""
        return (self.gpu,) if isinstance(self.gpu, str) else self.gpu


_FLAT_DEFAULTS: dict[str, Any] = {
    "management_url": None,
    "sep": "\x06\x16",
    "priority_steps": [0, 3, 6, 9],
    "group": None,
    "pop_side": "right",
    "shared_exchange": "refuse",
}
"""The defaults of the fields one source has and another has not, as the flat `metrics:` model
(one model for every source, before the per-source models) wrote them into stored documents."""


def _is_flat_default(name: str, value: Any) -> bool:
    default = _FLAT_DEFAULTS[name]
    if isinstance(default, list):
        return isinstance(value, list | tuple) and list(value) == default
    return value is default if default is None else type(value) is str and value == default


class _SourceBase(Strict):
    """What every source has. `timeout` bounds one read; a failing source keeps its last
    numbers for `stale_after`. Without a URL the watched broker of the environment
    (AUTOSCALER_WATCH_BROKER_URL) is used. `global_keyprefix` is the key prefix (kombu's on
    Celery's Redis transport; the lists' or streams' on redis-list / redis-stream)."""

    url: Url | None = None
    url_env: EnvName | None = None
    queue: Line | None = Field(default=None, min_length=1, max_length=200)
    global_keyprefix: Line = Field(default="", max_length=200)
    timeout: Duration = Field(default=5.0, gt=0)
    stale_after: Duration = Field(default=300.0, gt=0)

    @model_validator(mode="before")
    @classmethod
    def _flat_defaults(cls, data: Any) -> Any:
        """Stored config documents were dumped from the flat model and hold every source's
        fields: drop another source's field where it holds the flat model's default (it meant
        nothing there); any other value of it stays, and is refused as an unknown key."""
        if not isinstance(data, dict):
            return data
        foreign = [
            k
            for k, v in data.items()
            if k in _FLAT_DEFAULTS and k not in cls.model_fields and _is_flat_default(k, v)
        ]
        return {k: v for k, v in data.items() if k not in foreign} if foreign else data

    @model_validator(mode="after")
    def _one_url(self) -> _SourceBase:
        if self.url is not None and self.url_env is not None:
            raise ValueError("both 'url' and 'url_env' are set; keep only one")
        return self


class CelerySource(_SourceBase):
    """Celery's queues; the transport follows the URL scheme (redis/rediss, amqp, sqla+).
    `sep` and `priority_steps` are kombu's Redis priority lists (the producers'
    broker_transport_options); `management_url` is RabbitMQ's management API."""

    source: Literal["celery"] = "celery"
    management_url: HttpUrl | None = None
    sep: Text = Field(default="\x06\x16", min_length=1, max_length=16)
    priority_steps: tuple[Annotated[int, Field(ge=0, le=255)], ...] = Field(
        default=(0, 3, 6, 9), min_length=1, max_length=256
    )
    shared_exchange: Literal["refuse", "accept"] = "refuse"
    """A queue whose exchange also routes to other queues (its `_kombu.binding.<queue>` set
    names them): a machine's own broker user could bind its queue there and receive copies of
    their messages. `refuse` (default) makes no per-machine user for it; `accept` makes one."""
    piece_budget: int = Field(default=500, ge=300, le=100_000)
    """On Redis: the work one server call of the read may do (each command, each message
    examined and each KiB of it count one). The watched Redis serves nobody else while a call
    runs: 500 is about 1 ms (`benchmarks/metrics.py`); the calls of a read are pipelined."""


class AsynqSource(_SourceBase):
    """The Go queue runqy is built on."""

    source: Literal["asynq"] = "asynq"


class RedisListSource(_SourceBase):
    """Plain Redis lists of any producer; `pop_side`: the end of the list workers take from."""

    source: Literal["redis-list"] = "redis-list"
    pop_side: Literal["right", "left"] = "right"


class RedisStreamSource(_SourceBase):
    """Redis streams of any producer; `group`: the stream's consumer group."""

    source: Literal["redis-stream"] = "redis-stream"
    group: Line | None = Field(default=None, min_length=1, max_length=200)


def metrics_source_tag(value: Any) -> Any:
    """A `metrics:` block's source; a block without one is Celery's (as it always was)."""
    if isinstance(value, dict):
        tag = value.get("source", "celery")
        return tag if isinstance(tag, str) else repr(tag)[:60]
    return getattr(value, "source", "celery")


MetricsSource = Annotated[
    Annotated[CelerySource, Tag("celery")]
    | Annotated[AsynqSource, Tag("asynq")]
    | Annotated[RedisListSource, Tag("redis-list")]
    | Annotated[RedisStreamSource, Tag("redis-stream")],
    Discriminator(metrics_source_tag),
]
"""Where a queue's numbers come from: one model per `source`."""
SOURCE_MODELS: tuple[type[_SourceBase], ...] = (
    CelerySource,
    AsynqSource,
    RedisListSource,
    RedisStreamSource,
)
METRICS_SOURCES: tuple[str, ...] = tuple(
    get_args(m.model_fields["source"].annotation)[0] for m in SOURCE_MODELS
)


class WarmPool(Strict):
    """Stopped machines kept for a queue (`autoscale.warm_pool`): an idle machine, once drained,
    is stopped with its disk kept instead of destroyed, and a later launch resumes it (the
    provider's start plus the worker's start) instead of renting cold. Off at `size: 0`."""

    size: int = Field(default=0, ge=0, le=MAX_WORKERS)
    """At most this many stopped machines kept for the queue."""
    keep_for: Duration = Field(default=86400.0, gt=0)
    """A machine stopped this long is destroyed."""
    resume_timeout: Duration = Field(default=120.0, gt=0)
    """A resumed machine without a ready worker by then is destroyed (a warm miss), and a fresh
    one is rented at once."""


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
        return value if isinstance(value, str) else _distinct(value, "providers")

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


# --------------------------------------------------------------------------- providers

HOURS_PER_MONTH = 730.0
"""Hours in a billing month (365 × 24 / 12), to turn $/GB-month into $/h."""


def money(x: float) -> str:
    """A price as people write it: $0.40, $1.5."""
    return f"${x:.2f}" if round(x, 2) == x else f"${x:g}"


class _ProviderBase(Strict):
    """What every provider kind declares beside its options (one class per kind, registered in
    `ProviderConfig`; its machines come from `providers.registry.FACTORIES[kind]`).

    Credentials are never written in the YAML: by env var name, or stored encrypted."""

    needs_key: ClassVar[bool] = False
    """Machines of this kind are rented with an API key (the vault, or `api_key_env`)."""
    ready_when_running: ClassVar[bool] = False
    """A machine the provider lists as running is ready: it runs no worker of ours to wait for
    (the mock provider's simulated machines)."""
    can_stop: ClassVar[bool] = False
    """Machines of this kind can be stopped with their disk kept and started again (a warm
    pool's need); `providers.base.Provider.can_stop` reads it from here."""
    can_bid: ClassVar[bool] = False
    """Machines of this kind can be rented interruptible at a bid (`instance.interruptible`):
    Vast's bid instances; the mock provider accepts the setting (its machines stay on demand)."""

    api_key_env: EnvName | None = None

    def terms(self) -> str:
        """What the dry run says this provider rents (`autoscaler validate`)."""
        raise NotImplementedError(f"provider kind {type(self).__name__} does not say its terms")

    def known_price(self, spec: InstanceSpec) -> tuple[float, str] | None:
        """What every machine of `spec` costs before renting, and how; None on a live market."""
        return None

    def known_storage_price(self, spec: InstanceSpec) -> tuple[float, str] | None:
        """What a stopped machine of `spec` bills per hour (its kept disks), and how; None
        where only a live offer says (Vast's per-host storage price)."""
        return None


def _check_volume_gb(value: int) -> int:
    """RunPod makes no volume below 10 GB: refused here rather than at the first create."""
    if value != 0 and value < 10:
        raise ValueError(
            f"{value} GB: RunPod's smallest volume is 10 GB; set volume_gb to 0 (no volume) or "
            "10 or more"
        )
    return value


class RunPodOptions(_ProviderBase):
    needs_key: ClassVar[bool] = True
    kind: Literal["runpod"]
    gpu_types: tuple[Annotated[Line, Field(min_length=1, max_length=100)], ...] = Field(
        default=(), max_length=100
    )
    cloud_type: Literal["SECURE", "COMMUNITY"] = "SECURE"
    data_centers: tuple[Annotated[Line, Field(min_length=1, max_length=100)], ...] = Field(
        default=(), max_length=100
    )
    base_url: HttpUrl = "https://api.runpod.io"
    volume_gb: Annotated[int, AfterValidator(_check_volume_gb)] = Field(default=0, le=100_000)
    """A volume disk per pod (RunPod's `mounts.persistent`), mounted at `volume_mount_path`: the
    only disk a stopped pod keeps (its container disk is erased), so the agent keeps its work
    folder there. A warm pool needs one."""
    volume_mount_path: AbsPath = "/workspace"
    storage_price_per_gb_month: float = Field(default=0.20, ge=0, le=100)
    """What RunPod bills per GB-month for a stopped pod's volume ($0.20 at the time of writing)."""

    can_stop: ClassVar[bool] = True

    def known_storage_price(self, spec: InstanceSpec) -> tuple[float, str] | None:
        price = round(self.volume_gb * self.storage_price_per_gb_month / HOURS_PER_MONTH, 6)
        return price, (
            f"{self.volume_gb} GB volume × {money(self.storage_price_per_gb_month)}/GB-month"
        )

    def terms(self) -> str:
        gpus = ", ".join(self.gpu_types) or "the queue's GPU"
        return f"RunPod {self.cloud_type} cloud, GPU types in order: {gpus}"


class VastOptions(_ProviderBase):
    needs_key: ClassVar[bool] = True
    kind: Literal["vast"]
    verified: bool = True
    countries: tuple[Annotated[Line, Field(min_length=1, max_length=100)], ...] = Field(
        default=(), max_length=300
    )
    min_bandwidth_mbps: float | None = Field(default=None, ge=0, le=1e6)
    min_cuda_version: float | None = Field(default=None, gt=0, le=100)
    min_reliability: float | None = Field(default=None, ge=0, le=1)
    avoid_host_for: Duration = Field(default=86400.0, gt=0)
    base_url: HttpUrl = "https://console.vast.ai"

    can_stop: ClassVar[bool] = True
    can_bid: ClassVar[bool] = True

    def terms(self) -> str:
        terms = ["verified" if self.verified else "any host"]
        if self.countries:
            terms.append("in " + "/".join(self.countries))
        if self.min_bandwidth_mbps is not None:
            terms.append(f"≥{self.min_bandwidth_mbps:g} Mb/s down")
        if self.min_cuda_version is not None:
            terms.append(f"CUDA ≥{self.min_cuda_version:g}")
        if self.min_reliability is not None:
            terms.append(f"reliability ≥{self.min_reliability:g}")
        return "Vast.ai cheapest offer, " + ", ".join(terms)


class MockOptions(_ProviderBase):
    """Simulated machines in the database: test triggers without renting anything."""

    ready_when_running: ClassVar[bool] = True
    kind: Literal["mock"]
    boot_delay: Duration = Field(default=5.0, ge=0)
    boot_failure_rate: float = Field(default=0.0, ge=0, le=1)
    capacity_error_rate: float = Field(default=0.0, ge=0, le=1)
    price_per_hour: float = Field(default=0.40, ge=0, le=MAX_PRICE_PER_HOUR)
    stop_delay: Duration = Field(default=2.0, ge=0)
    """Seconds from a stop to the machine reported stopped."""
    start_delay: Duration = Field(default=2.0, ge=0)
    """Seconds from a start to the machine reported running again."""
    resume_failure_rate: float = Field(default=0.0, ge=0, le=1)
    """Share of starts refused as if the host's GPU had been rented meanwhile."""
    storage_price_per_hour: float = Field(default=0.01, ge=0, le=MAX_PRICE_PER_HOUR)

    can_stop: ClassVar[bool] = True
    can_bid: ClassVar[bool] = True

    def terms(self) -> str:
        return "mock machines (nothing is rented)"

    def known_price(self, spec: InstanceSpec) -> tuple[float, str] | None:
        price = round(self.price_per_hour * spec.gpu_count, 6)  # as the mock provider does
        return price, f"{money(self.price_per_hour)}/h × {spec.gpu_count} GPU"

    def known_storage_price(self, spec: InstanceSpec) -> tuple[float, str] | None:
        return self.storage_price_per_hour, f"{money(self.storage_price_per_hour)}/h stopped"


class LocalOptions(_ProviderBase):
    """ "Rents" by starting a local process per machine; destroys by stopping its process group."""

    kind: Literal["local"]
    command: Text | None = None
    price_per_hour: float = Field(default=0.0, ge=0, le=MAX_PRICE_PER_HOUR)

    can_stop: ClassVar[bool] = True

    def terms(self) -> str:
        return "local processes on this machine (nothing is rented)"

    def known_storage_price(self, spec: InstanceSpec) -> tuple[float, str] | None:
        return 0.0, "a folder on this machine"

    def known_price(self, spec: InstanceSpec) -> tuple[float, str] | None:
        return self.price_per_hour, f"{money(self.price_per_hour)}/h per machine"


ENGINE_URLS = "unix:///run/podman/podman.sock, unix:///var/run/docker.sock or tcp://host:2376"


def _check_engine_url(value: str) -> str:
    """A container engine's API: a unix socket by absolute path, or tcp://host:port."""
    try:
        parsed = parse_url(value, schemes=("unix", "tcp"), example="tcp://gpu-server:2376")
    except UrlError as exc:
        raise ValueError(f"{exc}; an engine's API is {ENGINE_URLS}") from None
    parts = split_url(value)
    assert parts is not None  # parse_url accepted it
    shown = shown_url(value)
    if parts.query or parts.fragment or parts.username is not None:
        raise ValueError(
            f"{shown} has a user, query or fragment, which an engine's API does not take; "
            f"write it as {ENGINE_URLS}"
        )
    if parsed.scheme == "unix" and (parts.netloc or len(parts.path) < 2):
        raise ValueError(
            f"{shown} names no socket by its absolute path; write unix:// and the path, e.g. "
            "unix:///run/podman/podman.sock (three slashes)"
        )
    if parsed.scheme == "tcp" and (not parsed.hostname or parsed.port is None):
        raise ValueError(f"{shown} needs a host and a port, e.g. tcp://gpu-server:2376")
    if parsed.scheme == "tcp" and parts.path not in ("", "/"):
        raise ValueError(f"{shown} has a path; an engine on TCP is tcp://host:port")
    return value


def _check_abs_path(value: str) -> str:
    if not value.startswith("/"):
        raise ValueError(
            f"{_shown(value)} is not an absolute path; give the file's full path, e.g. "
            "/etc/autoscaler/engine/cert.pem (every process of the control plane reads it)"
        )
    return value


ENGINE_TCP_WITHOUT_TLS = (
    "serves the engine's API over TCP without TLS, which is refused even on loopback: whoever "
    "can connect to that port (any process or container of that host, or anyone on the network "
    "when it is not loopback) can run containers as root on that host"
)
"""Why an engine's API on tcp:// is refused without TLS, wherever it listens."""
ENGINE_TCP_FIX = (
    "reach the engine through its unix socket (url: unix:///run/podman/podman.sock or "
    "unix:///var/run/docker.sock, or a socket forwarded over SSH from a remote engine), or add "
    "tls: {ca_cert, client_cert, client_key} for an engine started with --tlsverify"
)
HOST_NETWORK_OPT_IN = "unsafe_host_network"
"""The option a provider must set, besides `network: host`, to run its containers on the
host's own network (a development box whose services listen on loopback alone)."""


def _check_network(value: str) -> str:
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}", value):
        raise ValueError(
            f"{_shown(value)} is not a network's name; give bridge (the default), none or the "
            "name of a network of the engine (letters, digits, '_', '.', '-')"
        )
    return value


def is_host_network(value: str) -> bool:
    """`host` (any case): the host's own network stack, loopback included."""
    return value.lower() == "host"


EngineUrl = Annotated[str, AfterValidator(_check_engine_url)]
AbsPath = Annotated[Line, Field(min_length=2), AfterValidator(_check_abs_path)]


class ContainerTls(Strict):
    """Mutual TLS to an engine's API on TCP: the engine's certificate is always verified
    (against `ca_cert`, else the system's CAs) and ours proves who calls it, since whoever may
    call that API is root on its host."""

    ca_cert: AbsPath | None = None
    client_cert: AbsPath
    client_key: AbsPath


class ContainerOptions(_ProviderBase):
    """Containers of the queue's image on a Docker or Podman engine of the team's own (their
    GPU servers): nothing is rented, `price_per_hour` is for the accounts. `gpus` is how many
    GPUs the engine has (0: CPU-only containers, no GPU is asked of the engine)."""

    kind: Literal["container"]
    url: EngineUrl | None = None
    tls: ContainerTls | None = None
    gpu: Annotated[Line, Field(min_length=1, max_length=100)] | None = None
    gpus: int = Field(ge=0, le=64)
    max_machines: int = Field(default=1, ge=1, le=1000)
    price_per_hour: float = Field(default=0.0, ge=0, le=MAX_PRICE_PER_HOUR)
    unsafe_host_network: bool = False
    network: Annotated[str, AfterValidator(_check_network)] = "bridge"
    command: (
        tuple[Annotated[Text, Field(min_length=1)], ...] | Annotated[Text, Field(min_length=1)]
    ) | None = None
    init: bool = True

    @field_validator("command")
    @classmethod
    def _some_command(cls, value: tuple[str, ...] | str | None) -> tuple[str, ...] | str | None:
        if isinstance(value, tuple) and not 1 <= len(value) <= 1000:
            raise ValueError(
                "the command is an empty list; give the program and its arguments, e.g. "
                '["sleep", "infinity"], or leave command out to run the image\'s own'
            )
        return value

    @field_validator("network")
    @classmethod
    def _walled_off(cls, value: str, info: ValidationInfo) -> str:
        """A container on the host's network reaches every service on the host's loopback
        (the broker, the database, an engine's API): refused unless opted into by name."""
        if is_host_network(value) and info.data.get(HOST_NETWORK_OPT_IN) is not True:
            raise ValueError(
                "host puts every container on this host's own network, where it reaches what "
                "listens on the host's loopback (the broker, the database, the engine's API, "
                "which is root on the host); leave network out (the engine's default bridge) "
                "and give workers addresses they can reach (the control plane's public API URL "
                "and broker, host.containers.internal or host.docker.internal on the same "
                "host), or, on a development box whose services listen on loopback alone, add "
                f"{HOST_NETWORK_OPT_IN}: true beside network: host"
            )
        return value

    @model_validator(mode="after")
    def _tls_over_the_network(self) -> ContainerOptions:
        if self.unsafe_host_network and not is_host_network(self.network):
            raise ValueError(
                f"{HOST_NETWORK_OPT_IN} is true but network is {self.network!r}, and the "
                f"opt-in only goes with network: host; remove {HOST_NETWORK_OPT_IN}"
            )
        if self.url is None or not self.url.lower().startswith("tcp://"):
            if self.tls is not None:
                raise ValueError(
                    "tls is given but url is not tcp://…: TLS secures an engine reached over "
                    "TCP; remove tls, or give url: tcp://host:2376"
                )
            return self
        if self.tls is None:
            raise ValueError(
                f"url {shown_url(self.url)} {ENGINE_TCP_WITHOUT_TLS}; {ENGINE_TCP_FIX}"
            )
        return self

    can_stop: ClassVar[bool] = True

    def known_storage_price(self, spec: InstanceSpec) -> tuple[float, str] | None:
        return 0.0, "a stopped container on the team's own engine"

    def terms(self) -> str:
        where = shown_url(self.url) if self.url else "$DOCKER_HOST or the local socket"
        gpus = f"{self.gpus} × {self.gpu or 'GPU'}" if self.gpus else "no GPU"
        return (
            f"containers on the engine at {where}: {gpus}, at most {self.max_machines} at "
            "once, nothing is rented"
        )

    def known_price(self, spec: InstanceSpec) -> tuple[float, str] | None:
        return self.price_per_hour, f"{money(self.price_per_hour)}/h per container"


ProviderConfig = Annotated[
    RunPodOptions | VastOptions | MockOptions | LocalOptions | ContainerOptions,
    Field(discriminator="kind"),
]
"""The one registration of a provider kind's options (beside its factory in
`providers.registry.FACTORIES`); `tests/providers/test_kinds.py` fails when a part is missing."""

PROVIDER_MODELS: tuple[type[_ProviderBase], ...] = get_args(get_args(ProviderConfig)[0])
PROVIDER_KINDS: tuple[str, ...] = tuple(
    get_args(m.model_fields["kind"].annotation)[0] for m in PROVIDER_MODELS
)
KEYED_KINDS: tuple[str, ...] = tuple(
    k for k, m in zip(PROVIDER_KINDS, PROVIDER_MODELS, strict=True) if m.needs_key
)
"""The kinds rented with an API key."""


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
    providers: dict[Name, ProviderConfig] = {}
    queues: dict[Name, Queue] = {}

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
