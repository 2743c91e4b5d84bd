"""RunPod through REST v2 (`/v2/...`, Bearer key); its OpenAPI document is in tests/fakes/specs/.

- Offers come from the GPU catalog with live availability and list price
  (`GET /v2/catalog/gpus?include=AVAILABILITY&product=POD`). The configured GPU types are
  tried in order of preference; a type with no stock (in the configured data centers, if any)
  or whose price for the requested GPU count is above the cap is skipped.
- A create takes one GPU type; the pod's `name` is the launch's unique ownership label. After a
  5xx or a timeout the pod may exist and bill: it is looked up by name before anything else.
  A refusal whose detail says no instances are available is a capacity error, whatever its code.
- `GET /v2/pods` answers every pod of the account in one response (the v2 spec has no paging
  parameters); it is read whole and filtered by label.
- Terminate is `DELETE /v2/pods/{id}`; 404 means already gone.
- Stop and start are `POST /v2/pods/{id}/action` (`{"action": "stop"|"start"}`), after the same
  ownership check as terminate. A stopped pod is `EXITED` (its volume disk kept, its container
  disk erased: with `volume_gb` the pod gets a volume and the agent its work folder there). A
  409 (action not allowed in the pod's status), a 5xx or a lost answer is settled by reading the
  pod again: both actions are idempotent in effect. A start that comes back without a GPU (the
  host's GPU was rented meanwhile) is stopped again at once, so no worker runs without its GPU,
  and refused (`ResumeRefusedError`): the caller destroys it.
"""

from __future__ import annotations

import logging
import re
from typing import Any, Unpack

import requests

from autoscaler.config.gpus import lookup
from autoscaler.config.machine_specs import InstanceSpec
from autoscaler.config.provider_options import HOURS_PER_MONTH, RunPodOptions
from autoscaler.providers.base import (
    WORKDIR_ENV,
    AmbiguousCreateError,
    CapacityError,
    LaunchSpec,
    MachineStatus,
    NotOwnedError,
    Offer,
    ProviderBuild,
    ProviderError,
    ProviderMachine,
    ProviderRequestError,
    ResumeRefusedError,
    TransientError,
)
from autoscaler.providers.http import json_body
from autoscaler.providers.keyed_http import ApiOptions, ApiProvider

log = logging.getLogger("autoscaler.providers.runpod")

_STATUS = {
    "PROVISIONING": MachineStatus.STARTING,
    "STARTING": MachineStatus.STARTING,
    "RUNNING": MachineStatus.RUNNING,
    "EXITED": MachineStatus.STOPPED,  # stopped, volume kept: `start` resumes it
    "ERROR": MachineStatus.DEAD,  # "unrecoverable"
    "TERMINATED": MachineStatus.GONE,
}

_ACTIVE = frozenset({"PROVISIONING", "STARTING", "RUNNING"})
"""Statuses in which a pod holds (or is getting) its GPU: `stop` is allowed, `start` is not."""
_RESTING = frozenset({"EXITED", "ERROR"})

_CAPACITY_RE = re.compile(
    r"no (longer )?(any )?instances? (are )?(currently )?available"
    r"|not enough (free )?(gpus?|capacity|resources)"
    r"|insufficient capacity|out of stock|no capacity|capacity (is )?unavailable",
    re.IGNORECASE,
)


def _problem(resp: requests.Response) -> str:
    """title: detail (errors...) of an RFC 9457 problem body, or ''."""
    body = json_body(resp)
    if not isinstance(body, dict):
        return ""
    parts = [str(body.get("title") or ""), str(body.get("detail") or "")]
    errors = body.get("errors")
    if isinstance(errors, list) and errors:
        parts.append("; ".join(str(e) for e in errors[:5]))
    return ": ".join(p for p in parts if p)


