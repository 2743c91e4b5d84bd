"""One HTTP client for the provider APIs: timeouts, retries, error classes, no secret leaks.

- Every call has a connect and a read timeout.
- Idempotent calls (GET, DELETE, searches) are retried on 429, 5xx and network errors with
  exponential backoff and jitter; a `Retry-After` header is honoured when present (Vast never
  sends one, so the backoff is ours). A create is never retried here: a 5xx or a read timeout
  on a create raises `AmbiguousCreateError` (or returns the 5xx to the provider, which may know
  it as a capacity refusal), because the machine may exist.
- A 429 is waited out inside the call only while the waits add up to at most
  `RetryPolicy.rate_limit_budget` (2 s): a longer reset (RunPod's `RateLimit: …, reset=30`)
  raises `RateLimitedError` at once, carrying the reset, so no Celery worker sleeps through it;
  the control loop records it for every process (`store.rate_limits`).
- 401/403 raise `AuthError`.
- A caller may bound everything its calls take, retries and waits included (`deadline`): a
  lifecycle step gives each provider a third of the poll, so a provider that takes connections
  and never answers costs that step seconds, not its 4 × 30 s reads, and raises
  `UnansweredError` (as a last read or connect timeout does without a deadline).
- The key travels only in the Authorization header, set by an auth hook whose repr is redacted;
  messages built here never include headers, and `redact` scrubs the key from anything echoed
  back (response bodies).
"""

from __future__ import annotations

import logging
import random
import re
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Any

import requests
from requests.auth import AuthBase

from autoscaler.providers.base import (
    AmbiguousCreateError,
    AuthError,
    RateLimitedError,
    TransientError,
    UnansweredError,
)

log = logging.getLogger("autoscaler.providers.http")

REDACTED = "***"

_CALL_SECRETS: ContextVar[frozenset[str]] = ContextVar("call_secrets", default=frozenset())
_DEADLINE: ContextVar[float | None] = ContextVar("call_deadline", default=None)


@contextmanager
def deadline(seconds: float) -> Iterator[None]:
    """Every provider call made in the block (this thread or task) ends within `seconds` of
    its start, retries and their waits included; a nested deadline never extends an outer one."""
    end = time.monotonic() + max(0.0, seconds)
    outer = _DEADLINE.get()
    token = _DEADLINE.set(end if outer is None else min(outer, end))
    try:
        yield
    finally:
        _DEADLINE.reset(token)


_PER_CALL: ContextVar[float | None] = ContextVar("per_call_deadline", default=None)


@contextmanager
def each_call_within(seconds: float) -> Iterator[None]:
    """Every provider call made in the block ends within `seconds` of its own start, retries
    included (within any `deadline` around it): a step of several calls to a slow but
    answering provider still completes, a silent one costs the step `seconds` once."""
    token = _PER_CALL.set(max(0.0, seconds))
    try:
        yield
    finally:
        _PER_CALL.reset(token)


def _left() -> float | None:
    """Seconds left before the block's deadline, or None without one."""
    end = _DEADLINE.get()
    return None if end is None else end - time.monotonic()


@dataclass(frozen=True)
class RetryPolicy:
    """How idempotent calls are retried: `attempts` in all, delay base*2^n capped, jittered."""

    attempts: int = 4
    base: float = 0.5
    cap: float = 10.0
    rate_limit_budget: float = 2.0
    """Seconds one call may sleep in all on 429s; a reset beyond what is left raises at once."""

    def delay(self, attempt: int, rng: random.Random) -> float:
        """Backoff before retry number `attempt` (0-based): uniform in [d/2, d]."""
        d = min(self.cap, self.base * (2**attempt))
        return float(d / 2 + rng.random() * d / 2)


class _Bearer(AuthBase):
    """Sets `Authorization: Bearer <key>`; prints as redacted."""

    def __init__(self, key: str) -> None:
        self._key = key

    def __call__(self, r: requests.PreparedRequest) -> requests.PreparedRequest:
        r.headers["Authorization"] = f"Bearer {self._key}"
        return r

    def __repr__(self) -> str:
        return "<Bearer ***>"


_RATELIMIT_RESET = re.compile(r"(?:^|[;,\s])(?:reset|t)\s*=\s*(\d+(?:\.\d+)?)", re.IGNORECASE)


