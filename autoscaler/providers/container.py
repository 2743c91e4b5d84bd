"""The container provider: workers as containers of the queue's image on a Docker or Podman
engine the team runs itself (its own GPU servers), through the Docker Engine API that both serve.

A machine is one container named after its launch's label and carrying it as a container label
(`LABEL_KEY`); reads and destroys list by that label key at the engine, then keep only labels
that parse to this installation, so hand-made containers and other installations' are never
returned nor touched. Its environment is the launch's and nothing of the autoscaler's own.

Capacity is the engine's: at most `max_machines` containers of ours at once, and when `gpus` > 0
each container gets GPUs of its own — device ids picked from 0..gpus-1 minus those our live
containers hold, recorded in a label (`GPU_IDS_KEY`): Docker's `count=n` would hand every
container the same first n GPUs. Two creates racing on one engine both check after creating,
and the later one (by the engine's creation time) backs off. A GPU request the engine drops
(Podman's Docker-compatible API ignores device requests) or refuses (no NVIDIA runtime) removes
the container and raises: a GPU queue's worker never runs without its GPU.

A container is walled off from the host's loopback (the broker, the database, the engine's own
API): it runs on the engine's default bridge unless `network` names another network, and
`network: host` needs `unsafe_host_network: true`. The engine is reached by its unix socket, or
over TCP with verified TLS only, loopback included: any container could call a plain TCP port.

The engine does not bill: `price_per_hour` is what the operators count a container as.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import re
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from datetime import datetime
from typing import Any

import docker
import docker.errors
import requests
from docker.tls import TLSConfig
from docker.types import DeviceRequest
from docker.utils import kwargs_from_env

from autoscaler.config.gpus import canonical
from autoscaler.config.machine_specs import InstanceSpec
from autoscaler.config.provider_options import (
    ENGINE_TCP_FIX,
    ENGINE_TCP_WITHOUT_TLS,
    HOST_NETWORK_OPT_IN,
    ContainerOptions,
    is_host_network,
)
from autoscaler.providers.base import (
    AuthError,
    Build,
    CapacityError,
    LaunchSpec,
    MachineStatus,
    NotOwnedError,
    Offer,
    Provider,
    ProviderError,
    ProviderMachine,
    ProviderRequestError,
    RateLimitedError,
    ResumeRefusedError,
    TransientError,
    find_after_ambiguous_create,
)
from autoscaler.urls import shown_url, split_url

log = logging.getLogger("autoscaler.providers.container")

LABEL_KEY = "io.gpu-queue-autoscaler.label"
"""The container label holding the ownership label (`asg-<installation>-<launch>`)."""
GPU_IDS_KEY = "io.gpu-queue-autoscaler.gpu-ids"
"""The GPU device ids given to the container, comma-separated; empty for none."""
GPU_KEY = "io.gpu-queue-autoscaler.gpu"
PRICE_KEY = "io.gpu-queue-autoscaler.price-per-hour"

DEFAULT_URL = "unix:///var/run/docker.sock"
PROBE_API_VERSION = "1.41"
"""The API version the client is made with before asking the engine for its own."""
REDACTED = "***"

_STATUS = {
    "created": MachineStatus.STARTING,
    "configured": MachineStatus.STARTING,  # Podman's words for created
    "initialized": MachineStatus.STARTING,
    "restarting": MachineStatus.STARTING,
    "running": MachineStatus.RUNNING,
    "stopping": MachineStatus.RUNNING,
    # Files kept, `start` resumes (a paused one: unpaused). Exited by itself looks the same to
    # the engine; the caller knows which it stopped.
    "paused": MachineStatus.STOPPED,
    "exited": MachineStatus.STOPPED,
    "stopped": MachineStatus.STOPPED,
    "dead": MachineStatus.DEAD,  # a removal that failed half-way: never starts again
    "removing": MachineStatus.GONE,
}
_RESTING = frozenset({"exited", "stopped", "dead", "removing"})
"""States in which a container holds no GPU (its processes are gone)."""
_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")
_CREATED_RE = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d{1,9})\d*)?(Z|[+-]\d\d:\d\d)$")

_UNREACHABLE = (requests.exceptions.RequestException, docker.errors.DockerException, OSError)
"""What the SDK raises when the engine cannot be reached or its answer cannot be read."""

_CALL_SECRETS: ContextVar[frozenset[str]] = ContextVar("container_secrets", default=frozenset())


def _same_gpu(a: str, b: str) -> bool:
    """One GPU: by the table's spellings ("NVIDIA GeForce RTX 4090" is "RTX 4090"), else by
    the names written, whatever their case and spaces (the team's own hardware may be any)."""
    if canonical(a) == canonical(b):
        return True
    return " ".join(a.lower().split()) == " ".join(b.lower().split())


def _gpu_ids(labels: Mapping[str, str]) -> list[str]:
    return [g for g in (labels.get(GPU_IDS_KEY) or "").split(",") if g]


def _created_ns(text: str) -> int | None:
    """The engine's creation time of a container in nanoseconds (RFC 3339 with up to 9 digits,
    trailing zeros trimmed by Docker), to order two creates of one second."""
    m = _CREATED_RE.fullmatch(text.strip())
    if m is None:
        return None
    zone = "+00:00" if m.group(3) == "Z" else m.group(3)
    try:
        seconds = int(datetime.fromisoformat(m.group(1) + zone).timestamp())
    except ValueError:
        return None
    return seconds * 1_000_000_000 + int((m.group(2) or "0").ljust(9, "0"))


def _view(attrs: Mapping[str, Any]) -> tuple[str, dict[str, str], str]:
    """(id, labels, state) of a container, from the list's summary or from an inspect."""
    state = attrs.get("State")
    if isinstance(state, dict):  # inspect
        labels = (attrs.get("Config") or {}).get("Labels") or {}
        status = str(state.get("Status") or "")
    else:  # list
        labels = attrs.get("Labels") or {}
        status = str(state or "")
    return str(attrs.get("Id") or ""), dict(labels), status.lower()


def _cause(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text[:300]


class ContainerProvider(Provider):
    kind = "container"

    def __init__(
        self,
        name: str,
        config: ContainerOptions,
        installation_id: str,
        *,
        timeout: float = 30.0,
        grace: float = 10.0,
        environ: Mapping[str, str] | None = None,
        lookup_attempts: int = 3,
        lookup_delay: float = 1.0,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        super().__init__(name, installation_id)
        self.config = config
        self.timeout = timeout
        self.grace = grace
        self.lookup_attempts = lookup_attempts
        self.lookup_delay = lookup_delay
        self._sleep = sleep
        self.url, self._tls = self._endpoint(os.environ if environ is None else environ)
        self._check_network()
        self.shown_url = shown_url(self.url)
        self._api: Any = None
        self._engine_name = "the engine"
        self._host: str | None = None
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"ContainerProvider(name={self.name!r}, url={self.shown_url})"

    # ------------------------------------------------------------------ the engine

    def _endpoint(self, environ: Mapping[str, str]) -> tuple[str, TLSConfig | None]:
        """The engine's URL and TLS, from the options, else from DOCKER_HOST (and its
        DOCKER_TLS_VERIFY / DOCKER_CERT_PATH), else the local socket. An engine reached over the
        network must be reached with verified TLS: its API is root on its host."""
        tls = self.config.tls
        if self.config.url is not None:
            if tls is None:
                if self.config.url.lower().startswith("tcp://"):  # the config model refuses it
                    raise ProviderRequestError(
                        f"provider {self.name!r}: url {shown_url(self.config.url)} "
                        f"{ENGINE_TCP_WITHOUT_TLS}; {ENGINE_TCP_FIX}",
                        provider=self.name,
                    )
                return self.config.url, None
            for field in ("ca_cert", "client_cert", "client_key"):
                path = getattr(tls, field)
                if path is not None and not os.access(path, os.R_OK):
                    raise ProviderRequestError(
                        f"provider {self.name!r}: tls.{field} {path!r} cannot be read by this "
                        "process; put the file there (readable by the autoscaler's user) or "
                        "fix the path",
                        provider=self.name,
                    )
            return self.config.url, TLSConfig(
                client_cert=(tls.client_cert, tls.client_key),
                ca_cert=tls.ca_cert,  # None: the system's CAs
                verify=True,
            )
        try:
            params = kwargs_from_env(environment=dict(environ))
        except docker.errors.DockerException as exc:
            raise ProviderRequestError(
                f"provider {self.name!r}: DOCKER_TLS_VERIFY / DOCKER_CERT_PATH are unusable "
                f"({_cause(exc)}); fix them or give the provider a url and tls",
                provider=self.name,
            ) from None
        url = str(params.get("base_url") or DEFAULT_URL)
        env_tls = params.get("tls")
        parts = split_url(url)
        scheme = parts.scheme.lower() if parts is not None else ""
        if parts is None or scheme not in ("unix", "tcp"):
            raise ProviderRequestError(
                f"provider {self.name!r}: DOCKER_HOST {shown_url(url)} is not a unix:// socket "
                "or a tcp:// address; fix it, or give the provider a url",
                provider=self.name,
            )
        verified = isinstance(env_tls, TLSConfig) and bool(env_tls.verify)
        if scheme == "tcp" and not verified:
            raise ProviderRequestError(
                f"provider {self.name!r}: DOCKER_HOST {shown_url(url)} reaches the engine over "
                "TCP without verified TLS, which is refused even on loopback: whoever can "
                "connect to that port (any process or container of that host) can run "
                "containers as root on it; point DOCKER_HOST at the engine's unix:// socket, "
                "set DOCKER_TLS_VERIFY=1 and DOCKER_CERT_PATH, or give the provider a unix:// "
                "url or a tcp:// url with a tls block",
                provider=self.name,
            )
        return url, env_tls if isinstance(env_tls, TLSConfig) else None

    def _check_network(self) -> None:
        """Containers are walled off from the host's loopback unless the operators opted out
        by name (the config model refuses `network: host` without it; this holds for a
        config made any other way)."""
        if not is_host_network(self.config.network):
            return
        if not self.config.unsafe_host_network:
            raise ProviderRequestError(
                f"provider {self.name!r}: network host would let every container reach what "
                "listens on this host's loopback (the broker, the database, the engine's API); "
                f"leave network out (the engine's default bridge), or set {HOST_NETWORK_OPT_IN}: "
                "true on a development box whose services listen on loopback alone",
                provider=self.name,
            )
        log.warning(
            "%s: %s is set: containers run on the host's own network and reach every service "
            "on its loopback (the broker, the database, the engine's API); use it on a "
            "development box only",
            self.name,
            HOST_NETWORK_OPT_IN,
        )

    def _network_mode(self) -> str:
        """The container's network as the engine is asked for it. `bridge` is the engine's
        default bridge network (Docker's docker0; Podman's `podman` network, which rootless
        Podman runs through slirp4netns or pasta without mapping the host's loopback): a
        container on it has a loopback of its own and reaches the host only at the host's
        other addresses. Podman's `slirp4netns` is asked never to reach the host's loopback,
        whatever the engine's containers.conf says (`allow_host_loopback`)."""
        network = self.config.network
        if network == "slirp4netns" and self.is_podman:
            return "slirp4netns:allow_host_loopback=false"
        return network

    def _client(self) -> Any:
        """The engine's API client, made on first use (building a provider calls nothing)."""
        with self._lock:
            if self._api is not None:
                return self._api
            with self._engine("connect"):
                api = docker.APIClient(
                    base_url=self.url,
                    tls=self._tls or False,
                    timeout=max(1, math.ceil(self.timeout)),
                    version=PROBE_API_VERSION,
                )
                api.trust_env = False  # no proxy or .netrc of the environment for the engine
                version = api.version(api_version=False)
                api._version = str(version.get("ApiVersion") or PROBE_API_VERSION)
            components = version.get("Components") or []
            podman = any("podman" in str(c.get("Name", "")).lower() for c in components)
            self._engine_name = f"{'Podman' if podman else 'Docker'} {version.get('Version', '')}"
            self._api = api
            return api

    @property
    def is_podman(self) -> bool:
        return self._engine_name.startswith("Podman")

    def _scrub(self, text: str) -> str:
        for secret in sorted(_CALL_SECRETS.get(), key=len, reverse=True):
            text = text.replace(secret, REDACTED)
        return text

    @contextmanager
    def redacting(self, secrets: Iterable[str]) -> Iterator[None]:
        """Scrub a launch's secrets (its worker token) from what this provider says meanwhile:
        an engine's error may quote the create request, environment included."""
        token = _CALL_SECRETS.set(_CALL_SECRETS.get() | {s for s in secrets if len(s) >= 8})
        try:
            yield
        finally:
            _CALL_SECRETS.reset(token)

    @contextmanager
    def _engine(self, what: str) -> Iterator[None]:
        """Map what the SDK raises to the provider errors (docstring of `providers.base`)."""
        try:
            yield
        except ProviderError:
            raise
        except docker.errors.APIError as exc:
            raise self._refused(exc, what) from None
        except requests.exceptions.SSLError as exc:
            raise AuthError(
                f"{self.name}: {what}: the TLS handshake with the engine at {self.shown_url} "
                f"failed ({_cause(exc)}); check tls.ca_cert (the CA that signed the engine's "
                "certificate) and that the engine trusts tls.client_cert",
                provider=self.name,
            ) from None
        except _UNREACHABLE as exc:
            raise self._unreachable(exc, what) from None

    def _unreachable(self, exc: BaseException, what: str) -> TransientError:
        return TransientError(
            self._scrub(
                f"{self.name}: {what}: the engine at {self.shown_url} did not answer "
                f"({_cause(exc)}); is it running (systemctl start docker, or podman system "
                "service) and is the url right?"
            ),
            provider=self.name,
        )

    def _refused(self, exc: docker.errors.APIError, what: str) -> ProviderError:
        status = int(exc.status_code or 0)
        said = self._scrub(_cause(exc.explanation or exc))
        message = f"{self.name}: {what}: {self._engine_name} answered HTTP {status}: {said}"
        if status in (401, 403):
            return AuthError(
                f"{message}; check the client certificate (tls) and the engine's authorization",
                provider=self.name,
            )
        if status == 429:
            return RateLimitedError(message, provider=self.name)
        if 400 <= status < 500:
            return ProviderRequestError(message, provider=self.name)
        return TransientError(message, provider=self.name)

    def _host_name(self) -> str:
        if self._host is None:
            api = self._client()
            with self._engine("info"):
                self._host = str(api.info().get("Name") or "") or self.shown_url
        return self._host

    # ------------------------------------------------------------------ reads

    def _owned(self) -> list[dict[str, Any]]:
        """Our containers at the engine, any state: listed by the label key, kept by owner."""
        api = self._client()
        with self._engine("list containers"):
            found = api.containers(all=True, filters={"label": LABEL_KEY})
        return [c for c in found if self.owns(_view(c)[1].get(LABEL_KEY))]

    def _inspect(self, container_id: str) -> dict[str, Any] | None:
        api = self._client()
        with self._engine(f"inspect {container_id[:64]}"):
            try:
                attrs: dict[str, Any] = api.inspect_container(container_id)
            except docker.errors.NotFound:
                return None
        return attrs

    def _machine(self, attrs: Mapping[str, Any]) -> ProviderMachine:
        container_id, labels, state = _view(attrs)
        try:
            price: float | None = float(labels.get(PRICE_KEY, ""))
        except ValueError:
            price = None
        return ProviderMachine(
            provider_instance_id=container_id,
            label=labels.get(LABEL_KEY, ""),
            status=_STATUS.get(state, MachineStatus.STARTING),
            raw_status=state or None,
            price_per_hour=price,
            host_id=self._host_name(),
            gpu=labels.get(GPU_KEY) or None,
            storage_price_per_hour=0.0,  # the team's own engine bills nothing
        )

    def get(self, provider_instance_id: str) -> ProviderMachine | None:
        if not _ID_RE.fullmatch(provider_instance_id):
            return None
        attrs = self._inspect(provider_instance_id)
        if attrs is None or not self.owns(_view(attrs)[1].get(LABEL_KEY)):
            return None
        return self._machine(attrs)

    def list_owned(self) -> list[ProviderMachine]:
        return [self._machine(c) for c in self._owned()]

    def find_by_label(self, label: str) -> ProviderMachine | None:
        found = self._labelled(label)
        return self._machine(found) if found is not None else None

    def _labelled(self, label: str) -> dict[str, Any] | None:
        if not self.owns(label):
            return None
        api = self._client()
        with self._engine(f"find {label}"):
            found = api.containers(all=True, filters={"label": f"{LABEL_KEY}={label}"})
        for c in found:
            if _view(c)[1].get(LABEL_KEY) == label:
                return dict(c)
        return None

    # ------------------------------------------------------------------ offers

    def _held_gpus(self, containers: Iterable[Mapping[str, Any]]) -> set[str]:
        return {g for c in containers if _view(c)[2] not in _RESTING for g in _gpu_ids(_view(c)[1])}

    def find_offers(self, spec: InstanceSpec) -> list[Offer]:
        cfg = self.config
        if cfg.price_per_hour > spec.max_price_per_hour:
            return []
        if cfg.gpu is not None and not any(_same_gpu(cfg.gpu, g) for g in spec.gpus):
            return []
        if cfg.gpus and spec.gpu_count > cfg.gpus:
            return []
        owned = self._owned()
        if len(owned) >= cfg.max_machines:
            return []
        details: dict[str, Any] = {
            "engine": self.shown_url,
            "containers": f"{len(owned)} of {cfg.max_machines}",
        }
        if cfg.gpus:
            free = cfg.gpus - len(self._held_gpus(owned))
            if free < spec.gpu_count:
                return []
            details["gpus"] = f"{free} of {cfg.gpus} free"
        else:
            details["gpus"] = (
                "none: gpus is 0 in the provider's options, so no GPU is asked of the engine "
                "and the container runs without one"
            )
        host = self._host_name()
        return [
            Offer(
                provider=self.name,
                offer_id=f"container:{host}",
                gpu=cfg.gpu or spec.gpus[0],
                gpu_count=spec.gpu_count if cfg.gpus else 0,
                price_per_hour=cfg.price_per_hour,
                spec=spec,
                host_id=host,
                details=details,
            )
        ]

    # ------------------------------------------------------------------ create

    def create(self, offer: Offer, launch: LaunchSpec) -> ProviderMachine:
        self._check_launch(launch)
        with self.redacting(launch.secrets):
            return self._create(offer, launch)

    def _command(self) -> tuple[list[str] | None, list[str] | None]:
        """(entrypoint, command): `command` replaces both the image's entry point and command;
        a string runs through /bin/sh -c, as in a Dockerfile's shell form."""
        command = self.config.command
        if command is None:
            return None, None
        if isinstance(command, str):
            return ["/bin/sh", "-c"], [command]
        return [command[0]], list(command[1:])

    def _create(self, offer: Offer, launch: LaunchSpec) -> ProviderMachine:
        image = offer.spec.image
        if not image:
            raise ProviderRequestError(
                f"{self.name}: the queue's instance names no image; set autoscale.instance."
                "image to the worker image (deploy/worker/Dockerfile)",
                provider=self.name,
            )
        existing = self._labelled(launch.label)
        if existing is not None:  # a redelivered launch: never a second container
            return self._started(existing["Id"])
        owned = self._owned()
        if len(owned) >= self.config.max_machines:
            raise CapacityError(
                f"{self.name}: {len(owned)} containers of ours already run on the engine "
                f"(max_machines {self.config.max_machines})",
                provider=self.name,
            )
        gpu_ids: list[str] = []
        if self.config.gpus:
            held = self._held_gpus(owned)
            free = [str(i) for i in range(self.config.gpus) if str(i) not in held]
            if len(free) < offer.spec.gpu_count:
                raise CapacityError(
                    f"{self.name}: {len(free)} of the engine's {self.config.gpus} GPUs are free, "
                    f"{offer.spec.gpu_count} wanted",
                    provider=self.name,
                )
            gpu_ids = free[: offer.spec.gpu_count]
        api = self._client()
        entrypoint, command = self._command()
        with self._engine("prepare"):
            host_config = api.create_host_config(
                network_mode=self._network_mode(),
                restart_policy={"Name": "no"},
                init=self.config.init,
                device_requests=(
                    [DeviceRequest(device_ids=gpu_ids, capabilities=[["gpu"]])] if gpu_ids else None
                ),
            )
        labels = {
            LABEL_KEY: launch.label,
            GPU_IDS_KEY: ",".join(gpu_ids),
            GPU_KEY: offer.gpu if gpu_ids else "",
            PRICE_KEY: repr(float(offer.price_per_hour)),
        }
        try:
            created = api.create_container(
                image,
                command=command,
                entrypoint=entrypoint,
                name=launch.label,
                labels=labels,
                # The launch's environment and nothing of ours: no provider key, vault key or
                # database URL of the autoscaler, and no proxy settings of ~/.docker.
                environment=dict(launch.env),
                detach=True,
                host_config=host_config,
                use_config_proxy=False,
            )
        except docker.errors.APIError as exc:
            # Podman answers a name already taken with 500, Docker with 409: whatever the
            # status, a container with our label means the launch exists already.
            found = self._labelled(launch.label)
            if found is not None:
                return self._started(found["Id"])
            if isinstance(exc, docker.errors.ImageNotFound):
                raise ProviderRequestError(
                    f"{self.name}: the engine at {self.shown_url} has no image {image!r}; build "
                    f"it there (bash scripts/images.sh) or pull it (docker pull {image}), or fix "
                    "autoscale.instance.image",
                    provider=self.name,
                ) from None
            if exc.status_code == 409 or "already in use" in str(exc.explanation or ""):
                raise ProviderRequestError(
                    f"{self.name}: the name {launch.label} is taken on the engine by a "
                    "container without our label; it is left alone: remove or rename it",
                    provider=self.name,
                ) from None
            raise self._refused(exc, f"create {launch.label}") from None
        except requests.exceptions.RequestException as exc:
            # The request was sent: the container may exist. Find it by its label.
            found_machine = find_after_ambiguous_create(
                self,
                launch.label,
                self._scrub(_cause(exc)),
                attempts=self.lookup_attempts,
                delay=self.lookup_delay,
                sleep=self._sleep,
            )
            return self._started(found_machine.provider_instance_id)
        except docker.errors.DockerException as exc:  # refused by the SDK before sending
            raise ProviderRequestError(
                self._scrub(f"{self.name}: create {launch.label}: {_cause(exc)}"),
                provider=self.name,
            ) from None
        log.info(
            "%s: created container %s for %s (GPUs: %s)",
            self.name,
            str(created["Id"])[:12],
            launch.label,
            ",".join(gpu_ids) or "none",
        )
        return self._started(str(created["Id"]))

    def _started(self, container_id: str) -> ProviderMachine:
        """Our container, started if it was only created — once the engine is seen to have
        kept its GPU request and no earlier container of ours holds its place or GPUs."""
        attrs = self._inspect(container_id)
        if attrs is None:
            raise TransientError(
                f"{self.name}: container {container_id[:12]} went away while being started; "
                "nothing of it is left",
                provider=self.name,
            )
        _, labels, state = _view(attrs)
        if not self.owns(labels.get(LABEL_KEY)):
            raise NotOwnedError(
                f"{self.name}: container {container_id[:12]} is not ours", provider=self.name
            )
        if state not in ("created", "configured"):
            return self._machine(attrs)
        label = labels[LABEL_KEY]
        gpu_ids = _gpu_ids(labels)
        if gpu_ids and not (attrs.get("HostConfig") or {}).get("DeviceRequests"):
            self._discard(container_id)
            why = (
                "Podman's Docker-compatible API ignores GPU device requests"
                if self.is_podman
                else "the engine does not support GPU device requests"
            )
            raise ProviderRequestError(
                f"{self.name}: {self._engine_name} at {self.shown_url} accepted container "
                f"{label} but dropped its GPU request ({why}); the container was removed. Run "
                "GPU workers on Docker Engine with the NVIDIA Container Toolkit, or set gpus: 0 "
                "for CPU-only containers",
                provider=self.name,
            )
        clash = self._clash(attrs)
        if clash:
            self._discard(container_id)
            raise CapacityError(f"{self.name}: {clash}; {label} backed off", provider=self.name)
        api = self._client()
        try:
            api.start(container_id)
        except docker.errors.APIError as exc:
            self._discard(container_id)
            hint = (
                " If the engine cannot give containers GPUs, install the NVIDIA Container "
                "Toolkit and restart the engine, or set gpus: 0 for CPU-only containers."
                if gpu_ids
                else ""
            )
            raise ProviderRequestError(
                f"{self._refused(exc, f'start {label}')}; the container was removed.{hint}",
                provider=self.name,
            ) from None
        except _UNREACHABLE as exc:
            # Left created: a retry of this launch finds it by its label and starts it.
            raise self._unreachable(exc, f"start {label}") from None
        log.info("%s: started container %s (%s)", self.name, container_id[:12], label)
        started = self._inspect(container_id)
        return self._machine(started if started is not None else attrs)

    def _clash(self, attrs: Mapping[str, Any]) -> str | None:
        """Why this just-made container must give way to one of ours made before it (two
        creates racing on one engine), if it must: no room left, or a GPU already taken."""
        my_id, labels, _ = _view(attrs)
        mine = (_created_ns(str(attrs.get("Created") or "")) or 0, my_id)
        earlier = []
        for other in self._owned():
            other_id = _view(other)[0]
            if other_id == my_id:
                continue
            full = self._inspect(other_id)
            if full is None:
                continue
            stamp = _created_ns(str(full.get("Created") or ""))
            if stamp is None:
                stamp = int(other.get("Created") or 0) * 1_000_000_000
            if (stamp, other_id) < mine:
                earlier.append(full)
        if len(earlier) >= self.config.max_machines:
            return f"max_machines ({self.config.max_machines}) reached meanwhile"
        taken = self._held_gpus(earlier) & set(_gpu_ids(labels))
        if taken:
            return f"GPU {','.join(sorted(taken))} was taken meanwhile"
        return None

    def _discard(self, container_id: str) -> None:
        """Remove a container of ours that must not run (half made); best effort, logged."""
        try:
            api = self._client()
            with (
                self._engine(f"remove {container_id[:12]}"),
                contextlib.suppress(docker.errors.NotFound),
            ):
                api.remove_container(container_id, v=True, force=True)
        except ProviderError as exc:
            log.warning("%s: could not remove container %s: %s", self.name, container_id, exc)

    # ------------------------------------------------------------------ destroy, stop, start

    def _ours(self, provider_instance_id: str) -> dict[str, Any] | None:
        """The container if it exists; NotOwnedError when it is not ours."""
        if not _ID_RE.fullmatch(provider_instance_id):
            return None  # not a container id this provider ever handed out
        attrs = self._inspect(provider_instance_id)
        if attrs is None:
            return None
        if not self.owns(_view(attrs)[1].get(LABEL_KEY)):
            raise NotOwnedError(
                f"{self.name}: container {provider_instance_id[:64]} was not created by this "
                "installation; it is left alone",
                provider=self.name,
            )
        return attrs

    def destroy(self, provider_instance_id: str) -> None:
        """SIGTERM (the image's stop signal), SIGKILL after `grace` seconds, then remove the
        container and its anonymous volumes. Already gone = success."""
        attrs = self._ours(provider_instance_id)
        if attrs is None:
            return
        container_id, labels, state = _view(attrs)
        api = self._client()
        label = labels.get(LABEL_KEY)
        with self._engine(f"stop {label}"):
            try:
                if state == "paused":  # frozen processes get no SIGTERM: thaw them first
                    api.unpause(container_id)
                api.stop(container_id, timeout=max(0, math.ceil(self.grace)))
            except docker.errors.NotFound:
                return
            except docker.errors.APIError as exc:  # the forced removal below still kills it
                log.warning("%s: stop of %s failed (%s); removing it", self.name, label, exc)
        with self._engine(f"remove {label}"):
            try:
                api.remove_container(container_id, v=True, force=True)
            except docker.errors.NotFound:
                pass
            except docker.errors.APIError as exc:
                if exc.status_code != 409:  # 409: a removal already in progress
                    raise
        log.info("%s: removed container %s (%s)", self.name, container_id[:12], label)

    def stop(self, provider_instance_id: str) -> None:
        """Stop the container (SIGTERM, SIGKILL after `grace`), keeping its filesystem."""
        attrs = self._ours(provider_instance_id)
        if attrs is None:
            return  # gone: not running, as asked
        container_id, labels, state = _view(attrs)
        if state in _RESTING:
            return  # stopped already, or dead
        api = self._client()
        with self._engine(f"stop {labels.get(LABEL_KEY)}"):
            try:
                if state == "paused":  # frozen processes get no SIGTERM: thaw them first
                    api.unpause(container_id)
                api.stop(container_id, timeout=max(0, math.ceil(self.grace)))
            except docker.errors.NotFound:
                return

    def start(self, provider_instance_id: str) -> None:
        """Start a stopped container of ours again, unless another of ours took its GPUs."""
        attrs = self._ours(provider_instance_id)
        if attrs is None:
            raise self._resume_refused(provider_instance_id, "it does not exist any more")
        container_id, labels, state = _view(attrs)
        label = labels.get(LABEL_KEY)
        api = self._client()
        if state in ("dead", "removing"):
            raise self._resume_refused(label, f"the engine has it {state}")
        if state == "paused":
            with self._engine(f"unpause {label}"):
                api.unpause(container_id)
            return
        if state not in _RESTING:
            return  # running, or on its way
        mine = set(_gpu_ids(labels))
        others = [c for c in self._owned() if _view(c)[0] != container_id]
        taken = self._held_gpus(others) & mine
        if taken:
            raise self._resume_refused(
                label, f"GPU {','.join(sorted(taken))} is held by another container of ours now"
            )
        with self._engine(f"start {label}"):
            try:
                api.start(container_id)
            except docker.errors.NotFound:
                raise self._resume_refused(label, "it went away while starting") from None

    def _resume_refused(self, which: str | None, why: str) -> ResumeRefusedError:
        return ResumeRefusedError(
            f"{self.name}: container {(which or '?')[:64]} cannot be resumed: {why}; create a "
            "new machine",
            provider=self.name,
        )


def build(name: str, config: ContainerOptions, ctx: Build) -> ContainerProvider:
    """The container provider's factory (`providers.registry.FACTORIES`): nothing is called
    before the first operation."""
    return ContainerProvider(name, config, ctx.installation_id, timeout=float(ctx.timeout[1]))
