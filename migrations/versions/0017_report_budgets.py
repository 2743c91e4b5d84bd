"""report budgets: what each machine's heartbeats may still write (finished jobs, events), and
the reporter of each finished job, so that one machine's reports fill only its own share

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-05 09:40:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0017"
down_revision: str | None = "0016"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "report_budgets",
        sa.Column("reporter", sa.String(length=200), nullable=False),
        sa.Column("jobs", sa.Float(), nullable=False),
        sa.Column("events", sa.Float(), nullable=False),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("day", sa.String(length=10), nullable=False),
        sa.Column("today", sa.Integer(), nullable=False),
        sa.Column("dropped_jobs", sa.Integer(), nullable=False),
        sa.Column("dropped_events", sa.Integer(), nullable=False),
        sa.Column("told_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("reporter", name=op.f("pk_report_budgets")),
    )
    with op.batch_alter_table("report_budgets", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_report_budgets_at"), ["at"], unique=False)

    with op.batch_alter_table("job_records", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("reporter", sa.String(length=200), server_default="", nullable=False)
        )
        batch_op.drop_constraint(batch_op.f("uq_job_records_queue_task"), type_="unique")
        batch_op.create_unique_constraint(
            "uq_job_records_queue_task", ["queue", "task_id", "reporter"]
        )


def downgrade() -> None:
    # one row per job again: the first report of each job is kept
    op.execute(
        "DELETE FROM job_records WHERE id NOT IN "
        "(SELECT MIN(id) FROM job_records GROUP BY queue, task_id)"
    )
    with op.batch_alter_table("job_records", schema=None) as batch_op:
        batch_op.drop_constraint("uq_job_records_queue_task", type_="unique")
        batch_op.create_unique_constraint(
            batch_op.f("uq_job_records_queue_task"), ["queue", "task_id"]
        )
        batch_op.drop_column("reporter")

    with op.batch_alter_table("report_budgets", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_report_budgets_at"))

    op.drop_table("report_budgets")
