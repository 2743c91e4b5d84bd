"""worker sightings keyed by the domain that heard them

A sighting counts only for the queues of the broker, database and prefix its reply came
through. The table holds a few polls' worth of sightings, forgotten after their window: it is
made again empty (the next reconcile fills it) rather than rewritten.

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-02 01:40:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _create(with_domain: bool) -> None:
    key = ["domain", "worker"] if with_domain else ["worker"]
    op.create_table(
        "worker_sightings",
        *([sa.Column("domain", sa.String(length=300), nullable=False)] if with_domain else []),
        sa.Column("worker", sa.String(length=200), nullable=False),
        sa.Column("queues", sa.JSON(), nullable=False),
        sa.Column("running", sa.Integer(), nullable=False),
        sa.Column("seen_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint(*key, name=op.f("pk_worker_sightings")),
    )


def upgrade() -> None:
    op.drop_table("worker_sightings")
    _create(with_domain=True)


def downgrade() -> None:
    op.drop_table("worker_sightings")
    _create(with_domain=False)
