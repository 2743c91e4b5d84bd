"""The provider interface: find offers, create, get, list our own, destroy — and the errors.

Every provider (RunPod, Vast.ai, mock, local, container) implements `Provider`. Callers never see a
provider's wire format: they get `Offer` and `ProviderMachine` values and one of the error classes
below, each of which says what to do next:

- `CapacityError` (and its `OfferGoneError`): nothing was created; try the next GPU type/offer.
  Its `ResumeRefusedError`: a stopped machine cannot start again; destroy it, rent afresh.
- `AuthError`: the key is wrong or lacks rights; stop and tell the operator.
- `RateLimitedError` / `TransientError`: nothing is known to have happened; retry later, with
  backoff (idempotent calls are already retried inside `http.HttpClient`).
- `AmbiguousCreateError`: the create may have happened. Look the label up before any retry
  (`Provider.find_by_label`); `create_on_best_offer` does exactly that.
- `NotOwnedError`: refused to touch a machine that does not carry this installation's label.
- `ProviderRequestError`: the provider refused our request as malformed — a bug or a config
  value the provider does not accept; retrying will not help.

Ownership is each implementation's duty, through the one test `Provider.owns`
(`labels.is_owned`): `list_owned`, `get`, `find_by_label`, `destroy`, `stop` and `start` only
ever return or touch machines whose label parses to this installation's id.
`tests/providers/test_contract.py` holds every kind to it against a foreign machine on the same
backend (listed: never; destroyed: refused, and it lives on).
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Mapping
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from types import MappingProxyType
from typing import Any, Protocol

from autoscaler.config.machine_specs import InstanceSpec
from autoscaler.config.provider_options import PROVIDER_KINDS, PROVIDER_MODELS
from autoscaler.lifecycle import MachineStatus as MachineStatus
from autoscaler.providers import labels

# --------------------------------------------------------------------------- values


def _frozen(mapping: Mapping[str, Any] | None) -> Mapping[str, Any]:
    return MappingProxyType(dict(mapping or {}))


@dataclass(frozen=True)
class Offer:
    """Something `create` can rent: a RunPod GPU type, a Vast ask, a mock or local slot.

    `spec` is the instance spec the offer was found for (image, disk, GPU count travel with it).
    `price_per_hour` is the whole machine's price (all GPUs). `details` is informational only.
    """

    provider: str
    offer_id: str
    gpu: str
    gpu_count: int
    price_per_hour: float
    spec: InstanceSpec
    host_id: str | None = None
    details: Mapping[str, Any] = field(default_factory=dict, compare=False, hash=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "details", _frozen(self.details))


@dataclass(frozen=True)
class LaunchSpec:
    """What one create stamps on the machine: the ownership label and the environment."""

    label: str
    env: Mapping[str, str] = field(default_factory=dict, compare=False, hash=False)

    def __post_init__(self) -> None:
        if labels.parse_label(self.label) is None:
            raise ValueError(
                f"{self.label!r} is not an ownership label; build it with LaunchSpec.new(...)"
            )
        object.__setattr__(self, "env", _frozen(self.env))

    @classmethod
    def new(
        cls, installation_id: str, launch_id: str, env: Mapping[str, str] | None = None
    ) -> LaunchSpec:
        """The launch for `launch_id`, its env carrying the ownership marker too."""
        merged = dict(env or {})
        merged.update(labels.marker_env(installation_id, launch_id))
        return cls(label=labels.make_label(installation_id, launch_id), env=merged)

    @property
    def launch_id(self) -> str:
        parsed = labels.parse_label(self.label)
        assert parsed is not None
        return parsed.launch_id

    @property
    def installation_id(self) -> str:
        parsed = labels.parse_label(self.label)
        assert parsed is not None
        return parsed.installation_id

    def __repr__(self) -> str:  # env may hold the worker's token: never print its values
        return f"LaunchSpec(label={self.label!r}, env_keys={sorted(self.env)!r})"

    @property
    def secrets(self) -> tuple[str, ...]:
        """The values of this launch's environment that are secrets (its worker token): a
        provider's error text that quotes the request must never carry them on."""
        return tuple(v for k, v in self.env.items() if k in SECRET_ENV and v)


SECRET_ENV = frozenset({"AUTOSCALER_WORKER_TOKEN"})
"""Environment variables of a launch whose values are secrets."""