class RunPodProvider(ApiProvider):
    kind = "runpod"
    display = "RunPod"

    def __init__(
        self,
        name: str,
        config: RunPodOptions,
        api_key: str,
        installation_id: str,
        **options: Unpack[ApiOptions],
    ) -> None:
        """`options`: the HTTP timeout, retry policy and label-lookup settings of `ApiProvider`."""
        super().__init__(name, config.base_url, api_key, installation_id, **options)
        self.config = config

    # ------------------------------------------------------------------ offers

    def find_offers(self, spec: InstanceSpec) -> list[Offer]:
        params = {
            "include": "AVAILABILITY",
            "product": "POD",
            "count": spec.gpu_count,
            "cloud": self.config.cloud_type,
        }
        resp = self._http.request("GET", "/v2/catalog/gpus", params=params)
        self._raise_unexpected(resp, "GET /v2/catalog/gpus")
        body = json_body(resp)
        gpus = body.get("gpus") if isinstance(body, dict) else None
        if not isinstance(gpus, list):
            raise ProviderError(
                f"{self.name}: catalog answer has no 'gpus' list", provider=self.name
            )
        wanted = runpod_ids(self.config.gpu_types or spec.gpus)
        secure = self.config.cloud_type == "SECURE"
        offers: list[Offer] = []
        for want in wanted:
            entry = _match_gpu(gpus, want)
            if entry is None:
                log.info("%s: GPU type %r is not in the catalog; skipped", self.name, want)
                continue
            if not entry.get("secure" if secure else "community", False):
                continue
            availability = self._availability(entry)
            if availability in (None, "NONE"):
                log.info("%s: %s has no stock; skipped", self.name, entry["id"])
                continue
            unit = (entry.get("price") or {}).get("secure" if secure else "community")
            if not isinstance(unit, int | float) or unit <= 0:
                continue
            price = round(float(unit) * spec.gpu_count, 6)
            if price > spec.max_price_per_hour:
                log.info(
                    "%s: %s costs %.3f/h, above the cap %.3f; skipped",
                    self.name,
                    entry["id"],
                    price,
                    spec.max_price_per_hour,
                )
                continue
            offers.append(
                Offer(
                    provider=self.name,
                    offer_id=str(entry["id"]),
                    gpu=str(entry["id"]),
                    gpu_count=spec.gpu_count,
                    price_per_hour=price,
                    spec=spec,
                    details={"availability": availability, "name": entry.get("name")},
                )
            )
        return offers

    def _availability(self, entry: dict[str, Any]) -> str | None:
        if not self.config.data_centers:
            value = entry.get("availability")
            return str(value) if value is not None else None
        levels = [
            str(dc.get("availability"))
            for dc in entry.get("dataCenters") or []
            if dc.get("id") in self.config.data_centers
        ]
        for level in ("HIGH", "MEDIUM", "LOW"):
            if level in levels:
                return level
        return "NONE"

    # ------------------------------------------------------------------ create

    def create(self, offer: Offer, launch: LaunchSpec) -> ProviderMachine:
        self._check_launch(launch)
        spec = offer.spec
        body: dict[str, Any] = {
            "name": launch.label,
            "image": spec.image,
            "gpu": {"id": offer.offer_id, "count": offer.gpu_count},
            "cloud": self.config.cloud_type,
            "disk": spec.disk_gb,
            "env": dict(launch.env),
        }
        if self.config.volume_gb > 0:
            # The only disk a stopped pod keeps: the agent's work folder lives there, so a
            # resumed pod skips the clone and install.
            mount = self.config.volume_mount_path
            body["mounts"] = {"persistent": {"size": self.config.volume_gb, "path": mount}}
            body["env"].setdefault(WORKDIR_ENV, f"{mount.rstrip('/')}/autoscaler")
        if self.config.data_centers:
            body["dataCenterIds"] = list(self.config.data_centers)
        try:
            resp = self._http.request("POST", "/v2/pods", json=body, idempotent=False)
        except AmbiguousCreateError as exc:
            return self._recover(launch.label, str(exc))
        status = resp.status_code
        if status in (200, 201):
            pod = json_body(resp)
            if isinstance(pod, dict) and pod.get("id"):
                log.info("%s: created pod %s (%s)", self.name, pod["id"], launch.label)
                return self._machine(pod)
            return self._recover(launch.label, f"HTTP {status} without a pod in the body")
        problem = self._http.redact(_problem(resp)) or self._http.excerpt(resp)
        if _CAPACITY_RE.search(problem):
            raise CapacityError(
                f"{self.name}: no {offer.offer_id} available (HTTP {status}): {problem}",
                provider=self.name,
            )
        if status >= 500:
            return self._recover(launch.label, f"HTTP {status}: {problem}")
        if status == 404:  # the GPU type (or data center) does not exist (any more)
            raise CapacityError(
                f"{self.name}: {offer.offer_id} refused (HTTP 404): {problem}", provider=self.name
            )
        raise ProviderRequestError(
            f"{self.name}: create refused (HTTP {status}): {problem}", provider=self.name
        )

    # ------------------------------------------------------------------ read

    def list_owned(self) -> list[ProviderMachine]:
        resp = self._http.request("GET", "/v2/pods")
        self._raise_unexpected(resp, "GET /v2/pods")
        body = json_body(resp)
        pods = body.get("pods") if isinstance(body, dict) else None
        if not isinstance(pods, list):
            # Never read a malformed answer as "no machines": that would leak every pod.
            raise ProviderError(
                f"{self.name}: pod list answer has no 'pods' list", provider=self.name
            )
        return [self._machine(p) for p in pods if isinstance(p, dict) and self.owns(p.get("name"))]

    def get(self, provider_instance_id: str) -> ProviderMachine | None:
        pod = self._get_pod(provider_instance_id)
        if pod is None or not self.owns(pod.get("name")):
            return None
        return self._machine(pod)

    def _get_pod(self, pod_id: str) -> dict[str, Any] | None:
        _check_id(pod_id)
        resp = self._http.request("GET", f"/v2/pods/{pod_id}")
        if resp.status_code == 404:
            return None
        self._raise_unexpected(resp, "GET /v2/pods/{id}")
        pod = json_body(resp)
        if not isinstance(pod, dict):
            raise ProviderError(f"{self.name}: pod answer is not an object", provider=self.name)
        if pod.get("status") == "TERMINATED":
            return None
        return pod

    def _owned_pod(self, pod_id: str) -> dict[str, Any] | None:
        """The pod, None when gone; `NotOwnedError` when it is not ours."""
        pod = self._get_pod(pod_id)
        if pod is not None and not self.owns(pod.get("name")):
            raise NotOwnedError(
                f"{self.name}: pod {pod_id} was not created by this installation; it is left alone",
                provider=self.name,
            )
        return pod

    # ------------------------------------------------------------------ destroy

    def destroy(self, provider_instance_id: str) -> None:
        pod = self._owned_pod(provider_instance_id)
        if pod is None:
            return
        resp = self._http.request("DELETE", f"/v2/pods/{provider_instance_id}")
        if resp.status_code in (200, 204, 404):
            log.info("%s: terminated pod %s", self.name, provider_instance_id)
            return
        self._raise_unexpected(resp, "DELETE /v2/pods/{id}")

    # ------------------------------------------------------------------ stop / start

    def stop(self, provider_instance_id: str) -> None:
        pod = self._owned_pod(provider_instance_id)
        if pod is None or pod.get("status") in _RESTING:
            return  # gone, stopped or errored: nothing runs
        resp, why = self._action(provider_instance_id, "stop")
        if resp is not None and resp.status_code == 200:
            log.info("%s: stopping pod %s", self.name, provider_instance_id)
            return
        # 409 (not allowed in its status now), 404, a 5xx or a lost answer: read what happened.
        after = self._get_pod(provider_instance_id)
        if after is None or after.get("status") in _RESTING:
            log.info("%s: pod %s is stopped (%s)", self.name, provider_instance_id, why)
            return
        if resp is None or resp.status_code >= 500:
            raise TransientError(
                f"{self.name}: stop of pod {provider_instance_id} not confirmed ({why}); it still "
                f"reads {after.get('status')}: stop it again",
                provider=self.name,
            )
        raise ProviderRequestError(
            f"{self.name}: stop of pod {provider_instance_id} refused ({why}; locked: "
            f"{after.get('locked')})",
            provider=self.name,
        )

    def start(self, provider_instance_id: str) -> None:
        pod = self._owned_pod(provider_instance_id)
        if pod is None:
            raise self._refused(provider_instance_id, "it is gone")
        status = pod.get("status")
        if status == "ERROR":
            raise self._refused(provider_instance_id, "it is in ERROR (unrecoverable)")
        if status in _ACTIVE:  # already running or starting: check it kept its GPU
            self._check_gpu(pod)
            return
        resp, why = self._action(provider_instance_id, "start")
        if resp is not None and resp.status_code == 200:
            started = json_body(resp)
            if not isinstance(started, dict):
                started = self._get_pod(provider_instance_id)
            if started is None:
                raise self._refused(provider_instance_id, "it went away while starting")
            log.info("%s: starting pod %s", self.name, provider_instance_id)
            self._check_gpu(started)
            return
        if resp is not None and _CAPACITY_RE.search(why):
            raise self._refused(provider_instance_id, why)
        if resp is not None and resp.status_code in (400, 422):
            raise ProviderRequestError(
                f"{self.name}: start of pod {provider_instance_id} refused ({why})",
                provider=self.name,
            )
        after = self._get_pod(provider_instance_id)
        if after is None:
            raise self._refused(provider_instance_id, f"it is gone ({why})")
        if after.get("status") in _ACTIVE:  # it did start (a 409 after a start of ours, too)
            self._check_gpu(after)
            return
        if resp is None or resp.status_code >= 500:
            raise TransientError(
                f"{self.name}: start of pod {provider_instance_id} not confirmed ({why}); it "
                f"still reads {after.get('status')}: start it again",
                provider=self.name,
            )
        raise self._refused(provider_instance_id, why)

    def _action(self, pod_id: str, action: str) -> tuple[requests.Response | None, str]:
        """POST the action: (the answer, what it says), or (None, why) when the answer was lost
        after sending, so the action may have happened. Never retried blind: a caller that did
        not get a 200 reads the pod to know."""
        _check_id(pod_id)
        try:
            resp = self._http.request(
                "POST", f"/v2/pods/{pod_id}/action", json={"action": action}, idempotent=False
            )
        except AmbiguousCreateError as exc:
            return None, f"the answer was lost: {exc}"
        return resp, f"HTTP {resp.status_code}: {self._problem(resp)}"

    def _check_gpu(self, pod: dict[str, Any]) -> None:
        """A started pod without a GPU (its host's GPU was rented meanwhile, and RunPod starts
        it anyway) must not run our worker: it is stopped again, best effort, and refused."""
        if _gpu_count(pod) > 0:
            return
        pod_id = str(pod.get("id"))
        try:
            self._action(pod_id, "stop")
        except ProviderError as exc:  # the caller destroys it anyway
            log.warning("%s: could not stop GPU-less pod %s again: %s", self.name, pod_id, exc)
        raise self._refused(
            pod_id, "it started without a GPU (the host's GPU was rented meanwhile); stopped again"
        )

    def _refused(self, pod_id: str, why: str) -> ResumeRefusedError:
        return ResumeRefusedError(
            f"{self.name}: pod {pod_id} cannot be resumed: {why}; destroy it and rent afresh",
            provider=self.name,
        )

    def _problem(self, resp: requests.Response) -> str:
        return self._http.redact(_problem(resp)) or self._http.excerpt(resp)

    # ------------------------------------------------------------------ helpers

    def _machine(self, pod: dict[str, Any]) -> ProviderMachine:
        raw = pod.get("status")
        gpu = pod.get("gpu") if isinstance(pod.get("gpu"), dict) else {}
        cost = pod.get("cost")
        status = _STATUS.get(str(raw), MachineStatus.STARTING)
        if raw in _ACTIVE and _gpu_count(pod) == 0:
            status = MachineStatus.DEAD  # resumed without its GPU: it never serves the queue
        return ProviderMachine(
            provider_instance_id=str(pod["id"]),
            label=str(pod.get("name") or ""),
            status=status,
            raw_status=str(raw) if raw is not None else None,
            price_per_hour=float(cost) if isinstance(cost, int | float) else None,
            host_id=pod.get("dataCenterId"),
            gpu=(gpu or {}).get("id"),
            storage_price_per_hour=self._storage_price(pod),
        )

    def _storage_price(self, pod: dict[str, Any]) -> float:
        """What the pod bills stopped: its volume disk (the container disk is erased) at the
        configured $/GB-month; none without a volume."""
        mounts = pod.get("mounts")
        persistent = mounts.get("persistent") if isinstance(mounts, dict) else None
        size = persistent.get("size") if isinstance(persistent, dict) else None
        if not isinstance(size, int | float) or size <= 0:
            return 0.0
        return round(float(size) * self.config.storage_price_per_gb_month / HOURS_PER_MONTH, 6)

    def _raise_unexpected(self, resp: requests.Response, what: str) -> None:
        if 200 <= resp.status_code < 300:
            return
        problem = self._http.redact(_problem(resp)) or self._http.excerpt(resp)
        raise ProviderRequestError(
            f"{self.name}: {what} answered HTTP {resp.status_code}: {problem}", provider=self.name
        )


