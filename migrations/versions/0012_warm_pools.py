"""warm pools: stopped machines, their spec and storage price

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-02 07:30:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0012"
down_revision: str | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_TIMES = ("stopping_at", "stopped_at", "resuming_at")


def upgrade() -> None:
    with op.batch_alter_table("instances", schema=None) as batch_op:
        batch_op.add_column(sa.Column("spec_key", sa.String(length=64), nullable=True))
        batch_op.add_column(
            sa.Column("keep_warm", sa.Boolean(), nullable=False, server_default=sa.false())
        )
        batch_op.add_column(sa.Column("storage_price_per_hour", sa.Float(), nullable=True))
        for column in _TIMES:
            batch_op.add_column(sa.Column(column, sa.DateTime(timezone=True), nullable=True))
        batch_op.add_column(sa.Column("resumes", sa.Integer(), nullable=False, server_default="0"))


def downgrade() -> None:
    with op.batch_alter_table("instances", schema=None) as batch_op:
        for column in ("resumes", *_TIMES, "storage_price_per_hour", "keep_warm", "spec_key"):
            batch_op.drop_column(column)
