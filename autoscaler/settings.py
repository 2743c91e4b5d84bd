"""Process settings from the environment; embedded SQLite defaults when nothing is set.

The YAML config says *what* to scale; these settings say *where* the control plane keeps its
state and talks to itself. Nothing here is a secret except URLs that may carry passwords,
which is why callers log `redact_url(...)` and never the raw value.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from autoscaler.digits import ascii_whole
from autoscaler.urls import SECRET_QUERY_PARAMS, redact_url, url_secrets

CONTROL_QUEUE = "autoscaler"
"""The control plane's own Celery queue (watched application queues are only ever read);
AUTOSCALER_CONTROL_QUEUE changes it (two control planes sharing one broker database)."""

LIFECYCLE_SUFFIX = ".lifecycle"
"""The lifecycle steps' queue is the control queue's name plus this: `autoscaler.lifecycle`.

Launch, drain, terminate, stop, resume and reconcile talk to providers and to machines (remote
control), which a hostile machine or a slow provider can stretch; tick, fast path and scale talk
to neither. On queues of their own they run on workers of their own (`-Q autoscaler` /
`-Q autoscaler.lifecycle`), so nothing a machine does can hold the evaluation up. A worker
given no `-Q` takes both."""

LIFECYCLE_TASKS = (
    "autoscaler.launch",
    "autoscaler.drain",
    "autoscaler.terminate",
    "autoscaler.stop",
    "autoscaler.resume",
    "autoscaler.handback",
    "autoscaler.reconcile",
)

CONTROL_KEYPREFIX = "autoscaler-control:"
"""Prefix of every Redis key of the control plane's own broker (see celeryconfig.py);
AUTOSCALER_CONTROL_KEYPREFIX changes it."""

__all__ = [
    "CONTROL_KEYPREFIX",
    "LIFECYCLE_SUFFIX",
    "LIFECYCLE_TASKS",
    "SECRET_QUERY_PARAMS",
    "Settings",
    "redact_url",
    "url_secrets",
]


@dataclass(frozen=True)
class Settings:
    home: Path
    database_url: str
    broker_url: str
    result_backend: str
    config_path: Path | None
    vault_key: str | None
    vault_key_file: Path | None
    api_url: str = "http://127.0.0.1:8480"
    """The server API as a rented machine reaches it (AUTOSCALER_API_URL)."""
    api_bind: str = "127.0.0.1:8480"
    api_url_set: bool = False
    """AUTOSCALER_API_URL is set: machines can reach the API, so launches make their broker
    users (a machine learns its own only from the API)."""
    """Where `autoscaler serve` listens (AUTOSCALER_API_BIND, host:port)."""
    control_queue: str = CONTROL_QUEUE
    """The control plane's own Celery queue (AUTOSCALER_CONTROL_QUEUE)."""
    control_keyprefix: str = CONTROL_KEYPREFIX
    """The prefix of the control plane's keys on a Redis broker (AUTOSCALER_CONTROL_KEYPREFIX)."""
    api_max_body: int | None = 1024 * 1024
    """The largest request body the API reads (AUTOSCALER_API_MAX_BODY, bytes); None when the
    variable is not a number (`autoscaler serve` refuses to start)."""
    api_body_timeout: int | None = 10
    """Seconds the API waits for a request's whole body after its headers
    (AUTOSCALER_API_BODY_TIMEOUT); None when not a number (`autoscaler serve` refuses)."""
    metrics_token: str | None = None
    """A bearer token /metrics asks for (AUTOSCALER_METRICS_TOKEN); open without one."""

    @property
    def lifecycle_queue(self) -> str:
        """The lifecycle steps' own Celery queue (see LIFECYCLE_SUFFIX)."""
        return self.control_queue + LIFECYCLE_SUFFIX

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> Settings:
        e = os.environ if env is None else env
        home = Path(e.get("AUTOSCALER_HOME", ".autoscaler")).absolute()
        config = e.get("AUTOSCALER_CONFIG")
        key_file = e.get("AUTOSCALER_VAULT_KEY_FILE")
        return cls(
            home=home,
            database_url=e.get("AUTOSCALER_DATABASE_URL", f"sqlite:///{home / 'state.db'}"),
            broker_url=e.get("AUTOSCALER_BROKER_URL", f"sqla+sqlite:///{home / 'broker.db'}"),
            result_backend=e.get(
                "AUTOSCALER_RESULT_BACKEND", f"db+sqlite:///{home / 'results.db'}"
            ),
            config_path=Path(config) if config else None,
            vault_key=e.get("AUTOSCALER_VAULT_KEY") or None,
            vault_key_file=Path(key_file) if key_file else None,
            api_url=e.get("AUTOSCALER_API_URL", "").strip()
            or f"http://{e.get('AUTOSCALER_API_BIND', '127.0.0.1:8480').strip()}",
            api_bind=e.get("AUTOSCALER_API_BIND", "127.0.0.1:8480").strip(),
            api_url_set=bool(e.get("AUTOSCALER_API_URL", "").strip()),
            control_queue=e.get("AUTOSCALER_CONTROL_QUEUE", "").strip() or CONTROL_QUEUE,
            control_keyprefix=e.get("AUTOSCALER_CONTROL_KEYPREFIX", "").strip()
            or CONTROL_KEYPREFIX,
            api_max_body=_positive(e.get("AUTOSCALER_API_MAX_BODY", ""), 1024 * 1024),
            api_body_timeout=_positive(e.get("AUTOSCALER_API_BODY_TIMEOUT", ""), 10),
            metrics_token=e.get("AUTOSCALER_METRICS_TOKEN", "").strip() or None,
        )

    def ensure_home(self) -> None:
        """The embedded SQLite files live under home; create it before first use."""
        self.home.mkdir(parents=True, exist_ok=True)


def _positive(raw: str, default: int) -> int | None:
    """A positive whole number from the environment, `default` when unset, None when not one."""
    if not raw.strip():
        return default
    n = ascii_whole(raw.strip())
    return n if n else None
