"""placement across providers: the providers a launch may rent from and tried, the cause of a
backoff

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-02 14:20:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0013"
down_revision: str | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("instances", schema=None) as batch_op:
        batch_op.add_column(sa.Column("placement", sa.JSON(), nullable=True))
    with op.batch_alter_table("rental_backoffs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("cause", sa.String(length=20), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("rental_backoffs", schema=None) as batch_op:
        batch_op.drop_column("cause")
    with op.batch_alter_table("instances", schema=None) as batch_op:
        batch_op.drop_column("placement")
