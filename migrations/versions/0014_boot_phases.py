"""boot phases: when each phase of a machine's boot happened, as its agent reported it

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-03 09:00:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0014"
down_revision: str | None = "0013"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "boot_phases",
        sa.Column("launch_id", sa.String(length=64), nullable=False),
        sa.Column("boot", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("phase", sa.String(length=40), nullable=False),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("received_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("queue", sa.String(length=200), nullable=False),
        sa.Column("provider", sa.String(length=100), nullable=False),
        sa.Column("gpu", sa.String(length=100), nullable=True),
        sa.Column("host_id", sa.String(length=100), nullable=True),
        sa.PrimaryKeyConstraint("launch_id", "boot", "phase", name=op.f("pk_boot_phases")),
    )
    with op.batch_alter_table("boot_phases", schema=None) as batch_op:
        batch_op.create_index("ix_boot_phases_received_at", ["received_at"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("boot_phases", schema=None) as batch_op:
        batch_op.drop_index("ix_boot_phases_received_at")
    op.drop_table("boot_phases")
