"""indexes for retention (`store/retention.py`): tick slots by claim time and events by time,
so the sweep that forgets old rows reads only them (tick_slots was never pruned: 2.9 M rows a
day at 1,000 queues)

Revision ID: 0019
Revises: 0018
Create Date: 2026-12-05 12:50:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0019"
down_revision: str | None = "0018"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("tick_slots", schema=None) as batch_op:
        batch_op.create_index("ix_tick_slots_claimed_at", ["claimed_at"], unique=False)
    with op.batch_alter_table("scale_events", schema=None) as batch_op:
        batch_op.create_index("ix_scale_events_at", ["at"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("scale_events", schema=None) as batch_op:
        batch_op.drop_index("ix_scale_events_at")
    with op.batch_alter_table("tick_slots", schema=None) as batch_op:
        batch_op.drop_index("ix_tick_slots_claimed_at")
