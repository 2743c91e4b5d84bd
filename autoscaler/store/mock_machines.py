"""The mock provider's machines, in the database so every process sees the same ones.

`status` holds what was decided at create or since ("created", "stopped", "dead",
"destroyed"); `boots_at` is when the last change asked of the machine completes, read against
the caller's clock: a "created" machine is booting (or starting again) until then, a "stopped"
one stopping until then. (No column of its own: the table stays as it is.)
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from autoscaler.store.models import MockMachine

CREATED = "created"
STOPPED = "stopped"
DEAD = "dead"
DESTROYED = "destroyed"


SECRET_NAME_PARTS = ("TOKEN", "KEY", "PASSWORD", "SECRET")


def masked_env(env: Mapping[str, str]) -> dict[str, str]:
    """A machine's env as the mock keeps it: a simulated machine needs no worker token, and a
    token must not sit in clear in the state store."""
    return {
        k: ("***" if any(part in k.upper() for part in SECRET_NAME_PARTS) else v)
        for k, v in env.items()
    }


def insert(
    session: Session,
    *,
    provider: str,
    label: str,
    env: Mapping[str, str],
    gpu: str,
    price_per_hour: float,
    boots_at: datetime,
    will_fail: bool,
    now: datetime,
) -> tuple[MockRecord, bool]:
    """Create the machine for `label`, or return the one already there: (machine, created)."""
    existing = by_label(session, label)
    if existing is not None:
        return existing, False
    row = MockMachine(
        provider=provider,
        label=label,
        env=masked_env(env),
        gpu=gpu,
        price_per_hour=price_per_hour,
        status=CREATED,
        boots_at=boots_at,
        will_fail=will_fail,
        created_at=now,
    )
    try:
        with session.begin_nested():
            session.add(row)
    except IntegrityError:  # the same label inserted concurrently: one machine per launch
        again = by_label(session, label)
        assert again is not None
        return again, False
    return _record(row), True


def get(session: Session, provider: str, machine_id: int) -> MockRecord | None:
    row = session.get(MockMachine, machine_id)
    return _record(row) if row is not None and row.provider == provider else None


def by_label(session: Session, label: str) -> MockRecord | None:
    row = session.scalar(select(MockMachine).where(MockMachine.label == label))
    return _record(row) if row is not None else None


def list_live(session: Session, provider: str) -> list[MockRecord]:
    """Every machine of `provider` not destroyed yet (whatever its label), by id."""
    rows = session.scalars(
        select(MockMachine)
        .where(MockMachine.provider == provider, MockMachine.status != DESTROYED)
        .order_by(MockMachine.id)
    )
    return [_record(r) for r in rows]


def mark_destroyed(session: Session, provider: str, machine_id: int, now: datetime) -> bool:
    """Destroy; False if it was already destroyed or never existed."""
    result = session.execute(
        update(MockMachine)
        .where(
            MockMachine.id == machine_id,
            MockMachine.provider == provider,
            MockMachine.status != DESTROYED,
        )
        .values(status=DESTROYED, destroyed_at=now)
    )
    return bool(getattr(result, "rowcount", 0))


def mark_dead(session: Session, provider: str, machine_id: int) -> bool:
    """Simulate a machine dying, stopped ones too (for tests and demos of the reconciler)."""
    result = session.execute(
        update(MockMachine)
        .where(
            MockMachine.id == machine_id,
            MockMachine.provider == provider,
            MockMachine.status.in_((CREATED, STOPPED)),
        )
        .values(status=DEAD)
    )
    return bool(getattr(result, "rowcount", 0))


def mark_stopped(session: Session, provider: str, machine_id: int, until: datetime) -> bool:
    """Stop a created (booting or running) machine: stopping until `until`, then stopped.
    Conditional, so a second stop keeps the first one's time. False if it was not created."""
    result = session.execute(
        update(MockMachine)
        .where(
            MockMachine.id == machine_id,
            MockMachine.provider == provider,
            MockMachine.status == CREATED,
        )
        .values(status=STOPPED, boots_at=until)
    )
    return bool(getattr(result, "rowcount", 0))


def mark_started(session: Session, provider: str, machine_id: int, until: datetime) -> bool:
    """Start a stopped machine again: starting until `until`, then running (a boot failure
    it was to have is forgotten: a resume's failures are the provider's `resume_failure_rate`).
    False if it was not stopped (already started, dead or destroyed)."""
    result = session.execute(
        update(MockMachine)
        .where(
            MockMachine.id == machine_id,
            MockMachine.provider == provider,
            MockMachine.status == STOPPED,
        )
        .values(status=CREATED, boots_at=until, will_fail=False)
    )
    return bool(getattr(result, "rowcount", 0))


@dataclass(frozen=True)
class MockRecord:
    """One mock machine as plain data (what `providers.mock` sees)."""

    id: int
    provider: str
    label: str
    gpu: str
    price_per_hour: float
    status: str
    boots_at: datetime
    will_fail: bool

    @property
    def destroyed(self) -> bool:
        return self.status == DESTROYED

    @property
    def dead(self) -> bool:
        return self.status == DEAD

    @property
    def stopped(self) -> bool:
        """Stopped or stopping (`boots_at` says which)."""
        return self.status == STOPPED


def _record(row: MockMachine) -> MockRecord:
    return MockRecord(
        row.id,
        row.provider,
        row.label,
        row.gpu,
        row.price_per_hour,
        row.status,
        row.boots_at,
        row.will_fail,
    )


class StoredMockMachines:
    """`providers.mock.MockMachines` in the state store: every process sees the same ones."""

    def __init__(self, factory: sessionmaker[Session]) -> None:
        self._factory = factory

    def by_label(self, label: str) -> MockRecord | None:
        with self._factory() as session, session.begin():
            return by_label(session, label)

    def insert(
        self,
        *,
        provider: str,
        label: str,
        env: Mapping[str, str],
        gpu: str,
        price_per_hour: float,
        boots_at: datetime,
        will_fail: bool,
        now: datetime,
    ) -> MockRecord:
        with self._factory() as session, session.begin():
            record, _ = insert(
                session,
                provider=provider,
                label=label,
                env=env,
                gpu=gpu,
                price_per_hour=price_per_hour,
                boots_at=boots_at,
                will_fail=will_fail,
                now=now,
            )
            return record

    def get(self, provider: str, machine_id: int) -> MockRecord | None:
        with self._factory() as session, session.begin():
            return get(session, provider, machine_id)

    def live(self, provider: str) -> list[MockRecord]:
        with self._factory() as session, session.begin():
            return list_live(session, provider)

    def destroy(self, provider: str, machine_id: int, now: datetime) -> bool:
        with self._factory() as session, session.begin():
            return mark_destroyed(session, provider, machine_id, now)

    def kill(self, provider: str, machine_id: int) -> bool:
        with self._factory() as session, session.begin():
            return mark_dead(session, provider, machine_id)

    def stop(self, provider: str, machine_id: int, until: datetime) -> bool:
        with self._factory() as session, session.begin():
            return mark_stopped(session, provider, machine_id, until)

    def start(self, provider: str, machine_id: int, until: datetime) -> bool:
        with self._factory() as session, session.begin():
            return mark_started(session, provider, machine_id, until)
