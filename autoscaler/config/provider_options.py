"""The `providers:` block: one options model per provider kind, in the `ProviderConfig` union.

Its own module because a provider kind is added here (its options, `needs_key`, `terms()`,
`known_price()`) beside its factory in `providers/registry.FACTORIES`.
"""

from __future__ import annotations

import re
from typing import Annotated, ClassVar, Literal, get_args

from pydantic import AfterValidator, Field, ValidationInfo, field_validator, model_validator

from autoscaler.config.durations import Duration
from autoscaler.config.fields import (
    MAX_PRICE_PER_HOUR,
    EnvName,
    HttpUrl,
    Line,
    Strict,
    Text,
    shown,
)
from autoscaler.config.machine_specs import InstanceSpec
from autoscaler.urls import UrlError, parse_url, shown_url, split_url

HOURS_PER_MONTH = 730.0
"""Hours in a billing month (365 × 24 / 12), to turn $/GB-month into $/h."""


def money(x: float) -> str:
    """A price as people write it: $0.40, $1.5."""
    return f"${x:.2f}" if round(x, 2) == x else f"${x:g}"


class _ProviderBase(Strict):
    """What every provider kind declares beside its options (one class per kind, registered in
    `ProviderConfig`; its machines come from `providers.registry.FACTORIES[kind]`).

    Credentials are never written in the YAML: by env var name, or stored encrypted."""

    needs_key: ClassVar[bool] = False
    """Machines of this kind are rented with an API key (the vault, or `api_key_env`)."""
    ready_when_running: ClassVar[bool] = False
    """A machine the provider lists as running is ready: it runs no worker of ours to wait for
    (the mock provider's simulated machines)."""
    can_stop: ClassVar[bool] = False
    """Machines of this kind can be stopped with their disk kept and started again (a warm
    pool's need); `providers.base.Provider.can_stop` reads it from here."""
    can_bid: ClassVar[bool] = False
    """Machines of this kind can be rented interruptible at a bid (`instance.interruptible`):
    Vast's bid instances; the mock provider accepts the setting (its machines stay on demand)."""

    api_key_env: EnvName | None = None

    def terms(self) -> str:
        """What the dry run says this provider rents (`autoscaler validate`)."""
        raise NotImplementedError(f"provider kind {type(self).__name__} does not say its terms")

    def known_price(self, spec: InstanceSpec) -> tuple[float, str] | None:
        """What every machine of `spec` costs before renting, and how; None on a live market."""
        return None

    def known_storage_price(self, spec: InstanceSpec) -> tuple[float, str] | None:
        """What a stopped machine of `spec` bills per hour (its kept disks), and how; None
        where only a live offer says (Vast's per-host storage price)."""
        return None


def _check_volume_gb(value: int) -> int:
    """RunPod makes no volume below 10 GB: refused here rather than at the first create."""
    if value != 0 and value < 10:
        raise ValueError(
            f"{value} GB: RunPod's smallest volume is 10 GB; set volume_gb to 0 (no volume) or "
            "10 or more"
        )
    return value


class RunPodOptions(_ProviderBase):
    needs_key: ClassVar[bool] = True
    kind: Literal["runpod"]
    gpu_types: tuple[Annotated[Line, Field(min_length=1, max_length=100)], ...] = Field(
        default=(), max_length=100
    )
    cloud_type: Literal["SECURE", "COMMUNITY"] = "SECURE"
    data_centers: tuple[Annotated[Line, Field(min_length=1, max_length=100)], ...] = Field(
        default=(), max_length=100
    )
    base_url: HttpUrl = "https://api.runpod.io"
    volume_gb: Annotated[int, AfterValidator(_check_volume_gb)] = Field(default=0, le=100_000)
    """A volume disk per pod (RunPod's `mounts.persistent`), mounted at `volume_mount_path`: the
    only disk a stopped pod keeps (its container disk is erased), so the agent keeps its work
    folder there. A warm pool needs one."""
    volume_mount_path: AbsPath = "/workspace"
    storage_price_per_gb_month: float = Field(default=0.20, ge=0, le=100)
    """What RunPod bills per GB-month for a stopped pod's volume ($0.20 at the time of writing)."""

    can_stop: ClassVar[bool] = True

    def known_storage_price(self, spec: InstanceSpec) -> tuple[float, str] | None:
        price = round(self.volume_gb * self.storage_price_per_gb_month / HOURS_PER_MONTH, 6)
        return price, (
            f"{self.volume_gb} GB volume × {money(self.storage_price_per_gb_month)}/GB-month"
        )

    def terms(self) -> str:
        gpus = ", ".join(self.gpu_types) or "the queue's GPU"
        return f"RunPod {self.cloud_type} cloud, GPU types in order: {gpus}"


