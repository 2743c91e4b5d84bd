"""The mock provider: simulated machines kept in the database, nothing rented.

Users test their triggers with it. Machines boot after `boot_delay`, a share of them fails to
boot (`boot_failure_rate`: they turn DEAD instead of RUNNING), a share of creates is refused
for capacity (`capacity_error_rate`), and every machine costs `price_per_hour`. The state lives
in the `mock_machines` table (store/mock_machines.py), so beat, workers, the CLI and the API —
separate processes — all see the same machines.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

from sqlalchemy.orm import Session, sessionmaker

from autoscaler.config.models import InstanceSpec
from autoscaler.config.models import MockProvider as MockConfig
from autoscaler.providers.base import (
    CapacityError,
    LaunchSpec,
    MachineStatus,
    NotOwnedError,
    Offer,
    Provider,
    ProviderMachine,
)
from autoscaler.store import mock_machines
from autoscaler.store.db import transaction
from autoscaler.store.models import MockMachine

ID_PREFIX = "mock-"


def _row_id(provider_instance_id: str) -> int | None:
    if not provider_instance_id.startswith(ID_PREFIX):
        return None
    rest = provider_instance_id[len(ID_PREFIX) :]
    return int(rest) if rest.isdigit() else None


class MockProvider(Provider):
    kind = "mock"

    def __init__(
        self,
        name: str,
        config: MockConfig,
        installation_id: str,
        sessions: sessionmaker[Session],
        *,
        rng: random.Random | None = None,
        clock: Callable[[], datetime] | None = None,
    ) -> None:
        super().__init__(name, installation_id)
        self.config = config
        self.sessions = sessions
        self._rng = rng or random.Random()
        self._clock = clock or (lambda: datetime.now(UTC))

    def find_offers(self, spec: InstanceSpec) -> list[Offer]:
        price = round(self.config.price_per_hour * spec.gpu_count, 6)
        if price > spec.max_price_per_hour:
            return []
        return [
            Offer(
                provider=self.name,
                offer_id=f"mock:{spec.gpu}",
                gpu=spec.gpu,
                gpu_count=spec.gpu_count,
                price_per_hour=price,
                spec=spec,
                host_id="mock-host",
            )
        ]

    def create(self, offer: Offer, launch: LaunchSpec) -> ProviderMachine:
        self._check_launch(launch)
        now = self._clock()
        with transaction(self.sessions) as s:
            existing = mock_machines.by_label(s, launch.label)
            if existing is not None and existing.status != mock_machines.DESTROYED:
                return self._machine(existing, now)
            if self._rng.random() < self.config.capacity_error_rate:
                raise CapacityError(
                    f"{self.name}: simulated capacity error for {offer.gpu}", provider=self.name
                )
            row, _ = mock_machines.insert(
                s,
                provider=self.name,
                label=launch.label,
                env=launch.env,
                gpu=offer.gpu,
                price_per_hour=offer.price_per_hour,
                boots_at=now + timedelta(seconds=self.config.boot_delay),
                will_fail=self._rng.random() < self.config.boot_failure_rate,
                now=now,
            )
            return self._machine(row, now)

    def get(self, provider_instance_id: str) -> ProviderMachine | None:
        row_id = _row_id(provider_instance_id)
        if row_id is None:
            return None
        with transaction(self.sessions) as s:
            row = mock_machines.get(s, self.name, row_id)
            if row is None or row.status == mock_machines.DESTROYED or not self.owns(row.label):
                return None
            return self._machine(row, self._clock())

    def list_owned(self) -> list[ProviderMachine]:
        now = self._clock()
        with transaction(self.sessions) as s:
            return [
                self._machine(r, now)
                for r in mock_machines.list_live(s, self.name)
                if self.owns(r.label)
            ]

    def find_by_label(self, label: str) -> ProviderMachine | None:
        if not self.owns(label):
            return None
        with transaction(self.sessions) as s:
            row = mock_machines.by_label(s, label)
            if row is None or row.provider != self.name or row.status == mock_machines.DESTROYED:
                return None
            return self._machine(row, self._clock())

    def destroy(self, provider_instance_id: str) -> None:
        row_id = _row_id(provider_instance_id)
        if row_id is None:
            return
        with transaction(self.sessions) as s:
            row = mock_machines.get(s, self.name, row_id)
            if row is None or row.status == mock_machines.DESTROYED:
                return
            if not self.owns(row.label):
                raise NotOwnedError(
                    f"{self.name}: machine {provider_instance_id} was not created by this "
                    "installation; it is left alone",
                    provider=self.name,
                )
            mock_machines.mark_destroyed(s, self.name, row_id, self._clock())

    def kill(self, provider_instance_id: str) -> bool:
        """Simulate the machine dying (demos, reconciler tests)."""
        row_id = _row_id(provider_instance_id)
        if row_id is None:
            return False
        with transaction(self.sessions) as s:
            return mock_machines.mark_dead(s, self.name, row_id)

    def _machine(self, row: MockMachine, now: datetime) -> ProviderMachine:
        if row.status == mock_machines.DESTROYED:
            status = MachineStatus.GONE
        elif row.status == mock_machines.DEAD:
            status = MachineStatus.DEAD
        elif now < row.boots_at:
            status = MachineStatus.STARTING
        elif row.will_fail:
            status = MachineStatus.DEAD
        else:
            status = MachineStatus.RUNNING
        return ProviderMachine(
            provider_instance_id=f"{ID_PREFIX}{row.id}",
            label=row.label,
            status=status,
            raw_status=row.status,
            price_per_hour=row.price_per_hour,
            host_id="mock-host",
            gpu=row.gpu,
        )
