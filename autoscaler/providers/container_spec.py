"""What a container of the container provider (`providers.container`) is made of and how one is
read back: its labels (the ownership label, its GPU ids, GPU and price), the engine's state words,
its network and its command. Pure functions of the options and the engine's answers; nothing here
calls the engine.

GPU device ids are recorded in a label (`GPU_IDS_KEY`) because Docker's `count=n` would hand every
container the same first n GPUs. A container is walled off from the host's loopback: it runs on
the engine's default bridge unless `network` names another network, and `network: host` needs
`unsafe_host_network: true`.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any

from autoscaler.config.gpus import canonical
from autoscaler.config.provider_options import (
    HOST_NETWORK_OPT_IN,
    ContainerOptions,
    is_host_network,
)
from autoscaler.providers.base import MachineStatus, ProviderMachine, ProviderRequestError

log = logging.getLogger("autoscaler.providers.container")

LABEL_KEY = "io.gpu-queue-autoscaler.label"
"""The container label holding the ownership label (`asg-<installation>-<launch>`)."""
GPU_IDS_KEY = "io.gpu-queue-autoscaler.gpu-ids"
"""The GPU device ids given to the container, comma-separated; empty for none."""
GPU_KEY = "io.gpu-queue-autoscaler.gpu"
PRICE_KEY = "io.gpu-queue-autoscaler.price-per-hour"

STATUS = {
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
RESTING = frozenset({"exited", "stopped", "dead", "removing"})
"""States in which a container holds no GPU (its processes are gone)."""
ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")
_CREATED_RE = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d{1,9})\d*)?(Z|[+-]\d\d:\d\d)$")


def same_gpu(a: str, b: str) -> bool:
    """One GPU: by the table's spellings ("NVIDIA GeForce RTX 4090" is "RTX 4090"), else by
    the names written, whatever their case and spaces (the team's own hardware may be any)."""
    if canonical(a) == canonical(b):
        return True
    return " ".join(a.lower().split()) == " ".join(b.lower().split())


def gpu_ids(labels: Mapping[str, str]) -> list[str]:
    return [g for g in (labels.get(GPU_IDS_KEY) or "").split(",") if g]


def held_gpus(containers: Iterable[Mapping[str, Any]]) -> set[str]:
    """The GPU ids the containers that are not resting hold."""
    return {g for c in containers if view(c)[2] not in RESTING for g in gpu_ids(view(c)[1])}


def created_ns(text: str) -> int | None:
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


def view(attrs: Mapping[str, Any]) -> tuple[str, dict[str, str], str]:
    """(id, labels, state) of a container, from the list's summary or from an inspect."""
    state = attrs.get("State")
    if isinstance(state, dict):  # inspect
        labels = (attrs.get("Config") or {}).get("Labels") or {}
        status = str(state.get("Status") or "")
    else:  # list
        labels = attrs.get("Labels") or {}
        status = str(state or "")
    return str(attrs.get("Id") or ""), dict(labels), status.lower()


def machine(attrs: Mapping[str, Any], host: str) -> ProviderMachine:
    """The provider's view of a container (from the list's summary or an inspect) on `host`."""
    container_id, labels, state = view(attrs)
    try:
        price: float | None = float(labels.get(PRICE_KEY, ""))
    except ValueError:
        price = None
    return ProviderMachine(
        provider_instance_id=container_id,
        label=labels.get(LABEL_KEY, ""),
        status=STATUS.get(state, MachineStatus.STARTING),
        raw_status=state or None,
        price_per_hour=price,
        host_id=host,
        gpu=labels.get(GPU_KEY) or None,
        storage_price_per_hour=0.0,  # the team's own engine bills nothing
    )


def labels_for(label: str, gpu_ids: list[str], gpu: str, price_per_hour: float) -> dict[str, str]:
    """The labels a new container carries: its launch's label, its GPUs and its price."""
    return {
        LABEL_KEY: label,
        GPU_IDS_KEY: ",".join(gpu_ids),
        GPU_KEY: gpu if gpu_ids else "",
        PRICE_KEY: repr(float(price_per_hour)),
    }


def check_network(provider: str, config: ContainerOptions) -> None:
    """Containers are walled off from the host's loopback unless the operators opted out
    by name (the config model refuses `network: host` without it; this holds for a
    config made any other way)."""
    if not is_host_network(config.network):
        return
    if not config.unsafe_host_network:
        raise ProviderRequestError(
            f"provider {provider!r}: network host would let every container reach what "
            "listens on this host's loopback (the broker, the database, the engine's API); "
            f"leave network out (the engine's default bridge), or set {HOST_NETWORK_OPT_IN}: "
            "true on a development box whose services listen on loopback alone",
            provider=provider,
        )
    log.warning(
        "%s: %s is set: containers run on the host's own network and reach every service "
        "on its loopback (the broker, the database, the engine's API); use it on a "
        "development box only",
        provider,
        HOST_NETWORK_OPT_IN,
    )


def network_mode(config: ContainerOptions, *, podman: bool) -> str:
    """The container's network as the engine is asked for it. `bridge` is the engine's
    default bridge network (Docker's docker0; Podman's `podman` network, which rootless
    Podman runs through slirp4netns or pasta without mapping the host's loopback): a
    container on it has a loopback of its own and reaches the host only at the host's
    other addresses. Podman's `slirp4netns` is asked never to reach the host's loopback,
    whatever the engine's containers.conf says (`allow_host_loopback`)."""
    network = config.network
    if network == "slirp4netns" and podman:
        return "slirp4netns:allow_host_loopback=false"
    return network


def entrypoint_and_command(
    config: ContainerOptions,
) -> tuple[list[str] | None, list[str] | None]:
    """(entrypoint, command): `command` replaces both the image's entry point and command;
    a string runs through /bin/sh -c, as in a Dockerfile's shell form."""
    command = config.command
    if command is None:
        return None, None
    if isinstance(command, str):
        return ["/bin/sh", "-c"], [command]
    return [command[0]], list(command[1:])
