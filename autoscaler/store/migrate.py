"""Apply and check Alembic migrations from code (the `autoscaler db` commands and the tests)."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.config import Config as AlembicConfig
from alembic.migration import MigrationContext
from kombu.connection import Connection
from sqlalchemy import Engine

from autoscaler.store.models import Base

ROOT = Path(__file__).resolve().parents[2]


def alembic_config(database_url: str) -> AlembicConfig:
    cfg = AlembicConfig(str(ROOT / "alembic.ini"))
    cfg.set_main_option("script_location", str(ROOT / "migrations"))
    cfg.attributes["database_url"] = database_url
    return cfg


def upgrade(database_url: str, revision: str = "head") -> None:
    command.upgrade(alembic_config(database_url), revision)


def downgrade(database_url: str, revision: str) -> None:
    command.downgrade(alembic_config(database_url), revision)


def prepare_embedded_broker(broker_url: str) -> bool:
    """Create kombu's tables for an SQLAlchemy broker now, once, rather than racing for them.

    kombu creates them lazily in every process that connects; worker and beat starting together
    on a fresh SQLite file can collide. Returns False for other brokers (nothing to prepare).
    """
    if not broker_url.startswith("sqla+"):
        return False
    with Connection(  # type: ignore[no-untyped-call]
        broker_url, transport_options={"connect_args": {"timeout": 30}}
    ) as conn:
        conn.default_channel.session.close()
    return True


def differences(engine: Engine) -> list[object]:
    """What autogenerate would still emit: empty when models and migrations agree."""
    with engine.connect() as conn:
        ctx = MigrationContext.configure(conn, opts={"compare_type": True})
        return list(compare_metadata(ctx, Base.metadata))