WORKDIR_ENV = "AUTOSCALER_AGENT_WORKDIR"
"""Where the agent keeps its work folder (checkout, virtualenv), as `agent.server_api.AgentConfig`
reads it: set by providers whose machines keep it across a stop only at a given place (RunPod's
volume disk, a local machine's folder), so a resumed agent finds it again."""

_CONFIG_MODELS = dict(zip(PROVIDER_KINDS, PROVIDER_MODELS, strict=True))


@dataclass(frozen=True)
class ProviderMachine:
    """One of our machines as the provider reports it."""

    provider_instance_id: str
    label: str
    status: MachineStatus
    raw_status: str | None = None
    price_per_hour: float | None = None
    host_id: str | None = None
    gpu: str | None = None
    storage_price_per_hour: float | None = None
    """What the machine bills while stopped (its disks), where the provider says."""

    @property
    def launch_id(self) -> str | None:
        parsed = labels.parse_label(self.label)
        return parsed.launch_id if parsed else None


class HostsToAvoid(Protocol):
    """Where a provider remembers hosts that failed it (the store keeps them across restarts:
    `store.avoided_hosts.StoredHostsToAvoid`). A port, so providers hold no database code."""

    def active(self, provider: str, now: datetime) -> list[str]:
        """Host ids of `provider` still to be avoided at `now`."""
        ...

    def avoid(self, provider: str, host_id: str, reason: str, until: datetime) -> None:
        """Avoid `host_id` until `until` (never shortening an earlier entry)."""
        ...


# --------------------------------------------------------------------------- errors


class ProviderError(Exception):
    """Base of every provider failure. Messages never contain credentials."""

    def __init__(self, message: str, *, provider: str = "") -> None:
        super().__init__(message)
        self.provider = provider


class CapacityError(ProviderError):
    """No machine could be had for this offer (no stock, price moved, refused): try the next."""


class OfferGoneError(CapacityError):
    """The offer vanished between search and create (Vast `no_such_ask`): try the next offer."""


class ResumeRefusedError(CapacityError):
    """A stopped machine cannot start again where it is: its GPU was rented by someone else
    meanwhile (RunPod starts it with zero GPUs), the host is gone, or it waits for resources
    indefinitely. Destroy it and rent a fresh machine; never retry the start."""


class AuthError(ProviderError):
    """The API key was refused (401) or lacks rights (403). Retrying will not help."""


class RateLimitedError(ProviderError):
    """The provider said 429 (after our own retries, if the call was idempotent)."""

    def __init__(
        self, message: str, *, provider: str = "", retry_after: float | None = None
    ) -> None:
        super().__init__(message, provider=provider)
        self.retry_after = retry_after


class TransientError(ProviderError):
    """Network trouble or a 5xx on a call where nothing can have happened twice: retry later."""


class UnansweredError(TransientError):
    """The provider took the call and gave no answer in time (a read or connect timeout, or the
    caller's deadline reached): the provider is silent, which says nothing about the machine."""


class AmbiguousCreateError(ProviderError):
    """A create failed in a way that may have created the machine (5xx, timeout).

    The provider already looked for `label` and did not find it (yet). Before any new create for
    this launch, look it up by label again; never create a second machine for the same launch.
    """

    def __init__(self, message: str, *, provider: str = "", label: str = "") -> None:
        super().__init__(message, provider=provider)
        self.label = label


class NotOwnedError(ProviderError):
    """The machine does not carry this installation's label: we never touch it."""


class ProviderRequestError(ProviderError):
    """The provider refused the request itself (400/422): a bug or an unsupported setting."""


# --------------------------------------------------------------------------- the interface


