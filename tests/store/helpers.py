"""What only the store's tests ask of it: who holds a lease, whether the models and the
migrations agree, which tables say nothing about their growth; and a vault from given keys."""

from __future__ import annotations

from datetime import datetime

from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import Engine, select
from sqlalchemy.orm import Session

from autoscaler.settings import Settings
from autoscaler.store import retention
from autoscaler.store.models import Base, Lease
from autoscaler.vault import Vault


def holder_of(session: Session, name: str, now: datetime) -> str | None:
    """Who holds lease `name` at `now`; None when nobody does (never taken, or expired)."""
    lease = session.scalar(select(Lease).where(Lease.name == name))
    if lease is None or lease.expires_at <= now:
        return None
    return lease.holder


def differences(engine: Engine) -> list[object]:
    """What autogenerate would still emit: empty when models and migrations agree."""
    with engine.connect() as conn:
        ctx = MigrationContext.configure(conn, opts={"compare_type": True})
        return list(compare_metadata(ctx, Base.metadata))


def unaccounted() -> set[str]:
    """Tables of the schema that say nothing about their growth: in no retention rule, not
    self-pruned and not bounded (`store.retention`)."""
    accounted = (
        {r.table for r in retention.RULES} | set(retention.SELF_PRUNED) | set(retention.BOUNDED)
    )
    return set(Base.metadata.tables) - accounted


def vault_of(*keys: str) -> Vault:
    """The vault the control plane makes from AUTOSCALER_VAULT_KEY set to `keys` (the first
    encrypts, every one decrypts)."""
    return Vault.from_settings(Settings.from_env({"AUTOSCALER_VAULT_KEY": ",".join(keys)}))
