"""queue samples: the dashboard's chart of pending jobs and workers

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-30 03:05:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "queue_samples",
        sa.Column("queue", sa.String(length=200), nullable=False),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("pending", sa.Integer(), nullable=False),
        sa.Column("running", sa.Integer(), nullable=True),
        sa.Column("workers", sa.Integer(), nullable=False),
        sa.Column("booting", sa.Integer(), nullable=False),
        sa.Column("desired", sa.Integer(), nullable=True),
        sa.PrimaryKeyConstraint("queue", "at", name=op.f("pk_queue_samples")),
    )
    with op.batch_alter_table("queue_samples", schema=None) as batch_op:
        batch_op.create_index("ix_queue_samples_at", ["at"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("queue_samples", schema=None) as batch_op:
        batch_op.drop_index("ix_queue_samples_at")
    op.drop_table("queue_samples")