def _gpu_count(pod: dict[str, Any]) -> int:
    """GPUs the pod holds: its `gpu.count` (1 when unsaid, as the spec's default), 0 when it
    has no `gpu` block; a v1-style `gpuCount` wins when present."""
    legacy = pod.get("gpuCount")
    if isinstance(legacy, int):
        return legacy
    gpu = pod.get("gpu")
    if not isinstance(gpu, dict):
        return 0
    count = gpu.get("count", 1)
    return count if isinstance(count, int) else 1


def runpod_ids(names: tuple[str, ...]) -> list[str]:
    """RunPod's GPU ids for `names` (the table's, RunPod's or Vast's spellings), in order, once
    each; a name the table does not know is passed as written (the catalog decides), a GPU the
    table says RunPod does not offer is left out."""
    ids: list[str] = []
    for name in names:
        gpu = lookup(name)
        want = name if gpu is None else gpu.runpod
        if want is not None and want not in ids:
            ids.append(want)
    return ids


def _match_gpu(gpus: list[Any], want: str) -> dict[str, Any] | None:
    w = want.strip().lower()
    for entry in gpus:
        if isinstance(entry, dict) and str(entry.get("id", "")).lower() == w:
            return entry
    for entry in gpus:
        if isinstance(entry, dict) and str(entry.get("name", "")).lower() == w:
            return entry
    return None


_ID_RE = re.compile(r"^[A-Za-z0-9_-]{1,100}$")


def _check_id(pod_id: str) -> None:
    if not _ID_RE.fullmatch(pod_id):
        raise ValueError(f"{pod_id!r} is not a RunPod pod id")


def build(name: str, config: RunPodOptions, ctx: ProviderBuild) -> RunPodProvider:
    """RunPod's factory (`providers.registry.FACTORIES`)."""
    assert ctx.credential is not None  # the registry refuses a keyed kind without its key
    return RunPodProvider(
        name, config, ctx.credential, ctx.installation_id, timeout=ctx.timeout, retry=ctx.retry
    )
