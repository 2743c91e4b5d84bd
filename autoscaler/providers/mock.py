"""The mock provider: simulated machines kept in the database, nothing rented.

Users test their triggers with it. Machines boot after `boot_delay`, a share of them fails to
boot (`boot_failure_rate`: they turn DEAD instead of RUNNING), a share of creates is refused
for capacity (`capacity_error_rate`), and every machine costs `price_per_hour`. A stop takes
`stop_delay` (RUNNING, then STOPPED), a start `start_delay` (STARTING, then RUNNING), a share
of starts is refused (`resume_failure_rate`: `ResumeRefusedError`, as when a host's GPU was
rented meanwhile), and a stopped machine bills `storage_price_per_hour`. The state lives
behind the `MockMachines` port; production keeps it in the `mock_machines` table
(store/mock_machines.py), so beat, workers, the CLI and the API — separate processes — all
see the same machines.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Protocol

from autoscaler.config.machine_specs import InstanceSpec
from autoscaler.config.provider_options import MockOptions
from autoscaler.digits import ascii_whole
from autoscaler.providers.base import (
    CapacityError,
    LaunchSpec,
    MachineStatus,
    NotOwnedError,
    Offer,
    Provider,
    ProviderBuild,
    ProviderMachine,
    ResumeRefusedError,
)

if TYPE_CHECKING:
    from autoscaler.store.mock_machines import MockRecord

ID_PREFIX = "mock-"


def _row_id(provider_instance_id: str) -> int | None:
    if not provider_instance_id.startswith(ID_PREFIX):
        return None
    rest = provider_instance_id[len(ID_PREFIX) :]
    return ascii_whole(rest)


class MockMachines(Protocol):
    """Where the mock's machines live (`store.mock_machines.StoredMockMachines`: the state
    store, so beat, workers and the CLI share them). A port: the provider holds no SQL."""

    def by_label(self, label: str) -> MockRecord | None: ...

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
        """Create the machine for `label`, or return the one already there."""
        ...

    def get(self, provider: str, machine_id: int) -> MockRecord | None: ...

    def live(self, provider: str) -> list[MockRecord]: ...

    def destroy(self, provider: str, machine_id: int, now: datetime) -> bool: ...

    def kill(self, provider: str, machine_id: int) -> bool: ...

    def stop(self, provider: str, machine_id: int, until: datetime) -> bool:
        """Stop a created machine, stopped from `until` on; False if it was not created."""
        ...

    def start(self, provider: str, machine_id: int, until: datetime) -> bool:
        """Start a stopped machine, running from `until` on; False if it was not stopped."""
        ...


class MockProvider(Provider):
    kind = "mock"

    def __init__(
        self,
        name: str,
        config: MockOptions,
        installation_id: str,
        machines: MockMachines,
        *,
        rng: random.Random | None = None,
        clock: Callable[[], datetime] | None = None,
    ) -> None:
        super().__init__(name, installation_id)
        self.config = config
        self.machines = machines
        self._rng = rng or random.Random()
        self._clock = clock or (lambda: datetime.now(UTC))

    def find_offers(self, spec: InstanceSpec) -> list[Offer]:
        price = round(self.config.price_per_hour * spec.gpu_count, 6)
        if price > spec.max_price_per_hour:
            return []
        return [
            Offer(
                provider=self.name,
                offer_id=f"mock:{spec.gpus[0]}",
                gpu=spec.gpus[0],  # simulated: any GPU is offered, the first one asked
                gpu_count=spec.gpu_count,
                price_per_hour=price,
                spec=spec,
                host_id="mock-host",
            )
        ]

    def create(self, offer: Offer, launch: LaunchSpec) -> ProviderMachine:
        self._check_launch(launch)
        now = self._clock()
        existing = self.machines.by_label(launch.label)
        if existing is not None and not existing.destroyed:
            return self._machine(existing, now)
        if self._rng.random() < self.config.capacity_error_rate:
            raise CapacityError(
                f"{self.name}: simulated capacity error for {offer.gpu}", provider=self.name
            )
        row = self.machines.insert(
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
        row = self.machines.get(self.name, row_id)
        if row is None or row.destroyed or not self.owns(row.label):
            return None
        return self._machine(row, self._clock())

    def list_owned(self) -> list[ProviderMachine]:
        now = self._clock()
        return [self._machine(r, now) for r in self.machines.live(self.name) if self.owns(r.label)]

    def find_by_label(self, label: str) -> ProviderMachine | None:
        if not self.owns(label):
            return None
        row = self.machines.by_label(label)
        if row is None or row.provider != self.name or row.destroyed:
            return None
        return self._machine(row, self._clock())

    def _owned_row(self, provider_instance_id: str) -> MockRecord | None:
        """The machine, None when gone; `NotOwnedError` when it is not ours."""
        row_id = _row_id(provider_instance_id)
        if row_id is None:
            return None
        row = self.machines.get(self.name, row_id)
        if row is None or row.destroyed:
            return None
        if not self.owns(row.label):
            raise NotOwnedError(
                f"{self.name}: machine {provider_instance_id} was not created by this "
                "installation; it is left alone",
                provider=self.name,
            )
        return row

    def destroy(self, provider_instance_id: str) -> None:
        row = self._owned_row(provider_instance_id)
        if row is not None:
            self.machines.destroy(self.name, row.id, self._clock())

    def stop(self, provider_instance_id: str) -> None:
        row = self._owned_row(provider_instance_id)
        now = self._clock()
        if row is None or self._machine(row, now).status is MachineStatus.DEAD:
            return  # gone or dead: nothing runs
        # Conditional: already stopped (or stopping) keeps its first stop's time.
        self.machines.stop(self.name, row.id, now + timedelta(seconds=self.config.stop_delay))

    def start(self, provider_instance_id: str) -> None:
        row = self._owned_row(provider_instance_id)
        if row is None:
            raise self._refused(provider_instance_id, "it is gone")
        now = self._clock()
        if self._machine(row, now).status is MachineStatus.DEAD:
            raise self._refused(provider_instance_id, "it is dead")
        if not row.stopped:
            return  # running or starting already
        if self._rng.random() < self.config.resume_failure_rate:
            raise self._refused(
                provider_instance_id, "simulated: its host's GPU was rented meanwhile"
            )
        until = now + timedelta(seconds=self.config.start_delay)
        if not self.machines.start(self.name, row.id, until):
            again = self.machines.get(self.name, row.id)  # changed meanwhile: by whom?
            if again is None or again.destroyed or again.dead:
                raise self._refused(provider_instance_id, "it went away while starting")

    def _refused(self, provider_instance_id: str, why: str) -> ResumeRefusedError:
        return ResumeRefusedError(
            f"{self.name}: machine {provider_instance_id} cannot be resumed: {why}",
            provider=self.name,
        )

    def kill(self, provider_instance_id: str) -> bool:
        """Simulate the machine dying (demos, reconciler tests)."""
        row_id = _row_id(provider_instance_id)
        return row_id is not None and self.machines.kill(self.name, row_id)

    def _machine(self, row: MockRecord, now: datetime) -> ProviderMachine:
        raw = row.status
        if row.destroyed:
            status = MachineStatus.GONE
        elif row.dead:
            status = MachineStatus.DEAD
        elif row.stopped and now < row.boots_at:
            status, raw = MachineStatus.RUNNING, "stopping"
        elif row.stopped:
            status = MachineStatus.STOPPED
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
            raw_status=raw,
            price_per_hour=row.price_per_hour,
            host_id="mock-host",
            gpu=row.gpu,
            storage_price_per_hour=self.config.storage_price_per_hour,
        )


def build(name: str, config: MockOptions, ctx: ProviderBuild) -> MockProvider:
    """The mock provider's factory (`providers.registry.FACTORIES`): machines in the store."""
    from autoscaler.store.mock_machines import StoredMockMachines

    return MockProvider(name, config, ctx.installation_id, StoredMockMachines(ctx.sessions))
