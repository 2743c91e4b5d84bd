"""What every command shares: the settings, the checked state store, the clock, refusals and
the --since/--until times. One place, so a command group never borrows another's helpers."""

from __future__ import annotations

import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import NoReturn

import click
from sqlalchemy import Engine
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError, SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

from autoscaler.config.durations import parse_duration
from autoscaler.settings import Settings, redact_url, url_secrets
from autoscaler.store import migrate
from autoscaler.store.db import make_engine, session_factory


def settings() -> Settings:
    """Settings from the environment. Creates nothing: only `db upgrade` creates the store
    (and, for the embedded defaults, the folder its SQLite files live in)."""
    return Settings.from_env()


def fail(message: str) -> NoReturn:
    """Refuse: the message (what and how to fix it) on stderr, exit code 2."""
    click.echo(message, err=True)
    sys.exit(2)


def now() -> datetime:
    """The commands' clock. Callers read it as `common.now()` so that tests can set it."""
    return datetime.now(UTC)


class StoreUnavailable(Exception):
    """The state store cannot be used: not set up, behind the migrations, or unreachable.
    The message names the store (redacted) and what to run."""


def driver_cause(exc: SQLAlchemyError, url: str) -> str:
    """The driver's first line (e.g. 'Connection refused'), with the URL's secrets scrubbed."""
    lines = str(getattr(exc, "orig", None) or exc).strip().splitlines()
    text = lines[0] if lines else type(exc).__name__
    for secret in url_secrets(url):
        text = text.replace(secret, "***")
    return text


def store(settings: Settings) -> Engine:
    """The state store, once it exists at the migrations' head; StoreUnavailable otherwise.

    Creates nothing: a SQLite file must exist already (connecting would create it), and only
    reads are made (Alembic's version, never a table). Only `db upgrade` creates the store.
    """
    url = settings.database_url
    shown = redact_url(url)
    not_set_up = f"the state store {shown} is not set up: run `autoscaler db upgrade` first"
    try:
        parsed = make_url(url)
    except (ArgumentError, ValueError):  # ValueError: a port that is no number
        raise StoreUnavailable(
            f"AUTOSCALER_DATABASE_URL ({shown}) is not a database URL; use e.g. "
            "postgresql://user:password@host/autoscaler, or unset it for the embedded SQLite file"
        ) from None
    sqlite = parsed.get_backend_name() == "sqlite"
    if sqlite and not (parsed.database and Path(parsed.database).is_file()):
        raise StoreUnavailable(not_set_up)
    try:
        engine = make_engine(url)
    except (ArgumentError, ImportError, ValueError):  # e.g. amqp://: no such database driver
        raise StoreUnavailable(
            f"AUTOSCALER_DATABASE_URL ({shown}) names no database SQLAlchemy can open; use "
            "postgresql://user:password@host/autoscaler, or unset it for the embedded SQLite file"
        ) from None
    try:
        current, head = migrate.revisions(engine)
    except SQLAlchemyError as exc:
        engine.dispose()
        raise StoreUnavailable(
            f"the state store {shown} cannot be {'read' if sqlite else 'reached'} "
            f"({driver_cause(exc, url)}); check AUTOSCALER_DATABASE_URL"
            + ("" if sqlite else " and that the database server is running")
        ) from None
    if current != head:
        engine.dispose()
        if current is None:
            raise StoreUnavailable(not_set_up)
        raise StoreUnavailable(
            f"the state store {shown} is at revision {current}, and this version needs {head}: "
            "run `autoscaler db upgrade`"
        )
    return engine


def sessions(settings: Settings) -> sessionmaker[Session]:
    """Sessions on the state store; exits 2 with the fix if it is not set up or reachable.
    Every command but `db upgrade` and `validate` opens the store through here."""
    try:
        return session_factory(store(settings))
    except StoreUnavailable as exc:
        fail(str(exc))


def open_store() -> tuple[Settings, sessionmaker[Session]]:
    """The settings and sessions on the checked store, for a command that needs both."""
    current = settings()
    return current, sessions(current)


def when(value: str | None, option: str, now: datetime) -> datetime | None:
    """--since/--until: a duration ago ("2h", "90") or an ISO time (UTC unless it says)."""
    if value is None:
        return None
    try:
        return now - timedelta(seconds=parse_duration(value))
    except (ValueError, TypeError):
        pass
    try:
        at = datetime.fromisoformat(value.strip())
    except ValueError:
        raise click.BadParameter(
            f"{value[:40]!r} is neither a duration (e.g. 30m, 2h, 1d) nor a time "
            "(e.g. 2026-11-30T08:00, UTC unless a zone is given)",
            param_hint=option,
        ) from None
    return at if at.tzinfo else at.replace(tzinfo=UTC)