class VastOptions(_ProviderBase):
    needs_key: ClassVar[bool] = True
    kind: Literal["vast"]
    verified: bool = True
    countries: tuple[Annotated[Line, Field(min_length=1, max_length=100)], ...] = Field(
        default=(), max_length=300
    )
    min_bandwidth_mbps: float | None = Field(default=None, ge=0, le=1e6)
    min_cuda_version: float | None = Field(default=None, gt=0, le=100)
    min_reliability: float | None = Field(default=None, ge=0, le=1)
    avoid_host_for: Duration = Field(default=86400.0, gt=0)
    base_url: HttpUrl = "https://console.vast.ai"

    can_stop: ClassVar[bool] = True
    can_bid: ClassVar[bool] = True

    def terms(self) -> str:
        terms = ["verified" if self.verified else "any host"]
        if self.countries:
            terms.append("in " + "/".join(self.countries))
        if self.min_bandwidth_mbps is not None:
            terms.append(f"≥{self.min_bandwidth_mbps:g} Mb/s down")
        if self.min_cuda_version is not None:
            terms.append(f"CUDA ≥{self.min_cuda_version:g}")
        if self.min_reliability is not None:
            terms.append(f"reliability ≥{self.min_reliability:g}")
        return "Vast.ai cheapest offer, " + ", ".join(terms)


class MockOptions(_ProviderBase):
    """Simulated machines in the database: test triggers without renting anything."""

    ready_when_running: ClassVar[bool] = True
    kind: Literal["mock"]
    boot_delay: Duration = Field(default=5.0, ge=0)
    boot_failure_rate: float = Field(default=0.0, ge=0, le=1)
    capacity_error_rate: float = Field(default=0.0, ge=0, le=1)
    price_per_hour: float = Field(default=0.40, ge=0, le=MAX_PRICE_PER_HOUR)
    stop_delay: Duration = Field(default=2.0, ge=0)
    """Seconds from a stop to the machine reported stopped."""
    start_delay: Duration = Field(default=2.0, ge=0)
    """Seconds from a start to the machine reported running again."""
    resume_failure_rate: float = Field(default=0.0, ge=0, le=1)
    """Share of starts refused as if the host's GPU had been rented meanwhile."""
    storage_price_per_hour: float = Field(default=0.01, ge=0, le=MAX_PRICE_PER_HOUR)

    can_stop: ClassVar[bool] = True
    can_bid: ClassVar[bool] = True

    def terms(self) -> str:
        return "mock machines (nothing is rented)"

    def known_price(self, spec: InstanceSpec) -> tuple[float, str] | None:
        price = round(self.price_per_hour * spec.gpu_count, 6)  # as the mock provider does
        return price, f"{money(self.price_per_hour)}/h × {spec.gpu_count} GPU"

    def known_storage_price(self, spec: InstanceSpec) -> tuple[float, str] | None:
        return self.storage_price_per_hour, f"{money(self.storage_price_per_hour)}/h stopped"


class LocalOptions(_ProviderBase):
    """ "Rents" by starting a local process per machine; destroys by stopping its process group."""

    kind: Literal["local"]
    command: Text | None = None
    price_per_hour: float = Field(default=0.0, ge=0, le=MAX_PRICE_PER_HOUR)

    can_stop: ClassVar[bool] = True

    def terms(self) -> str:
        return "local processes on this machine (nothing is rented)"

    def known_storage_price(self, spec: InstanceSpec) -> tuple[float, str] | None:
        return 0.0, "a folder on this machine"

    def known_price(self, spec: InstanceSpec) -> tuple[float, str] | None:
        return self.price_per_hour, f"{money(self.price_per_hour)}/h per machine"


