"""The mock provider's machines, in the database so every process sees the same ones.

`status` holds what was decided at create or since ("created", "dead", "destroyed"); whether a
created machine is still booting is read from `boots_at` against the caller's clock.
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
) -> tuple[MockMachine, bool]:
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
    return row, True


def get(session: Session, provider: str, machine_id: int) -> MockMachine | None:
    row = session.get(MockMachine, machine_id)
    return row if row is not None and row.provider == provider else None


def by_label(session: Session, label: str) -> MockMachine | None:
    return session.scalar(select(MockMachine).where(MockMachine.label == label))


def list_live(session: Session, provider: str) -> list[MockMachine]:
    """Every machine of `provider` not destroyed yet (whatever its label), by id."""
    return list(
        session.scalars(
            select(MockMachine)
            .where(MockMachine.provider == provider, MockMachine.status != DESTROYED)
            .order_by(MockMachine.id)
        )
    )


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
    """Simulate a machine dying (for tests and demos of the reconciler)."""
    result = session.execute(
        update(MockMachine)
        .where(
            MockMachine.id == machine_id,
            MockMachine.provider == provider,
            MockMachine.status == CREATED,
        )
        .values(status=DEAD)
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
            row = by_label(session, label)
            return _record(row) if row is not None else None

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
            row, _ = insert(
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
            return _record(row)

    def get(self, provider: str, machine_id: int) -> MockRecord | None:
        with self._factory() as session, session.begin():
            row = get(session, provider, machine_id)
            return _record(row) if row is not None else None

    def live(self, provider: str) -> list[MockRecord]:
        with self._factory() as session, session.begin():
            return [_record(r) for r in list_live(session, provider)]

    def destroy(self, provider: str, machine_id: int, now: datetime) -> bool:
        with self._factory() as session, session.begin():
            return mark_destroyed(session, provider, machine_id, now)

    def kill(self, provider: str, machine_id: int) -> bool:
        with self._factory() as session, session.begin():
            return mark_dead(session, provider, machine_id)
