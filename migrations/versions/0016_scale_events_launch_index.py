"""an index on scale_events.launch_id: tying a tick's launches to their decision events, a
machine's history (`autoscaler instances LAUNCH_ID`) and preemptions per host looked events up by
launch id through the whole table, so the tick slowed as the event log grew

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-02 17:10:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0016"
down_revision: str | None = "0015"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("scale_events", schema=None) as batch_op:
        batch_op.create_index("ix_scale_events_launch_id", ["launch_id"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("scale_events", schema=None) as batch_op:
        batch_op.drop_index("ix_scale_events_launch_id")
