"""instance_transitions: one row per state change of a machine's row (`store/transitions.py`),
written with the move itself, so billing knows every stop of a machine stopped and resumed more
than once (the row keeps the latest time of each state only: its earlier stops were billed at
the full price). Existing rows are backfilled from their columns, as well as they can say: each
state at the latest time it was entered, in time order, up to the first end, the row's current
state last - a first row (`src` NULL) per machine, so its history is read as whole

Revision ID: 0020
Revises: 0019
Create Date: 2026-12-05 15:30:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from alembic import op

revision: str = "0020"
down_revision: str | None = "0019"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# The lifecycle as it is at this revision (migrations do not import the models' code).
STATES = (
    "pending",
    "creating",
    "booting",
    "ready",
    "draining",
    "drained",
    "stopping",
    "stopped",
    "resuming",
    "terminating",
    "terminated",
    "failed",
    "lost",
)
FINAL = frozenset({"terminated", "failed", "lost"})
BATCH = 1000


def _state() -> sa.Enum:
    return sa.Enum(*STATES, name="instancestate", native_enum=False, length=20)


def upgrade() -> None:
    op.create_table(
        "instance_transitions",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("launch_id", sa.String(length=64), nullable=False),
        sa.Column("src", _state(), nullable=True),
        sa.Column("dst", _state(), nullable=False),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_instance_transitions")),
    )
    with op.batch_alter_table("instance_transitions", schema=None) as batch_op:
        batch_op.create_index(
            "ix_instance_transitions_launch_id_id", ["launch_id", "id"], unique=False
        )
    _backfill()


def downgrade() -> None:
    with op.batch_alter_table("instance_transitions", schema=None) as batch_op:
        batch_op.drop_index("ix_instance_transitions_launch_id_id")
    op.drop_table("instance_transitions")


def _moves(row: Any) -> list[tuple[str, datetime]]:
    """The moves of one instance row as its columns know them (`transitions.from_columns` as it
    is at this revision)."""
    order = {s: i for i, s in enumerate(STATES)}
    entries = sorted(
        (at, order[s], s) for s in STATES if (at := getattr(row, f"{s}_at")) is not None
    )
    moves: list[tuple[str, datetime]] = []
    for at, _, state in entries:
        moves.append((state, at))
        if state in FINAL:
            break
    current = str(row.state)
    if moves and moves[-1][0] == current:
        return moves
    if current in FINAL:
        end = row.updated_at or (moves[-1][1] if moves else None)
        return [*moves, (current, end)] if end is not None else moves
    return [*moves, (current, moves[-1][1])] if moves else moves


def _backfill() -> None:
    bind = op.get_bind()
    instances = sa.table(
        "instances",
        sa.column("id", sa.Integer()),
        sa.column("launch_id", sa.String()),
        sa.column("state", sa.String()),
        sa.column("updated_at", sa.DateTime(timezone=True)),
        *(sa.column(f"{s}_at", sa.DateTime(timezone=True)) for s in STATES),
    )
    transitions = sa.table(
        "instance_transitions",
        sa.column("launch_id", sa.String()),
        sa.column("src", sa.String()),
        sa.column("dst", sa.String()),
        sa.column("at", sa.DateTime(timezone=True)),
    )
    last = 0
    while True:
        rows = bind.execute(
            sa.select(instances).where(instances.c.id > last).order_by(instances.c.id).limit(BATCH)
        ).all()
        if not rows:
            return
        last = rows[-1].id
        out: list[dict[str, Any]] = []
        for row in rows:
            src = None
            for dst, at in _moves(row):
                out.append({"launch_id": row.launch_id, "src": src, "dst": dst, "at": at})
                src = dst
        if out:
            bind.execute(transitions.insert(), out)
