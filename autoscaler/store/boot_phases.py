"""The phases of each machine's boots, as its agent reported them: where a boot's time went.

The API writes them (`record`) from a machine's own authenticated report, into that machine's
rows only; `autoscaler instances LAUNCH_ID` and the admin views read them (`machines`). Each
phase is kept once per boot (the first report wins: a retried or replayed report changes
nothing), with the agent's time clamped into [the boot's start, the store's clock] next to the
store's own receive time. The provider, GPU, host and queue are copied from the instance row.

Nothing decides on these rows: boot statistics and the slow-host rule read the instance rows'
control-plane times (`store.boots`, `control.machines.mark_ready`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, NamedTuple

from sqlalchemy import delete, select
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.orm import Session

from autoscaler.policy.boots import BOOT_PHASES
from autoscaler.store.instances import InstanceDetails
from autoscaler.store.models import BootPhase, Instance

KEEP = timedelta(days=30)
"""Phases are kept a month (a few rows per boot)."""

EXPIRE_BATCH = 500
"""Machines whose expired phases one write deletes at most (a handful of rows each)."""

MATCHES = 20
"""Machines a launch id prefix may match before the caller is asked for a longer one."""


def boot_start(row: InstanceDetails) -> datetime:
    """When the row's current boot began: its resume's start for a resumed machine, else the
    decision that asked for it (`created_at`)."""
    if row.resumes and row.resuming_at is not None and row.resuming_at >= row.created_at:
        return row.resuming_at
    return row.created_at


def record(
    session: Session, row: InstanceDetails, phases: Mapping[str, datetime], now: datetime
) -> list[str]:
    """Keep the phases `row`'s agent reported for its current boot (`row.resumes`): each one
    not kept yet, its time clamped into [the boot's start, `now`] (the store's clock), `now` as
    its receive time. Unknown phase names raise ValueError (the API refuses them first).
    Returns the phases newly kept, in their order; one INSERT, then a bounded expiry."""
    unknown = set(phases) - set(BOOT_PHASES)
    if unknown:
        raise ValueError(f"not a boot phase: {', '.join(sorted(unknown))}")
    if not phases:
        return []
    start = min(boot_start(row), now)
    rows: list[dict[str, Any]] = [
        {
            "launch_id": row.launch_id,
            "boot": row.resumes or 0,
            "phase": name,
            "at": min(max(at, start), now),
            "received_at": now,
            "queue": row.queue,
            "provider": row.provider,
            "gpu": row.gpu,
            "host_id": row.host_id,
        }
        for name, at in phases.items()
    ]
    ins = pg_insert if session.get_bind().dialect.name == "postgresql" else sqlite_insert
    stmt = (
        ins(BootPhase)
        .on_conflict_do_nothing(index_elements=["launch_id", "boot", "phase"])
        .returning(BootPhase.phase)
    )
    kept = set(session.scalars(stmt, rows))
    if kept:  # a few times per boot: forget the phases of machines booted over KEEP ago
        cutoff = now - KEEP
        old = (
            select(BootPhase.launch_id)
            .where(BootPhase.received_at < cutoff)
            .group_by(BootPhase.launch_id)
            .limit(EXPIRE_BATCH)
        )
        gone = list(session.scalars(old))
        if gone:
            session.execute(
                delete(BootPhase).where(
                    BootPhase.received_at < cutoff, BootPhase.launch_id.in_(gone)
                )
            )
    return [p for p in BOOT_PHASES if p in kept]


@dataclass(frozen=True)
class PhaseView:
    phase: str
    at: datetime
    """The agent's time of the phase, clamped into [the boot's start, received_at]."""
    received_at: datetime
    """When the store received the report (its own clock)."""

    def as_json(self) -> dict[str, Any]:
        return {
            "phase": self.phase,
            "at": self.at.isoformat(),
            "received_at": self.received_at.isoformat(),
        }


@dataclass(frozen=True)
class BootView:
    """One boot of a machine: the cold one (0) or a resume from the warm pool (1, 2, …)."""

    boot: int
    started_at: datetime | None
    """When it began on the control plane's clock: the launch decision for the cold boot, the
    resume for the machine's latest resume; None for an earlier resume (not kept)."""
    ready_seconds: float | None
    """Control-plane seconds from the decision to ready (the cold boot of a machine that became
    ready); what boot statistics count."""
    phases: tuple[PhaseView, ...]

    @property
    def resume(self) -> bool:
        return self.boot > 0

    def as_json(self) -> dict[str, Any]:
        return {
            "boot": self.boot,
            "resume": self.resume,
            "started_at": self.started_at.isoformat() if self.started_at else None,
            "ready_seconds": None if self.ready_seconds is None else round(self.ready_seconds, 3),
            "phases": [p.as_json() for p in self.phases],
        }