ENGINE_URLS = "unix:///run/podman/podman.sock, unix:///var/run/docker.sock or tcp://host:2376"


def _check_engine_url(value: str) -> str:
    """A container engine's API: a unix socket by absolute path, or tcp://host:port."""
    try:
        parsed = parse_url(value, schemes=("unix", "tcp"), example="tcp://gpu-server:2376")
    except UrlError as exc:
        raise ValueError(f"{exc}; an engine's API is {ENGINE_URLS}") from None
    parts = split_url(value)
    assert parts is not None  # parse_url accepted it
    shown = shown_url(value)
    if parts.query or parts.fragment or parts.username is not None:
        raise ValueError(
            f"{shown} has a user, query or fragment, which an engine's API does not take; "
            f"write it as {ENGINE_URLS}"
        )
    if parsed.scheme == "unix" and (parts.netloc or len(parts.path) < 2):
        raise ValueError(
            f"{shown} names no socket by its absolute path; write unix:// and the path, e.g. "
            "unix:///run/podman/podman.sock (three slashes)"
        )
    if parsed.scheme == "tcp" and (not parsed.hostname or parsed.port is None):
        raise ValueError(f"{shown} needs a host and a port, e.g. tcp://gpu-server:2376")
    if parsed.scheme == "tcp" and parts.path not in ("", "/"):
        raise ValueError(f"{shown} has a path; an engine on TCP is tcp://host:port")
    return value


def _check_abs_path(value: str) -> str:
    if not value.startswith("/"):
        raise ValueError(
            f"{shown(value)} is not an absolute path; give the file's full path, e.g. "
            "/etc/autoscaler/engine/cert.pem (every process of the control plane reads it)"
        )
    return value


ENGINE_TCP_WITHOUT_TLS = (
    "serves the engine's API over TCP without TLS, which is refused even on loopback: whoever "
    "can connect to that port (any process or container of that host, or anyone on the network "
    "when it is not loopback) can run containers as root on that host"
)
"""Why an engine's API on tcp:// is refused without TLS, wherever it listens."""
ENGINE_TCP_FIX = (
    "reach the engine through its unix socket (url: unix:///run/podman/podman.sock or "
    "unix:///var/run/docker.sock, or a socket forwarded over SSH from a remote engine), or add "
    "tls: {ca_cert, client_cert, client_key} for an engine started with --tlsverify"
)
HOST_NETWORK_OPT_IN = "unsafe_host_network"
"""The option a provider must set, besides `network: host`, to run its containers on the
host's own network (a development box whose services listen on loopback alone)."""


def _check_network(value: str) -> str:
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}", value):
        raise ValueError(
            f"{shown(value)} is not a network's name; give bridge (the default), none or the "
            "name of a network of the engine (letters, digits, '_', '.', '-')"
        )
    return value


def is_host_network(value: str) -> bool:
    """`host` (any case): the host's own network stack, loopback included."""
    return value.lower() == "host"


EngineUrl = Annotated[str, AfterValidator(_check_engine_url)]
AbsPath = Annotated[Line, Field(min_length=2), AfterValidator(_check_abs_path)]


class ContainerTls(Strict):
    """Mutual TLS to an engine's API on TCP: the engine's certificate is always verified
    (against `ca_cert`, else the system's CAs) and ours proves who calls it, since whoever may
    call that API is root on its host."""

    ca_cert: AbsPath | None = None
    client_cert: AbsPath
    client_key: AbsPath


