"""Every URL a user gives (config, environment) is split here: `parse_url` refuses with a message
(the URL shown without its password), `redact_url` / `url_secrets` keep secrets out of output.

urllib raises ValueError on a bad port or host only when `.port` is read, and it reads
`redis://h:abc/0` or `redis://[::1/0` happily until then; callers never touch urllib directly.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Collection
from dataclasses import dataclass
from typing import Literal
from urllib.parse import SplitResult, parse_qsl, unquote, urlsplit

from autoscaler.digits import ASCII_FORM, ascii_whole

MAX_URL_LENGTH = 2048

SECRET_QUERY_PARAMS = frozenset(
    {
        "password",
        "pass",
        "passwd",
        "pwd",
        "secret",
        "token",
        "key",
        "api_key",
        "apikey",
        "access_token",
        "auth",
    }
)

_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.\-]*://")


class UrlError(ValueError):
    """A URL that cannot be used; the message says why and how to write it (never a password)."""


@dataclass(frozen=True)
class ParsedUrl:
    scheme: str
    hostname: str | None
    port: int | None
    path: str
    raw: str
    db: int | None = None
    """A Redis URL's database number (0 when it names none); None for other schemes."""


REDIS_SCHEMES = frozenset({"redis", "rediss", "unix"})
AMQP_SCHEMES = frozenset({"amqp", "amqps", "pyamqp", "pyamqps"})

Transport = Literal["redis", "amqp", "sqla", "other"]


def transport(url: str) -> Transport:
    """The broker a Celery URL names, decided here alone (readers, worker probes, broker users
    and the isolation check all ask): Redis (redis, rediss, unix), RabbitMQ (amqp, amqps,
    pyamqp, pyamqps), kombu's SQL transport (sqla+...), or anything else."""
    scheme = url.split("://", 1)[0].lower() if "://" in url else ""
    if scheme in REDIS_SCHEMES:
        return "redis"
    if scheme in AMQP_SCHEMES:
        return "amqp"
    return "sqla" if scheme.startswith("sqla+") else "other"


def split_url(url: str) -> SplitResult | None:
    """urllib's split, or None where urllib refuses (an unclosed '[', a bad port...)."""
    try:
        parts = urlsplit(url)
        _ = parts.port  # raises on a bad port or a malformed IPv6 host
    except (ValueError, TypeError):
        return None
    return parts


def url_secrets(url: str) -> list[str]:
    """The secret parts of a URL: its password (raw and decoded) and secret query values.

    The userinfo is split at the *last* '@' (as urllib and redis-py do), so a password written
    with a raw '@' is found whole.
    """
    try:
        parts = urlsplit(url)
    except (ValueError, TypeError):
        return [url]
    found = []
    userinfo = parts.netloc.rpartition("@")[0]
    if ":" in userinfo:
        password = userinfo.partition(":")[2]
        found += [password, unquote(password)]
    for key, value in parse_qsl(parts.query, keep_blank_values=True):
        if key.lower() in SECRET_QUERY_PARAMS and value:
            found.append(value)
    return [f for f in found if f]


def redact_url(url: str) -> str:
    """A URL safe for logs and errors: password and secret query values replaced by ***."""
    try:
        parts = urlsplit(url)
    except (ValueError, TypeError):
        return "***"
    netloc = parts.netloc
    userinfo, at, host = netloc.rpartition("@")
    if at and ":" in userinfo:
        netloc = f"{userinfo.partition(':')[0]}:***@{host}"
    query = "&".join(
        f"{k}=***" if k.lower() in SECRET_QUERY_PARAMS and v else f"{k}={v}"
        for k, v in parse_qsl(parts.query, keep_blank_values=True)
    )
    if netloc == parts.netloc and query == parts.query:
        return url  # nothing secret: keep it byte for byte (sqlite:////abs/path and friends)
    out = f"{parts.scheme}://{netloc}{parts.path}"
    out += f"?{query}" if query else ""
    return out + (f"#{parts.fragment}" if parts.fragment else "")


def shown_url(url: str, limit: int = 120) -> str:
    """`redact_url`, printable and short: for messages quoting a URL the user gave."""
    text = redact_url(url)
    text = "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)
    return repr(text if len(text) <= limit else text[: limit - 1] + "…")


def parse_url(
    url: object,
    *,
    schemes: Collection[str] | None = None,
    need_host: bool = False,
    example: str = "redis://host:6379/0",
) -> ParsedUrl:
    """`url` split into its parts, or UrlError with the cause and the fix (password masked)."""
    fix = f"write it as scheme://[user:password@]host[:port]/path, e.g. {example}"
    if not isinstance(url, str):
        raise UrlError(f"{type(url).__name__} is not a URL; {fix}")
    if len(url) > MAX_URL_LENGTH:
        raise UrlError(
            f"the URL is {len(url)} characters, above the limit of {MAX_URL_LENGTH}; shorten it"
        )
    shown = shown_url(url)
    if any(c.isspace() or unicodedata.category(c)[0] == "C" for c in url):
        raise UrlError(
            f"{shown} contains spaces or control characters; percent-encode them (%20) or "
            "remove them"
        )
    if not _SCHEME.match(url):
        raise UrlError(f"{shown} is not a URL (no scheme://); {fix}")
    try:
        parts = urlsplit(url)
    except ValueError as exc:
        raise UrlError(f"{shown} is not a valid URL ({exc}); {fix}") from None
    try:
        port = parts.port
    except ValueError:
        raw_port = parts.netloc.rpartition("@")[2].rpartition(":")[2]
        raise UrlError(
            f"{shown} has port {raw_port[:20]!r}, not a number from 1 to 65535 in ASCII "
            f"digits; {fix}"
        ) from None
    if port == 0:
        raise UrlError(f"{shown} has port 0; use a port from 1 to 65535")
    scheme = parts.scheme.lower()
    if schemes is not None and scheme not in schemes:
        raise UrlError(f"{shown} has scheme {scheme!r}; use one of: {', '.join(sorted(schemes))}")
    if need_host and not parts.hostname:
        raise UrlError(f"{shown} names no host; {fix}")
    db = _redis_db(parts, shown) if scheme in REDIS_SCHEMES else None
    return ParsedUrl(scheme, parts.hostname, port, parts.path, url, db)


def _redis_db(parts: SplitResult, shown: str) -> int:
    """The database a Redis URL selects, as redis-py reads it (`?db=N` wins over the path's
    `/N`), refused where redis-py would guess: redis-py ignores a path that is no number (so
    `/²` silently meant database 0) and reads `/٣` as database 3."""
    fix = f"write the database as /N or ?db=N with N in {ASCII_FORM}, e.g. redis://host:6379/15"
    queried = [v for k, v in parse_qsl(parts.query, keep_blank_values=True) if k == "db"]
    if queried:
        db = ascii_whole(queried[-1])
        if db is None:
            raise UrlError(f"{shown} has database {queried[-1][:20]!r}, not a number; {fix}")
        return db
    if parts.scheme.lower() == "unix":
        return 0  # a socket's path is the socket
    raw = parts.path[1:] if parts.path.startswith("/") else parts.path
    if raw == "":
        return 0
    db = ascii_whole(raw)
    if db is None:
        raise UrlError(f"{shown} has database {raw[:20]!r}, not a number; {fix}")
    return db