class Provider(ABC):
    """One provider account as seen by one installation.

    Implementations keep the API key private: it appears in no repr, log line or error text.
    """

    kind: str = ""

    def __init__(self, name: str, installation_id: str) -> None:
        if not labels.INSTALLATION_RE.fullmatch(installation_id):
            raise ValueError(f"bad installation id {installation_id!r}")
        self.name = name
        self.installation_id = installation_id

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r}, installation={self.installation_id!r})"

    @property
    def can_stop(self) -> bool:
        """Machines of this kind can be stopped and started again with their disk kept (`stop`,
        `start`): what a warm pool needs. Read from the kind's options model
        (`config.provider_options._ProviderBase.can_stop`), so `validate` and the provider never
        disagree; kinds that cannot keep the default `stop`/`start`, which refuse."""
        model = _CONFIG_MODELS.get(self.kind)
        return bool(model is not None and model.can_stop)

    def redacting(self, secrets: Iterable[str]) -> AbstractContextManager[None]:
        """While it lasts, `secrets` are scrubbed from every error this provider raises (a
        launch's worker token, which an API's error may echo from the request)."""
        return nullcontext()

    # -- the five operations

    @abstractmethod
    def find_offers(self, spec: InstanceSpec) -> list[Offer]:
        """Offers for `spec`, best first (preference order, then price); all within the cap."""

    @abstractmethod
    def create(self, offer: Offer, launch: LaunchSpec) -> ProviderMachine:
        """Rent `offer`, labelled and with `launch.env`. Raises one of the errors above."""

    @abstractmethod
    def get(self, provider_instance_id: str) -> ProviderMachine | None:
        """One of our machines; None when it is gone or is not ours."""

    @abstractmethod
    def list_owned(self) -> list[ProviderMachine]:
        """Every machine at the provider carrying this installation's label (all pages)."""

    @abstractmethod
    def destroy(self, provider_instance_id: str) -> None:
        """Destroy one of our machines. Already gone = success. Not ours = `NotOwnedError`."""

    def find_bid_offers(self, spec: InstanceSpec, bid: float) -> list[Offer]:
        """Offers to rent interruptible at `bid` $/h per machine (Vast's bid instances), each
        with `details["interruptible"]` True; none where the kind has no such machines."""
        return []

    # -- stop and start, for kinds that can (`can_stop`)

    def stop(self, provider_instance_id: str) -> None:
        """Stop one of our machines, keeping its disk, so `start` resumes it. Asynchronous at
        most providers: `get` reports STOPPED once it is. Already stopped = success; gone =
        success (nothing runs); not ours = `NotOwnedError`."""
        raise ProviderRequestError(
            f"{self.name}: {self.kind} machines cannot be stopped and started",
            provider=self.name,
        )

    def start(self, provider_instance_id: str) -> None:
        """Start one of our stopped machines again; `get` reports STARTING, then RUNNING.
        Already running = success. Gone, GPU taken or host unable = `ResumeRefusedError`."""
        raise ProviderRequestError(
            f"{self.name}: {self.kind} machines cannot be stopped and started",
            provider=self.name,
        )

    # -- helpers with sensible defaults

    def find_by_label(self, label: str) -> ProviderMachine | None:
        """Our machine with this label, if the provider has it (used after ambiguous creates)."""
        if not self.owns(label):
            return None
        for machine in self.list_owned():
            if machine.label == label:
                return machine
        return None

    def avoid_host(self, host_id: str, reason: str) -> None:  # noqa: B027 - optional hook
        """Remember a host that failed us so later searches skip it (Vast); a no-op elsewhere."""

    def owns(self, label: str | None) -> bool:
        return labels.is_owned(label, self.installation_id)

    def _check_launch(self, launch: LaunchSpec) -> None:
        if not self.owns(launch.label):
            raise NotOwnedError(
                f"launch label {launch.label!r} does not belong to installation "
                f"{self.installation_id!r}; build it with LaunchSpec.new(installation_id, ...)",
                provider=self.name,
            )


def create_on_first_offer(
    provider: Provider, offers: Iterable[Offer], launch: LaunchSpec
) -> ProviderMachine:
    """Rent the first offer of one provider that works (`create_on_best_offer` with one
    provider): its error is raised as it came when none could be rented."""
    try:
        return create_on_best_offer(list(offers), {provider.name: provider}, launch).machine
    except NotPlacedError as exc:
        error = exc.errors.get(provider.name)
        if error is None:
            raise CapacityError(
                f"{provider.name}: no offer matches the instance spec", provider=provider.name
            ) from None
        if isinstance(error, CapacityError):
            raise CapacityError(f"{provider.name}: {exc}", provider=provider.name) from error
        raise error from None


@dataclass(frozen=True)
class Placed:
    """The machine one launch rented, the offer it came from, and what the providers tried
    before it said (they back off; the one that rented does not)."""

    machine: ProviderMachine
    offer: Offer
    errors: Mapping[str, ProviderError]


class NotPlacedError(ProviderError):
    """No offer of any provider could be rented, and nothing was created: `errors` holds each
    provider's last error (capacity, auth, a refused request, a 429, no stock)."""

    def __init__(self, message: str, errors: Mapping[str, ProviderError]) -> None:
        super().__init__(message)
        self.errors = dict(errors)


def _placed(machine: ProviderMachine, offer: Offer, errors: dict[str, ProviderError]) -> Placed:
    """The launch's machine; the provider that rented it is no failure of this launch."""
    return Placed(machine, offer, {n: e for n, e in errors.items() if n != offer.provider})


