"""Apply and check Alembic migrations from code (the `autoscaler db` commands and the tests)."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config as AlembicConfig
from alembic.migration import MigrationContext
from alembic.script import ScriptDirectory
from kombu.connection import Connection
from kombu.entity import Queue
from sqlalchemy import Engine
from sqlalchemy.engine import make_url

from autoscaler.settings import CONTROL_QUEUE, LIFECYCLE_SUFFIX

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


def head_revision() -> str | None:
    """The newest migration's revision id."""
    return ScriptDirectory.from_config(alembic_config("")).get_current_head()


def revisions(engine: Engine) -> tuple[str | None, str | None]:
    """(the store's revision, None if it was never migrated; the scripts' head). Read-only:
    creates no table, not even Alembic's version table."""
    head = head_revision()
    with engine.connect() as conn:
        current = MigrationContext.configure(conn).get_current_revision()
    return current, head


def prepare_embedded_broker(
    broker_url: str, queues: tuple[str, ...] = (CONTROL_QUEUE, CONTROL_QUEUE + LIFECYCLE_SUFFIX)
) -> bool:
    """Create kombu's tables for an SQLAlchemy broker now, once, rather than racing for them.

    kombu creates them lazily in every process that connects; worker and beat starting together
    on a fresh SQLite file can collide. Returns False for other brokers (nothing to prepare).
    """
    if not broker_url.startswith("sqla+"):
        return False
    target = make_url(broker_url.removeprefix("sqla+"))
    if target.get_backend_name() == "sqlite" and target.database not in (None, "", ":memory:"):
        # `db upgrade` makes the embedded home; other CLI commands create nothing
        Path(str(target.database)).parent.mkdir(parents=True, exist_ok=True)
    with Connection(  # type: ignore[no-untyped-call]
        broker_url, transport_options={"connect_args": {"timeout": 30}}
    ) as conn:
        # The control plane's own queues too: kombu creates a queue's row without a lock, so
        # beat publishing and a worker consuming a brand-new queue at once can collide.
        for name in queues:
            queue = Queue(name, routing_key=name)  # type: ignore[no-untyped-call]
            queue.bind(conn.default_channel).declare()  # type: ignore[no-untyped-call]
        conn.default_channel.session.close()
    return True
