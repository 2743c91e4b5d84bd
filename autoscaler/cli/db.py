"""`autoscaler db upgrade`: the one command that creates the state store (and the embedded
broker's tables), so it alone opens the store without the `common.sessions` check."""

from __future__ import annotations

import click
from alembic.util import CommandError as AlembicCommandError
from sqlalchemy.exc import SQLAlchemyError

from autoscaler.cli.common import driver_cause, fail, settings
from autoscaler.settings import redact_url
from autoscaler.store import migrate


@click.group()
def db() -> None:
    """The state store (PostgreSQL, or SQLite by default)."""


def _upgrade_cause(exc: Exception, url: str) -> str:
    if isinstance(exc, SQLAlchemyError):
        return driver_cause(exc, url)
    if isinstance(exc, AlembicCommandError):  # e.g. an unknown --revision
        return " ".join(str(exc).split())[:200]
    return type(exc).__name__  # alembic's own errors may quote the URL: the type only


@db.command("upgrade")
@click.option("--revision", default="head", show_default=True)
def db_upgrade(revision: str) -> None:
    """Apply migrations up to REVISION (idempotent)."""
    if not revision or len(revision) > 100 or not revision.isprintable() or " " in revision:
        fail(f"--revision {revision[:40]!r} is not a revision; give 'head' (the default) or an id")
    current = settings()
    try:
        migrate.upgrade(current.database_url, revision)
    except (SQLAlchemyError, AlembicCommandError, ValueError, ImportError, OSError) as exc:
        fail(
            f"the state store {redact_url(current.database_url)} cannot be upgraded "
            f"({_upgrade_cause(exc, current.database_url)}); "
            "check AUTOSCALER_DATABASE_URL (and --revision) and that the database server runs"
        )
    click.echo(f"database {redact_url(current.database_url)} is at {revision}")
    try:
        prepared = migrate.prepare_embedded_broker(
            current.broker_url, (current.control_queue, current.lifecycle_queue)
        )
    except (SQLAlchemyError, ValueError, ImportError, OSError) as exc:
        fail(
            f"the embedded broker {redact_url(current.broker_url)} cannot be prepared "
            f"({type(exc).__name__}); check AUTOSCALER_BROKER_URL"
        )
    if prepared:
        click.echo(f"embedded broker {redact_url(current.broker_url)} is ready")