def reset_hint(resp: requests.Response) -> float | None:
    """Seconds until the provider takes requests again, from `Retry-After` (seconds or an HTTP
    date) or the IETF `RateLimit` header RunPod sends (`reset=N`, or `t=N` in later drafts)."""
    value = resp.headers.get("Retry-After")
    if value is not None:
        try:
            return max(float(value), 0.0)
        except ValueError:
            try:
                when = parsedate_to_datetime(value)
            except (TypeError, ValueError):
                when = None
            if when is not None:
                if when.tzinfo is None:
                    when = when.replace(tzinfo=UTC)
                return max((when - datetime.now(UTC)).total_seconds(), 0.0)
    header = resp.headers.get("RateLimit")
    if header:
        match = _RATELIMIT_RESET.search(header)
        if match:
            return float(match.group(1))
    return None


class HttpClient:
    """A `requests` session bound to one provider's base URL and key."""

    def __init__(
        self,
        provider: str,
        base_url: str,
        api_key: str,
        *,
        timeout: tuple[float, float] = (5.0, 30.0),
        retry: RetryPolicy | None = None,
        sleep: Callable[[float], None] = time.sleep,
        rng: random.Random | None = None,
        label: str = "",
    ) -> None:
        if not api_key:
            raise AuthError(
                f"{provider}: no API key given; store the provider's key in the vault "
                "or set its api_key_env",
                provider=provider,
            )
        self.provider = provider
        self.display = label or provider
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        self.retry = retry or RetryPolicy()
        self._sleep = sleep
        self._rng = rng or random.Random()
        self._secret = api_key
        self._session = requests.Session()
        self._session.auth = _Bearer(api_key)
        self._session.headers["User-Agent"] = "gpu-queue-autoscaler"
        self._session.trust_env = False  # no proxies or .netrc credentials from the environment

    def __repr__(self) -> str:
        return f"HttpClient(provider={self.provider!r}, base_url={self.base_url!r})"

    def close(self) -> None:
        self._session.close()

    def redact(self, text: str) -> str:
        """`text` without the key, nor the secrets of the call in progress (`redacting`)."""
        for secret in sorted({self._secret, *_CALL_SECRETS.get()}, key=len, reverse=True):
            if secret:
                text = text.replace(secret, REDACTED)
        return text

    @contextmanager
    def redacting(self, secrets: Iterable[str]) -> Iterator[None]:
        """Scrub `secrets` too from what this client says while the block runs (per thread
        and task: a context variable), e.g. a launch's worker token that an API's error text
        may quote from the request body."""
        token = _CALL_SECRETS.set(_CALL_SECRETS.get() | {s for s in secrets if len(s) >= 8})
        try:
            yield
        finally:
            _CALL_SECRETS.reset(token)

    def excerpt(self, resp: requests.Response, limit: int = 300) -> str:
        """A short, redacted piece of a response body for error messages.

        Redacted first, then folded and cut: cutting first would leave the prefix of a key
        that straddles the cut in the message."""
        try:
            text = resp.text
        except Exception:  # undecodable body
            return "<unreadable body>"
        text = " ".join(self.redact(text).split())
        return text[:limit]

    def request(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, Any] | None = None,
        json: Any = None,
        idempotent: bool = True,
        timeout: tuple[float, float] | None = None,
    ) -> requests.Response:
        """Send one call, retrying idempotent ones. Returns any response that is not 401/403/429
        and, for idempotent calls, not 5xx; raises the classified error otherwise."""
        limit = _PER_CALL.get()
        if limit is None:
            return self._request(method, path, params, json, idempotent, timeout)
        with deadline(limit):
            return self._request(method, path, params, json, idempotent, timeout)

    def _request(
        self,
        method: str,
        path: str,
        params: Mapping[str, Any] | None,
        json: Any,
        idempotent: bool,
        timeout: tuple[float, float] | None,
    ) -> requests.Response:
        url = self.base_url + path
        attempts = self.retry.attempts if idempotent else 1
        what = f"{self.display}: {method} {path}"
        rate_limited_for = 0.0  # seconds this call slept on 429s so far
        for attempt in range(attempts):
            left = _left()
            if left is not None and left <= 0:
                raise UnansweredError(
                    f"{what}: no answer within its deadline", provider=self.provider
                )
            last_try = attempt == attempts - 1
            t0 = time.monotonic()
            connect, read = timeout or self.timeout
            if left is not None:  # the deadline bounds each attempt too
                connect, read = min(connect, left), min(read, left)
            try:
                resp = self._session.request(
                    method, url, params=params, json=json, timeout=(connect, read)
                )
            except (requests.ConnectTimeout, requests.exceptions.ProxyError) as exc:
                # Never reached the server: nothing can have happened.
                log.info(
                    "%s: cannot connect (%s), attempt %d", what, type(exc).__name__, attempt + 1
                )
                if last_try or not self._pause(attempt):
                    raise UnansweredError(
                        f"{what}: cannot connect ({type(exc).__name__})", provider=self.provider
                    ) from None
                continue
            except requests.ConnectionError as exc:
                refused = _connection_refused(exc)
                log.info(
                    "%s: connection error (%s), attempt %d", what, type(exc).__name__, attempt + 1
                )
                if not idempotent and not refused:
                    raise AmbiguousCreateError(
                        f"{what}: connection lost after sending ({type(exc).__name__}); "
                        "the machine may exist",
                        provider=self.provider,
                    ) from None
                if last_try or not self._pause(attempt):
                    raise TransientError(
                        f"{what}: connection failed ({type(exc).__name__})", provider=self.provider
                    ) from None
                continue
            except requests.Timeout as exc:  # ReadTimeout: the request was sent
                log.info("%s: timed out (%s), attempt %d", what, type(exc).__name__, attempt + 1)
                if not idempotent:
                    raise AmbiguousCreateError(
                        f"{what}: timed out after sending; the machine may exist",
                        provider=self.provider,
                    ) from None
                if last_try or not self._pause(attempt):
                    raise UnansweredError(f"{what}: timed out", provider=self.provider) from None
                continue
            except requests.RequestException as exc:
                # e.g. a broken or undecodable answer: the request was sent, so a create may
                # have happened and only a lookup by label can tell.
                if not idempotent:
                    raise AmbiguousCreateError(
                        f"{what}: the answer was lost ({type(exc).__name__}); the machine may "
                        "exist",
                        provider=self.provider,
                    ) from None
                raise TransientError(
                    f"{what}: request failed ({type(exc).__name__})", provider=self.provider
                ) from None

            status = resp.status_code
            log.debug(
                "%s -> %d in %.3fs (attempt %d)", what, status, time.monotonic() - t0, attempt + 1
            )
            if status in (401, 403):
                verb = "refused the API key" if status == 401 else "denied this API key access"
                raise AuthError(
                    f"{self.display} {verb} (HTTP {status} on {method} {path}); check the key "
                    "stored for this provider and its permissions",
                    provider=self.provider,
                )
            if status == 429:
                hint = reset_hint(resp)
                wait = hint if hint is not None else self.retry.delay(attempt, self._rng)
                left = _left()
                out_of_time = left is not None and wait >= left
                if (
                    last_try
                    or out_of_time
                    or rate_limited_for + wait > self.retry.rate_limit_budget
                ):
                    reset = f"; the provider resets in {hint:.0f}s" if hint is not None else ""
                    raise RateLimitedError(
                        f"{what}: rate limited (HTTP 429){reset}: {self.excerpt(resp, 120)}",
                        provider=self.provider,
                        retry_after=hint,
                    )
                log.info("%s: rate limited, waiting %.2fs (attempt %d)", what, wait, attempt + 1)
                self._sleep(wait)
                rate_limited_for += wait
                continue
            if status >= 500 and idempotent:
                if last_try or not self._pause(attempt):
                    raise TransientError(
                        f"{what}: HTTP {status}: {self.excerpt(resp, 160)}", provider=self.provider
                    )
                log.info("%s: HTTP %d, retried (attempt %d)", what, status, attempt + 1)
                continue
            return resp
        raise AssertionError("unreachable")  # pragma: no cover

    def _pause(self, attempt: int) -> bool:
        """Wait before retry `attempt + 1`; False (no wait) when it would pass the deadline."""
        delay = self.retry.delay(attempt, self._rng)
        left = _left()
        if left is not None and delay >= left:
            return False
        self._sleep(delay)
        return True


def _connection_refused(exc: requests.ConnectionError) -> bool:
    """True when the connection was never established (so nothing was sent)."""
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        name = type(cur).__name__
        if name in ("NewConnectionError", "ConnectionRefusedError", "NameResolutionError"):
            return True
        reason = getattr(cur, "reason", None)
        if isinstance(reason, BaseException) and id(reason) not in seen:
            cur = reason
            continue
        nxt = cur.__cause__ or cur.__context__
        if nxt is None and cur.args and isinstance(cur.args[0], BaseException):
            nxt = cur.args[0]
        cur = nxt
    return False


def json_body(resp: requests.Response) -> Any:
    """The JSON body, or None when the body is not JSON (e.g. a plain-text 429)."""
    try:
        return resp.json()
    except ValueError:
        return None