@dataclass(frozen=True)
class MachineBoots:
    """A machine (its row's facts) and the phases of each of its boots."""

    launch_id: str
    queue: str
    provider: str
    gpu: str | None
    host_id: str | None
    state: str
    created_at: datetime
    ready_at: datetime | None
    resumes: int
    boots: tuple[BootView, ...]

    def as_json(self) -> dict[str, Any]:
        return {
            "launch_id": self.launch_id,
            "queue": self.queue,
            "provider": self.provider,
            "gpu": self.gpu,
            "host_id": self.host_id,
            "state": self.state,
            "created_at": self.created_at.isoformat(),
            "ready_at": self.ready_at.isoformat() if self.ready_at else None,
            "resumes": self.resumes,
            "boots": [b.as_json() for b in self.boots],
        }


def _boots(row: Instance, phases: Sequence[BootPhase]) -> tuple[BootView, ...]:
    order = {p: i for i, p in enumerate(BOOT_PHASES)}
    by_boot: dict[int, list[BootPhase]] = {}
    for p in phases:
        by_boot.setdefault(p.boot, []).append(p)
    resumes = row.resumes or 0
    cold_ready = (
        (row.ready_at - row.created_at).total_seconds()
        if row.ready_at is not None and row.ready_at >= row.created_at and resumes == 0
        else None
    )
    out = []
    for boot in sorted(set(by_boot) | {0}):
        if boot == 0:
            start: datetime | None = row.created_at
        elif boot == resumes:
            start = row.resuming_at
        else:
            start = None
        shown = sorted(by_boot.get(boot, []), key=lambda p: (p.at, order.get(p.phase, 99)))
        out.append(
            BootView(
                boot=boot,
                started_at=start,
                ready_seconds=cold_ready if boot == 0 else None,
                phases=tuple(PhaseView(p.phase, p.at, p.received_at) for p in shown),
            )
        )
    return tuple(out)


def machines(session: Session, launch_id: str) -> list[MachineBoots]:
    """The machines whose launch id is `launch_id` (exactly, else as a prefix: the tables show
    12 characters), at most MATCHES, each with its boots' phases. Two queries."""
    rows = list(session.scalars(select(Instance).where(Instance.launch_id == launch_id)))
    if not rows:
        rows = list(
            session.scalars(
                select(Instance)
                .where(Instance.launch_id.startswith(launch_id, autoescape=True))
                .order_by(Instance.id)
                .limit(MATCHES + 1)
            )
        )
    if not rows:
        return []
    phases = session.scalars(
        select(BootPhase).where(BootPhase.launch_id.in_([r.launch_id for r in rows]))
    ).all()
    out = []
    for row in rows:
        mine = [p for p in phases if p.launch_id == row.launch_id]
        out.append(
            MachineBoots(
                launch_id=row.launch_id,
                queue=row.queue,
                provider=row.provider,
                gpu=row.gpu,
                host_id=row.host_id,
                state=row.state.value,
                created_at=row.created_at,
                ready_at=row.ready_at,
                resumes=row.resumes or 0,
                boots=_boots(row, mine),
            )
        )
    return out


class PhaseRecord(NamedTuple):
    """One kept phase of one boot of a machine, with what its row said of the machine."""

    launch_id: str
    boot: int
    phase: str
    at: datetime
    received_at: datetime
    queue: str
    provider: str
    gpu: str | None
    host_id: str | None


def of_launch(session: Session, launch_id: str) -> list[PhaseRecord]:
    """Every phase kept for one launch, by boot then time, as frozen records (one query)."""
    rows = session.execute(
        select(
            BootPhase.launch_id,
            BootPhase.boot,
            BootPhase.phase,
            BootPhase.at,
            BootPhase.received_at,
            BootPhase.queue,
            BootPhase.provider,
            BootPhase.gpu,
            BootPhase.host_id,
        )
        .where(BootPhase.launch_id == launch_id)
        .order_by(BootPhase.boot, BootPhase.at, BootPhase.phase)
    )
    return [PhaseRecord(*row) for row in rows]


__all__ = [
    "KEEP",
    "BootView",
    "MachineBoots",
    "PhaseRecord",
    "PhaseView",
    "boot_start",
    "machines",
    "of_launch",
    "record",
]
