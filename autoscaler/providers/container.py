"""The container provider: workers as containers of the queue's image on a Docker or Podman
engine the team runs itself (its own GPU servers), through the Docker Engine API that both serve.
Its engine calls are `container_engine`'s; what a container is made of (labels, state words,
GPU ids, network, command) is `container_spec`'s. This module is the provider: offers, create,
reads, destroy, stop and start.

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
API): `container_spec.check_network`; the engine is reached by its unix socket, or over TCP with
verified TLS only: `container_engine.endpoint`.

The engine does not bill: `price_per_hour` is what the operators count a container as.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import docker.errors
import requests
from docker.types import DeviceRequest

from autoscaler.config.machine_specs import InstanceSpec
from autoscaler.config.provider_options import ContainerOptions
from autoscaler.providers.base import (
    CapacityError,
    LaunchSpec,
    NotOwnedError,
    Offer,
    Provider,
    ProviderBuild,
    ProviderError,
    ProviderMachine,
    ProviderRequestError,
    ResumeRefusedError,
    TransientError,
    find_after_ambiguous_create,
)
from autoscaler.providers.container_engine import UNREACHABLE, Engine, cause
from autoscaler.providers.container_spec import (
    ID_RE,
    LABEL_KEY,
    RESTING,
    check_network,
    created_ns,
    entrypoint_and_command,
    gpu_ids,
    held_gpus,
    labels_for,
    machine,
    network_mode,
    same_gpu,
    view,
)

log = logging.getLogger("autoscaler.providers.container")


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
        self.engine = Engine(
            name, config, os.environ if environ is None else environ, timeout=timeout
        )
        check_network(name, config)
        self.url = self.engine.url
        self.shown_url = self.engine.shown_url

    def __repr__(self) -> str:
        return f"ContainerProvider(name={self.name!r}, url={self.shown_url})"

    def redacting(self, secrets: Iterable[str]) -> contextlib.AbstractContextManager[None]:
        """Scrub a launch's secrets (its worker token) from what this provider says meanwhile:
        an engine's error may quote the create request, environment included."""
        return self.engine.redacting(secrets)

    # ------------------------------------------------------------------ reads

    def _owned(self) -> list[dict[str, Any]]:
        """Our containers at the engine, any state: listed by the label key, kept by owner."""
        api = self.engine.client()
        with self.engine.call("list containers"):
            found = api.containers(all=True, filters={"label": LABEL_KEY})
        return [c for c in found if self.owns(view(c)[1].get(LABEL_KEY))]

    def _machine(self, attrs: Mapping[str, Any]) -> ProviderMachine:
        return machine(attrs, self.engine.host_name())

    def get(self, provider_instance_id: str) -> ProviderMachine | None:
        if not ID_RE.fullmatch(provider_instance_id):
            return None
        attrs = self.engine.inspect(provider_instance_id)
        if attrs is None or not self.owns(view(attrs)[1].get(LABEL_KEY)):
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
        api = self.engine.client()
        with self.engine.call(f"find {label}"):
            found = api.containers(all=True, filters={"label": f"{LABEL_KEY}={label}"})
        for c in found:
            if view(c)[1].get(LABEL_KEY) == label:
                return dict(c)
        return None

    # ------------------------------------------------------------------ offers

    def find_offers(self, spec: InstanceSpec) -> list[Offer]:
        cfg = self.config
        if cfg.price_per_hour > spec.max_price_per_hour:
            return []
        if cfg.gpu is not None and not any(same_gpu(cfg.gpu, g) for g in spec.gpus):
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
            free = cfg.gpus - len(held_gpus(owned))
            if free < spec.gpu_count:
                return []
            details["gpus"] = f"{free} of {cfg.gpus} free"
        else:
            details["gpus"] = (
                "none: gpus is 0 in the provider's options, so no GPU is asked of the engine "
                "and the container runs without one"
            )
        host = self.engine.host_name()
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
        devices: list[str] = []
        if self.config.gpus:
            held = held_gpus(owned)
            free = [str(i) for i in range(self.config.gpus) if str(i) not in held]
            if len(free) < offer.spec.gpu_count:
                raise CapacityError(
                    f"{self.name}: {len(free)} of the engine's {self.config.gpus} GPUs are free, "
                    f"{offer.spec.gpu_count} wanted",
                    provider=self.name,
                )
            devices = free[: offer.spec.gpu_count]
        api = self.engine.client()
        entrypoint, command = entrypoint_and_command(self.config)
        with self.engine.call("prepare"):
            host_config = api.create_host_config(
                network_mode=network_mode(self.config, podman=self.engine.is_podman),
                restart_policy={"Name": "no"},
                init=self.config.init,
                device_requests=(
                    [DeviceRequest(device_ids=devices, capabilities=[["gpu"]])] if devices else None
                ),
            )
        labels = labels_for(launch.label, devices, offer.gpu, offer.price_per_hour)
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
            raise self.engine.refused(exc, f"create {launch.label}") from None
        except requests.exceptions.RequestException as exc:
            # The request was sent: the container may exist. Find it by its label.
            found_machine = find_after_ambiguous_create(
                self,
                launch.label,
                self.engine.scrub(cause(exc)),
                attempts=self.lookup_attempts,
                delay=self.lookup_delay,
                sleep=self._sleep,
            )
            return self._started(found_machine.provider_instance_id)
        except docker.errors.DockerException as exc:  # refused by the SDK before sending
            raise ProviderRequestError(
                self.engine.scrub(f"{self.name}: create {launch.label}: {cause(exc)}"),
                provider=self.name,
            ) from None
        log.info(
            "%s: created container %s for %s (GPUs: %s)",
            self.name,
            str(created["Id"])[:12],
            launch.label,
            ",".join(devices) or "none",
        )
        return self._started(str(created["Id"]))

    def _started(self, container_id: str) -> ProviderMachine:
        """Our container, started if it was only created — once the engine is seen to have
        kept its GPU request and no earlier container of ours holds its place or GPUs."""
        attrs = self.engine.inspect(container_id)
        if attrs is None:
            raise TransientError(
                f"{self.name}: container {container_id[:12]} went away while being started; "
                "nothing of it is left",
                provider=self.name,
            )
        _, labels, state = view(attrs)
        if not self.owns(labels.get(LABEL_KEY)):
            raise NotOwnedError(
                f"{self.name}: container {container_id[:12]} is not ours", provider=self.name
            )
        if state not in ("created", "configured"):
            return self._machine(attrs)
        label = labels[LABEL_KEY]
        devices = gpu_ids(labels)
        if devices and not (attrs.get("HostConfig") or {}).get("DeviceRequests"):
            self._discard(container_id)
            why = (
                "Podman's Docker-compatible API ignores GPU device requests"
                if self.engine.is_podman
                else "the engine does not support GPU device requests"
            )
            raise ProviderRequestError(
                f"{self.name}: {self.engine.name} at {self.shown_url} accepted container "
                f"{label} but dropped its GPU request ({why}); the container was removed. Run "
                "GPU workers on Docker Engine with the NVIDIA Container Toolkit, or set gpus: 0 "
                "for CPU-only containers",
                provider=self.name,
            )
        clash = self._clash(attrs)
        if clash:
            self._discard(container_id)
            raise CapacityError(f"{self.name}: {clash}; {label} backed off", provider=self.name)
        api = self.engine.client()
        try:
            api.start(container_id)
        except docker.errors.APIError as exc:
            self._discard(container_id)
            hint = (
                " If the engine cannot give containers GPUs, install the NVIDIA Container "
                "Toolkit and restart the engine, or set gpus: 0 for CPU-only containers."
                if devices
                else ""
            )
            raise ProviderRequestError(
                f"{self.engine.refused(exc, f'start {label}')}; the container was removed.{hint}",
                provider=self.name,
            ) from None
        except UNREACHABLE as exc:
            # Left created: a retry of this launch finds it by its label and starts it.
            raise self.engine.unreachable(exc, f"start {label}") from None
        log.info("%s: started container %s (%s)", self.name, container_id[:12], label)
        started = self.engine.inspect(container_id)
        return self._machine(started if started is not None else attrs)

    def _clash(self, attrs: Mapping[str, Any]) -> str | None:
        """Why this just-made container must give way to one of ours made before it (two
        creates racing on one engine), if it must: no room left, or a GPU already taken."""
        my_id, labels, _ = view(attrs)
        mine = (created_ns(str(attrs.get("Created") or "")) or 0, my_id)
        earlier = []
        for other in self._owned():
            other_id = view(other)[0]
            if other_id == my_id:
                continue
            full = self.engine.inspect(other_id)
            if full is None:
                continue
            stamp = created_ns(str(full.get("Created") or ""))
            if stamp is None:
                stamp = int(other.get("Created") or 0) * 1_000_000_000
            if (stamp, other_id) < mine:
                earlier.append(full)
        if len(earlier) >= self.config.max_machines:
            return f"max_machines ({self.config.max_machines}) reached meanwhile"
        taken = held_gpus(earlier) & set(gpu_ids(labels))
        if taken:
            return f"GPU {','.join(sorted(taken))} was taken meanwhile"
        return None

    def _discard(self, container_id: str) -> None:
        """Remove a container of ours that must not run (half made); best effort, logged."""
        try:
            api = self.engine.client()
            with (
                self.engine.call(f"remove {container_id[:12]}"),
                contextlib.suppress(docker.errors.NotFound),
            ):
                api.remove_container(container_id, v=True, force=True)
        except ProviderError as exc:
            log.warning("%s: could not remove container %s: %s", self.name, container_id, exc)

    # ------------------------------------------------------------------ destroy, stop, start

    def _ours(self, provider_instance_id: str) -> dict[str, Any] | None:
        """The container if it exists; NotOwnedError when it is not ours."""
        if not ID_RE.fullmatch(provider_instance_id):
            return None  # not a container id this provider ever handed out
        attrs = self.engine.inspect(provider_instance_id)
        if attrs is None:
            return None
        if not self.owns(view(attrs)[1].get(LABEL_KEY)):
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
        container_id, labels, state = view(attrs)
        api = self.engine.client()
        label = labels.get(LABEL_KEY)
        with self.engine.call(f"stop {label}"):
            try:
                if state == "paused":  # frozen processes get no SIGTERM: thaw them first
                    api.unpause(container_id)
                api.stop(container_id, timeout=max(0, math.ceil(self.grace)))
            except docker.errors.NotFound:
                return
            except docker.errors.APIError as exc:  # the forced removal below still kills it
                log.warning("%s: stop of %s failed (%s); removing it", self.name, label, exc)
        with self.engine.call(f"remove {label}"):
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
        container_id, labels, state = view(attrs)
        if state in RESTING:
            return  # stopped already, or dead
        api = self.engine.client()
        with self.engine.call(f"stop {labels.get(LABEL_KEY)}"):
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
        container_id, labels, state = view(attrs)
        label = labels.get(LABEL_KEY)
        api = self.engine.client()
        if state in ("dead", "removing"):
            raise self._resume_refused(label, f"the engine has it {state}")
        if state == "paused":
            with self.engine.call(f"unpause {label}"):
                api.unpause(container_id)
            return
        if state not in RESTING:
            return  # running, or on its way
        mine = set(gpu_ids(labels))
        others = [c for c in self._owned() if view(c)[0] != container_id]
        taken = held_gpus(others) & mine
        if taken:
            raise self._resume_refused(
                label, f"GPU {','.join(sorted(taken))} is held by another container of ours now"
            )
        with self.engine.call(f"start {label}"):
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


def build(name: str, config: ContainerOptions, ctx: ProviderBuild) -> ContainerProvider:
    """The container provider's factory (`providers.registry.FACTORIES`): nothing is called
    before the first operation."""
    return ContainerProvider(name, config, ctx.installation_id, timeout=float(ctx.timeout[1]))
