"""provider_rate_limits.cause: a provider is held either for a 429's reset (`rate_limit`) or
because it gave no answer within a lifecycle step's deadline (`unanswered`), so one silent
provider costs each step seconds once, not every step its HTTP timeouts

Revision ID: 0018
Revises: 0017
Create Date: 2026-12-05 12:10:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0018"
down_revision: str | None = "0017"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("provider_rate_limits", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("cause", sa.String(length=16), nullable=False, server_default="rate_limit")
        )


def downgrade() -> None:
    with op.batch_alter_table("provider_rate_limits", schema=None) as batch_op:
        batch_op.drop_column("cause")
