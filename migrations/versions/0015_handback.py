"""a lost machine's jobs handed back: the task ids its worker holds, its acks mode, when its
jobs are handed back; interruptible machines

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-02 14:50:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0015"
down_revision: str | None = "0014"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("instances", schema=None) as batch_op:
        batch_op.add_column(sa.Column("tasks", sa.JSON(), nullable=True))
        batch_op.add_column(sa.Column("acks_late", sa.Boolean(), nullable=True))
        batch_op.add_column(sa.Column("handback_due_at", sa.DateTime(timezone=True), nullable=True))
        batch_op.add_column(
            sa.Column("handback_done_at", sa.DateTime(timezone=True), nullable=True)
        )
        batch_op.add_column(
            sa.Column("interruptible", sa.Boolean(), nullable=False, server_default=sa.false())
        )


def downgrade() -> None:
    with op.batch_alter_table("instances", schema=None) as batch_op:
        for column in (
            "interruptible",
            "handback_done_at",
            "handback_due_at",
            "acks_late",
            "tasks",
        ):
            batch_op.drop_column(column)