def create_on_best_offer(
    ranked: Iterable[Offer],
    providers: Mapping[str, Provider],
    launch: LaunchSpec,
    before_create: Callable[[str], bool] = lambda name: True,
) -> Placed:
    """Rent the first of `ranked` (offers of several providers, best first) that works, never
    two machines for one launch.

    1. Before the first create on a provider, its machine with this label is looked up (a
       redelivered task, a restart mid-launch): found, it is the launch's machine.
    2. `before_create(provider)` runs before every create (the store names the provider on the
       launch's row, so reconcile looks an ambiguous create up there); False stops the launch.
    3. A capacity error (no stock, offer gone) moves to the next offer, on any provider. An
       auth error, a 429 or a refused request sets that provider aside for this launch (its
       other offers are skipped) and moves to the next provider's: nothing was created.
    4. An ambiguous create is looked up by label once more; if still not found it is raised
       rather than trying any other offer, on any provider: the first create may yet appear.
    Raises `NotPlacedError` when no offer could be rented.
    """
    errors: dict[str, ProviderError] = {}
    looked: set[str] = set()
    aside: set[str] = set()
    tried = 0
    for offer in ranked:
        name = offer.provider
        if name in aside:
            continue
        provider = providers[name]
        with provider.redacting(launch.secrets):
            try:
                if name not in looked:
                    looked.add(name)
                    existing = provider.find_by_label(launch.label)
                    if existing is not None:
                        return _placed(existing, offer, errors)
                if not before_create(name):
                    why = f"launch {launch.launch_id} stopped before its create"
                    raise NotPlacedError(why, errors)
                tried += 1
                machine = provider.create(offer, launch)
            except CapacityError as exc:
                errors[name] = exc
                continue
            except AmbiguousCreateError:
                try:
                    found = provider.find_by_label(launch.label)
                except ProviderError:  # a 429 or an outage on the lookup: still unknown
                    found = None
                if found is not None:
                    return _placed(found, offer, errors)
                raise
            except NotPlacedError:
                raise
            except ProviderError as exc:  # auth, 429, a refused request: nothing was created
                errors[name] = exc
                aside.add(name)
                continue
        return _placed(machine, offer, errors)
    what = f"none of {tried} offer(s) could be rented" if tried else "no offer could be rented"
    last = "; ".join(f"{n}: {e}" for n, e in errors.items())
    raise NotPlacedError(f"{what}" + (f" ({last})" if last else ""), errors)


def find_after_ambiguous_create(
    provider: Provider,
    label: str,
    why: str,
    *,
    attempts: int,
    delay: float,
    sleep: Callable[[float], None],
) -> ProviderMachine:
    """The create may have happened and be billing: find the machine by its unique label.

    Tried `attempts` times, `delay` apart (providers list new machines with a lag); if it is
    still not found, AmbiguousCreateError tells the caller to look again before any new create.
    """
    log = logging.getLogger(f"autoscaler.providers.{provider.kind}")
    log.warning("%s: create of %s is ambiguous (%s); looking it up", provider.name, label, why)
    for attempt in range(max(1, attempts)):
        if attempt:
            sleep(delay)
        try:
            found = provider.find_by_label(label)
        except ProviderError as exc:
            # A 429 or an outage on the lookup says nothing about the create: the outcome
            # stays unknown (never "failed"), so the launch is left to reconcile.
            log.warning("%s: lookup of %s failed: %s", provider.name, label, exc)
            if isinstance(exc, RateLimitedError | AuthError):
                break
            continue
        if found is not None:
            log.info(
                "%s: the ambiguous create did happen: %s", provider.name, found.provider_instance_id
            )
            return found
    raise AmbiguousCreateError(
        f"{provider.name}: create of {label} failed ambiguously ({why}) and no machine with that "
        "label was found yet; look it up by label before creating again",
        provider=provider.name,
        label=label,
    )


@dataclass(frozen=True)
class ProviderBuild:
    """What a provider kind's factory (`providers.registry.FACTORIES`) builds a provider from:
    the decrypted API key (checked present for kinds that need one), this installation's id, the
    store's sessions (for what a provider keeps there), a folder for local state, and the HTTP
    timeouts and retry policy (a `providers.http.RetryPolicy`, None for the default)."""

    credential: str | None
    installation_id: str
    sessions: Any
    state_dir: Path | None = None
    timeout: tuple[float, float] = (5.0, 30.0)
    retry: Any = None
