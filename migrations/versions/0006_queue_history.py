"""queue history: quiet gaps per queue and the jobs workers finished

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-30 05:30:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("queue_status", schema=None) as batch_op:
        batch_op.add_column(sa.Column("history", sa.JSON(), nullable=True))
    op.create_table(
        "job_records",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("queue", sa.String(length=200), nullable=False),
        sa.Column("task_id", sa.String(length=200), nullable=False),
        sa.Column("worker", sa.String(length=200), nullable=False),
        sa.Column("arrived_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("runtime_s", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_job_records")),
        sa.UniqueConstraint("queue", "task_id", name="uq_job_records_queue_task"),
    )
    with op.batch_alter_table("job_records", schema=None) as batch_op:
        batch_op.create_index(
            "ix_job_records_queue_finished", ["queue", "finished_at", "runtime_s"], unique=False
        )
        batch_op.create_index("ix_job_records_finished", ["finished_at"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("job_records", schema=None) as batch_op:
        batch_op.drop_index("ix_job_records_finished")
        batch_op.drop_index("ix_job_records_queue_finished")
    op.drop_table("job_records")
    with op.batch_alter_table("queue_status", schema=None) as batch_op:
        batch_op.drop_column("history")
