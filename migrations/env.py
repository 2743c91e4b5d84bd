"""Alembic environment: the URL comes from the caller or the environment, never from the ini."""

from __future__ import annotations

from typing import Any

from alembic import context

from autoscaler.settings import Settings
from autoscaler.store.db import make_engine
from autoscaler.store.models import Base, UtcDateTime

config = context.config
target_metadata = Base.metadata


def _render_item(type_: str, obj: Any, autogen_context: Any) -> str | bool:
    """Migrations must not import model code: UtcDateTime is written as a plain DateTime."""
    if type_ == "type" and isinstance(obj, UtcDateTime):
        return "sa.DateTime(timezone=True)"
    return False


def _url() -> str:
    return config.attributes.get("database_url") or Settings.from_env().database_url


def run_migrations_offline() -> None:
    context.configure(
        url=_url(),
        target_metadata=target_metadata,
        render_as_batch=True,
        literal_binds=True,
        render_item=_render_item,
    )
    with context.begin_transaction():
        context.run_migrations()


def _run_on(connection: Any) -> None:
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        render_as_batch=True,
        compare_type=True,
        render_item=_render_item,
    )
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _run_on(connection)
        return
    engine = make_engine(_url())
    with engine.connect() as conn:
        _run_on(conn)
    engine.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
