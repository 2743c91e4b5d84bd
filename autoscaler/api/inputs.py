"""What every request body of the API is checked for before a handler sees it.

Unknown fields are refused, and so is text the state store cannot hold: PostgreSQL's `text`
refuses a NUL byte, and a lone surrogate cannot be encoded as UTF-8. Producers choose task ids;
a NUL in one made every heartbeat of its machine a 503 on PostgreSQL — the agent resent it for
ever, and the machine was judged silent and destroyed. Such a value is a 422 naming its field.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, field_validator


def storable(text: str) -> str:
    """`text` if the store can hold it; ValueError saying why not."""
    if "\x00" in text:
        raise ValueError("contains a NUL byte (\\u0000), which the store cannot hold")
    if any("\ud800" <= c <= "\udfff" for c in text):
        raise ValueError("contains a lone UTF-16 surrogate, which is not UTF-8 text")
    return text


def _storable_values(value: Any) -> Any:
    if isinstance(value, str):
        storable(value)
    elif isinstance(value, list | tuple | set | frozenset):
        for item in value:
            _storable_values(item)
    elif isinstance(value, dict):
        for k, v in value.items():
            _storable_values(k)
            _storable_values(v)
    return value


class RequestBody(BaseModel):
    """A request body: unknown fields refused, every text storable."""

    model_config = ConfigDict(extra="forbid")

    @field_validator("*", mode="after")
    @classmethod
    def _storable(cls, value: Any) -> Any:
        return _storable_values(value)


def _utc(value: datetime) -> datetime:
    """An aware UTC time; a naive one is taken as UTC. Times UTC cannot hold (year 1 with an
    offset east of Greenwich, 9999-12-31 west of it) are refused rather than overflowing."""
    aware = value if value.tzinfo is not None else value.replace(tzinfo=UTC)
    try:
        return aware.astimezone(UTC)
    except OverflowError:
        raise ValueError("is outside the range of UTC times; send an ISO 8601 time") from None


UtcTime = Annotated[datetime, AfterValidator(_utc)]
"""A time in a request body, converted to UTC at the door."""
