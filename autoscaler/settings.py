"""Process settings from the environment; embedded SQLite defaults when nothing is set.

The YAML config says *what* to scale; these settings say *where* the control plane keeps its
state and talks to itself. Nothing here is a secret except URLs that may carry passwords,
which is why callers log `redact_url(...)` and never the raw value.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import parse_qsl, unquote, urlsplit

CONTROL_KEYPREFIX = "autoscaler-control:"
"""Prefix of every Redis key of the control plane's own broker (see celeryconfig.py)."""


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


def url_secrets(url: str) -> list[str]:
    """The secret parts of a URL: its password (raw and decoded) and secret query values.

    The userinfo is split at the *last* '@' (as urllib and redis-py do), so a password written
    with a raw '@' is found whole.
    """
    try:
        parts = urlsplit(url)
    except ValueError:
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
    except ValueError:
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


@dataclass(frozen=True)
class Settings:
    home: Path
    database_url: str
    broker_url: str
    result_backend: str
    config_path: Path | None
    vault_key: str | None
    vault_key_file: Path | None

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
        )

    def ensure_home(self) -> None:
        """The embedded SQLite files live under home; create it before first use."""
        self.home.mkdir(parents=True, exist_ok=True)