class ContainerOptions(_ProviderBase):
    """Containers of the queue's image on a Docker or Podman engine of the team's own (their
    GPU servers): nothing is rented, `price_per_hour` is for the accounts. `gpus` is how many
    GPUs the engine has (0: CPU-only containers, no GPU is asked of the engine)."""

    kind: Literal["container"]
    url: EngineUrl | None = None
    tls: ContainerTls | None = None
    gpu: Annotated[Line, Field(min_length=1, max_length=100)] | None = None
    gpus: int = Field(ge=0, le=64)
    max_machines: int = Field(default=1, ge=1, le=1000)
    price_per_hour: float = Field(default=0.0, ge=0, le=MAX_PRICE_PER_HOUR)
    unsafe_host_network: bool = False
    network: Annotated[str, AfterValidator(_check_network)] = "bridge"
    command: (
        tuple[Annotated[Text, Field(min_length=1)], ...] | Annotated[Text, Field(min_length=1)]
    ) | None = None
    init: bool = True

    @field_validator("command")
    @classmethod
    def _some_command(cls, value: tuple[str, ...] | str | None) -> tuple[str, ...] | str | None:
        if isinstance(value, tuple) and not 1 <= len(value) <= 1000:
            raise ValueError(
                "the command is an empty list; give the program and its arguments, e.g. "
                '["sleep", "infinity"], or leave command out to run the image\'s own'
            )
        return value

    @field_validator("network")
    @classmethod
    def _walled_off(cls, value: str, info: ValidationInfo) -> str:
        """A container on the host's network reaches every service on the host's loopback
        (the broker, the database, an engine's API): refused unless opted into by name."""
        if is_host_network(value) and info.data.get(HOST_NETWORK_OPT_IN) is not True:
            raise ValueError(
                "host puts every container on this host's own network, where it reaches what "
                "listens on the host's loopback (the broker, the database, the engine's API, "
                "which is root on the host); leave network out (the engine's default bridge) "
                "and give workers addresses they can reach (the control plane's public API URL "
                "and broker, host.containers.internal or host.docker.internal on the same "
                "host), or, on a development box whose services listen on loopback alone, add "
                f"{HOST_NETWORK_OPT_IN}: true beside network: host"
            )
        return value

    @model_validator(mode="after")
    def _tls_over_the_network(self) -> ContainerOptions:
        if self.unsafe_host_network and not is_host_network(self.network):
            raise ValueError(
                f"{HOST_NETWORK_OPT_IN} is true but network is {self.network!r}, and the "
                f"opt-in only goes with network: host; remove {HOST_NETWORK_OPT_IN}"
            )
        if self.url is None or not self.url.lower().startswith("tcp://"):
            if self.tls is not None:
                raise ValueError(
                    "tls is given but url is not tcp://…: TLS secures an engine reached over "
                    "TCP; remove tls, or give url: tcp://host:2376"
                )
            return self
        if self.tls is None:
            raise ValueError(
                f"url {shown_url(self.url)} {ENGINE_TCP_WITHOUT_TLS}; {ENGINE_TCP_FIX}"
            )
        return self

    can_stop: ClassVar[bool] = True

    def known_storage_price(self, spec: InstanceSpec) -> tuple[float, str] | None:
        return 0.0, "a stopped container on the team's own engine"

    def terms(self) -> str:
        where = shown_url(self.url) if self.url else "$DOCKER_HOST or the local socket"
        gpus = f"{self.gpus} × {self.gpu or 'GPU'}" if self.gpus else "no GPU"
        return (
            f"containers on the engine at {where}: {gpus}, at most {self.max_machines} at "
            "once, nothing is rented"
        )

    def known_price(self, spec: InstanceSpec) -> tuple[float, str] | None:
        return self.price_per_hour, f"{money(self.price_per_hour)}/h per container"


ProviderConfig = Annotated[
    RunPodOptions | VastOptions | MockOptions | LocalOptions | ContainerOptions,
    Field(discriminator="kind"),
]
"""The one registration of a provider kind's options (beside its factory in
`providers.registry.FACTORIES`); `tests/providers/test_kinds.py` fails when a part is missing."""

PROVIDER_MODELS: tuple[type[_ProviderBase], ...] = get_args(get_args(ProviderConfig)[0])
PROVIDER_KINDS: tuple[str, ...] = tuple(
    get_args(m.model_fields["kind"].annotation)[0] for m in PROVIDER_MODELS
)
KEYED_KINDS: tuple[str, ...] = tuple(
    k for k, m in zip(PROVIDER_KINDS, PROVIDER_MODELS, strict=True) if m.needs_key
)
"""The kinds rented with an API key."""
