"""The `metrics:` block: where a queue's numbers come from, one model per `source`.

Its own module because a metrics source kind is added here (a model over `_SourceBase`, its
`Tag` in `MetricsSource` and its place in `SOURCE_MODELS`) beside its reader in `brokers/`.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, get_args

from pydantic import Discriminator, Field, Tag, model_validator

from autoscaler.config.durations import Duration
from autoscaler.config.fields import EnvName, HttpUrl, Line, Strict, Text, Url

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
