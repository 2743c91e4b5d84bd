"""cancelling a machine before it is ready, and providers' rate limits shared by every process

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-01 22:00:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("instances", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("cancel_requested_at", sa.DateTime(timezone=True), nullable=True)
        )
    op.create_table(
        "provider_rate_limits",
        sa.Column("provider", sa.String(length=100), nullable=False),
        sa.Column("until", sa.DateTime(timezone=True), nullable=False),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column("since", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("provider", name=op.f("pk_provider_rate_limits")),
    )


def downgrade() -> None:
    op.drop_table("provider_rate_limits")
    with op.batch_alter_table("instances", schema=None) as batch_op:
        batch_op.drop_column("cancel_requested_at")
