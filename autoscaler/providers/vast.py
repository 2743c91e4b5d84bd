"""Vast.ai (console API, Bearer key). Its published OpenAPI document is in tests/fakes/specs/.

- Offers: a live search (`POST /api/v0/bundles/`) for the cheapest verified, rentable offer
  under the price cap, with the configured filters (country, bandwidth, CUDA, reliability),
  enough disk, and the hosts to avoid (persisted, expiring) excluded by `machine_id notin`.
  Results are re-checked client side too. Searches are always live: cached offers drift.
- Create: `PUT /api/v0/asks/{offer}/` with label and env (an object, as the CLI sends it).
  Offer gone (404/410 `no_such_ask`) → `OfferGoneError`: try the next offer. A failed answer
  that still names a `new_contract` means an instance exists: it is destroyed at once.
  A 5xx or a timeout → the instance is looked up by label before anything else.
- Our instances: `GET /api/v1/instances/` walked page by page (`next_token`), filtered by label.
  The deprecated `GET /api/v0/instances/` list is never used: it answers `deprecated_endpoint`
  and reading that as "no instances" would leak every machine.
- Get `GET /api/v0/instances/{id}/` (`{"instances": null}` = gone); destroy
  `DELETE /api/v0/instances/{id}/` (404 = already gone).
- Stop and start: `PUT /api/v0/instances/{id}/` with `{"state": "stopped"|"running"}`, after the
  same ownership check as destroy; idempotent (setting a state twice is harmless), so retried
  like a read. A stopped instance releases its GPU and keeps its disk (billed at the host's
  storage price); a start waits for the GPU (`scheduling`, STARTING here — the caller's
  `resume_timeout` ends a wait that lasts) or is refused when the machine cannot give it
  (`ResumeRefusedError`).
- Interruptible (bid) instances: `find_bid_offers` searches with `type: bid` and keeps the offers
  whose live `min_bid` (the whole offer's current minimum bid, $/h, storage not included) is at
  most our bid; they are priced at the bid. `create` sends the bid as `price` ("bid price per
  machine"; without it Vast rents on demand), still with `cancel_unavail` (else a bid that
  cannot run now leaves a stopped instance that bills storage). Listed instances say `is_bid`.
  Outbid, Vast stops the instance (processes killed, disk kept and billed); it may run again by
  itself once its bid leads. It reads STOPPED (stopped, disk kept, not by a fault of the host),
  its `raw_status` "outbid". Vast shows it like a stop (dstack saw `intended_status` stopped
  too): an interruptible instance we stopped reads the same.
"""

from __future__ import annotations

import json
import logging
import math
import re
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any, Unpack

import requests

from autoscaler.config.gpus import lookup
from autoscaler.config.machine_specs import InstanceSpec
from autoscaler.config.provider_options import HOURS_PER_MONTH, VastOptions
from autoscaler.digits import ascii_whole, is_ascii_whole
from autoscaler.policy import reconcile
from autoscaler.providers.base import (
    AmbiguousCreateError,
    CapacityError,
    HostsToAvoid,
    LaunchSpec,
    MachineStatus,
    NotOwnedError,
    Offer,
    OfferGoneError,
    ProviderBuild,
    ProviderError,
    ProviderMachine,
    ProviderRequestError,
    ResumeRefusedError,
)
from autoscaler.providers.http import json_body
from autoscaler.providers.keyed_http import ApiOptions, ApiProvider

log = logging.getLogger("autoscaler.providers.vast")

PAGE_SIZE = 25  # the v1 list's maximum
SEARCH_LIMIT = 20
MIN_BID, MAX_BID = 0.001, 128.0
"""The bid (`price`) a create takes, $/h per machine (the spec's bounds)."""
OUTBID = reconcile.OUTBID
"""`raw_status` of an interruptible instance Vast stopped (Vast has no status of that name)."""

_STATUS = {
    None: MachineStatus.STARTING,
    "created": MachineStatus.STARTING,
    "loading": MachineStatus.STARTING,
    "rebooting": MachineStatus.STARTING,
    "scheduling": MachineStatus.STARTING,  # a start waiting for the machine's GPU
    "running": MachineStatus.RUNNING,
    "stopped": MachineStatus.STOPPED,
    "frozen": MachineStatus.DEAD,
    "exited": MachineStatus.DEAD,  # "container process exited unexpectedly"
    "unknown": MachineStatus.DEAD,
    "offline": MachineStatus.DEAD,
}
_HOST_GONE = frozenset({"unknown", "offline"})
"""No word from the host: not even a stopped instance there will start again."""
_OCI_ERROR_RE = re.compile(r"oci runtime|error response from daemon", re.IGNORECASE)
_UNAVAILABLE_RE = re.compile(
    r"unavail|not (currently )?available|insufficient|not enough|no (free |available )?gpus?"
    r"|no_such_instance|not found",
    re.IGNORECASE,
)
"""A start refused because the machine cannot give the instance its GPU back (or it is gone)."""


def vast_names(names: tuple[str, ...]) -> list[str]:
    """Vast's `gpu_name` values for `names` (the table's, RunPod's or Vast's spellings), in
    order, once each; a name the table does not know is passed as written, a GPU the table says
    Vast does not list is left out."""
    found: list[str] = []
    for name in names:
        gpu = lookup(name)
        want = name if gpu is None else gpu.vast
        if want is not None and want not in found:
            found.append(want)
    return found


def _country(geolocation: Any) -> str:
    """'Paris, FR' or 'FR' → 'FR'."""
    text = str(geolocation or "")
    return text.rsplit(",", 1)[-1].strip().upper()


def _error_text(body: Any) -> str:
    if isinstance(body, dict):
        parts = [str(body.get(k)) for k in ("error", "msg", "detail") if body.get(k)]
        return ": ".join(parts)
    return ""


def outbid(instance: dict[str, Any]) -> bool:
    """An interruptible (`is_bid`) instance that Vast stopped: its GPU allocation (`cur_state`)
    or its container (`actual_status`) stopped while not running. Vast shows it like a stop
    (`intended_status` stopped too, as dstack observed), or at rest with running intended while
    it waits for its bid to lead again; a stop of ours looks the same."""
    return (
        instance.get("is_bid") is True
        and instance.get("actual_status") != "running"
        and "stopped" in (instance.get("cur_state"), instance.get("actual_status"))
    )


def machine_status(instance: dict[str, Any]) -> MachineStatus:
    """Normalise Vast's statuses. An OCI runtime error in status_msg, or a host that stopped
    reporting, means the box is dead. `intended_status` says what was asked: stopped (by us)
    reads STOPPED whatever the container says now (Vast shows a stopped one as `exited` too),
    and a container at rest while running is intended is a start waiting for its GPU (Vast's
    `scheduling`), which reads STARTING. An interruptible instance Vast stopped (`outbid`)
    reads STOPPED whatever is intended: its disk is kept, it runs again only when its bid
    leads, never because a start waits."""
    actual = instance.get("actual_status")
    intended = instance.get("intended_status")
    if actual != "running" and _OCI_ERROR_RE.search(str(instance.get("status_msg") or "")):
        return MachineStatus.DEAD
    if actual in _HOST_GONE:
        return MachineStatus.DEAD
    if actual == "running":
        return MachineStatus.RUNNING  # still running while a stop is on its way
    if intended == "stopped" or outbid(instance):
        return MachineStatus.STOPPED
    if actual == "stopped" and intended == "running":
        return MachineStatus.STARTING
    return _STATUS.get(actual, MachineStatus.DEAD if actual else MachineStatus.STARTING)


def raw_status(instance: dict[str, Any]) -> str | None:
    """Vast's `actual_status`, or "outbid" for an interruptible instance it stopped (`outbid`;
    a stop of ours of an interruptible one reads the same)."""
    if outbid(instance) and machine_status(instance) is MachineStatus.STOPPED:
        return OUTBID
    actual = instance.get("actual_status")
    return str(actual) if actual is not None else None


def _price(value: Any) -> float | None:
    """A price Vast gave ($/h, finite, not negative), else None."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) and value >= 0 else None


def check_bid(spec: InstanceSpec, bid: object) -> float:
    """The bid, $/h per machine, as a create sends it; ValueError when Vast would refuse it or
    it is above the spec's price cap."""
    if isinstance(bid, bool) or not isinstance(bid, int | float) or not math.isfinite(bid):
        raise ValueError(f"bid {bid!r} is not a price in $/h")
    if not MIN_BID <= bid <= MAX_BID:
        raise ValueError(f"bid {bid:g} $/h is outside what Vast takes ({MIN_BID:g} to {MAX_BID:g})")
    if bid > spec.max_price_per_hour:
        raise ValueError(
            f"bid {bid:g} $/h is above max_price_per_hour ({spec.max_price_per_hour:g})"
        )
    return float(bid)


def offer_bid(offer: Offer) -> float | None:
    """The bid an interruptible offer (`find_bid_offers`) is rented at, None for on demand."""
    if offer.details.get("interruptible") is not True:
        return None
    return check_bid(offer.spec, offer.details.get("bid"))


def storage_price(instance: dict[str, Any]) -> float | None:
    """What the instance bills stopped, $/h: Vast's own `storage_total_cost` (its disk's price
    per hour), else `storage_cost` ($/GB-month) × `disk_space` GB; None when it says neither."""
    total = instance.get("storage_total_cost")
    if isinstance(total, int | float) and not isinstance(total, bool) and total >= 0:
        return round(float(total), 6)
    per_gb, disk = instance.get("storage_cost"), instance.get("disk_space")
    if isinstance(per_gb, int | float) and isinstance(disk, int | float):
        return round(float(per_gb) * float(disk) / HOURS_PER_MONTH, 6)
    return None


class VastProvider(ApiProvider):
    kind = "vast"
    display = "Vast.ai"

    def __init__(
        self,
        name: str,
        config: VastOptions,
        api_key: str,
        installation_id: str,
        hosts: HostsToAvoid,
        *,
        clock: Callable[[], datetime] | None = None,
        **options: Unpack[ApiOptions],
    ) -> None:
        """`options`: the HTTP timeout, retry policy and label-lookup settings of `ApiProvider`."""
        super().__init__(name, config.base_url, api_key, installation_id, **options)
        self.config = config
        self.hosts = hosts
        self._clock = clock or (lambda: datetime.now(UTC))

    # ------------------------------------------------------------------ offers

    def search_query(self, spec: InstanceSpec, avoid: list[str]) -> dict[str, Any]:
        """The search body (public so its shape can be inspected and tested)."""
        names = vast_names(spec.gpus)
        q: dict[str, Any] = {
            "rentable": {"eq": True},
            "rented": {"eq": False},
            "gpu_name": {"eq": names[0]} if len(names) == 1 else {"in": names},
            "num_gpus": {"eq": spec.gpu_count},
            "dph_total": {"lte": spec.max_price_per_hour},
            "disk_space": {"gte": spec.disk_gb},
            "order": [["dph_total", "asc"]],
            "limit": SEARCH_LIMIT,
            "allocated_storage": spec.disk_gb,
        }
        if self.config.verified:
            q["verified"] = {"eq": True}
        if self.config.countries:
            q["geolocation"] = {"in": [c.upper() for c in self.config.countries]}
        if self.config.min_bandwidth_mbps is not None:
            q["inet_down"] = {"gte": self.config.min_bandwidth_mbps}
        if self.config.min_cuda_version is not None:
            q["cuda_max_good"] = {"gte": self.config.min_cuda_version}
        if self.config.min_reliability is not None:
            q["reliability"] = {"gte": self.config.min_reliability}
        ids = [n for h in avoid if (n := ascii_whole(h)) is not None]
        if ids:
            q["machine_id"] = {"notin": ids}
        return q

    def bid_query(self, spec: InstanceSpec, avoid: list[str], bid: float) -> dict[str, Any]:
        """The search body for interruptible offers at `bid` $/h a machine: the on-demand one
        with `type: bid`, and the price cap replaced by `min_bid <= bid`, the lowest minimum bid
        first (all are rented at our bid: the most headroom before another bid beats ours)."""
        q = self.search_query(spec, avoid)
        del q["dph_total"]
        q["min_bid"] = {"lte": bid}
        q["order"] = [["min_bid", "asc"]]
        q["type"] = "bid"
        return q

    def find_offers(self, spec: InstanceSpec) -> list[Offer]:
        return self._find(spec, None)

    def find_bid_offers(self, spec: InstanceSpec, bid: float) -> list[Offer]:
        """Offers to rent interruptible at `bid` $/h per machine (within the spec's cap), best
        first. Each is priced at the bid, its `details` say `interruptible` True, the `bid` and
        the offer's `min_bid`; `create` rents it at that bid. An offer whose live minimum bid is
        above ours, or unknown, is skipped. ValueError for a bid Vast would refuse or above the
        cap (nothing is searched)."""
        return self._find(spec, check_bid(spec, bid))

    def _find(self, spec: InstanceSpec, bid: float | None) -> list[Offer]:
        """On-demand offers (`bid` None) or interruptible ones at `bid`."""
        names = vast_names(spec.gpus)
        if not names:
            log.info("%s: Vast lists none of %s; no search", self.name, ", ".join(spec.gpus))
            return []
        avoid = self.hosts.active(self.name, self._clock())
        query = self.search_query(spec, avoid) if bid is None else self.bid_query(spec, avoid, bid)
        resp = self._http.request("POST", "/api/v0/bundles/", json=query)
        body = self._ok_json(resp, "search offers")
        offers = body.get("offers")
        if not isinstance(offers, list):
            raise ProviderError(
                f"{self.name}: search answer has no 'offers' list", provider=self.name
            )
        avoided = set(avoid)
        countries = {c.upper() for c in self.config.countries}
        result: list[Offer] = []
        for o in offers:
            if not isinstance(o, dict) or "id" not in o:
                continue
            min_bid = _price(o.get("min_bid"))
            if bid is None:
                price = o.get("dph_total")
                if not isinstance(price, int | float) or price > spec.max_price_per_hour:
                    continue
            elif min_bid is None or min_bid > bid:
                continue  # our bid would not run there now (or cannot be told)
            else:
                price = bid
            if str(o.get("machine_id")) in avoided:
                continue
            if self.config.verified and o.get("verified") is False:
                continue
            if countries and _country(o.get("geolocation")) not in countries:
                continue
            gpu = o.get("gpu_name") or (names[0] if len(names) == 1 else None)
            if gpu is None:  # several GPUs asked: which one this is cannot be told
                continue
            details = {
                k: o.get(k)
                for k in (
                    "host_id",
                    "geolocation",
                    "reliability",
                    "cuda_max_good",
                    "inet_down",
                    "disk_space",
                )
            }
            if bid is not None:
                details.update(interruptible=True, bid=bid, min_bid=min_bid)
            result.append(
                Offer(
                    provider=self.name,
                    offer_id=str(o["id"]),
                    gpu=str(gpu),
                    gpu_count=int(o.get("num_gpus") or spec.gpu_count),
                    price_per_hour=float(price),
                    spec=spec,
                    host_id=str(o["machine_id"]) if o.get("machine_id") is not None else None,
                    details=details,
                )
            )
        if bid is None:
            result.sort(key=lambda offer: offer.price_per_hour)
        else:  # all at our bid: the lowest minimum bid first
            result.sort(key=lambda offer: offer.details["min_bid"])
        return result

    def avoid_host(self, host_id: str, reason: str) -> None:
        until = self._clock() + timedelta(seconds=self.config.avoid_host_for)
        self.hosts.avoid(self.name, host_id, reason[:2000], until)
        log.info("%s: avoiding host %s until %s: %s", self.name, host_id, until.isoformat(), reason)

    # ------------------------------------------------------------------ create

    def create(self, offer: Offer, launch: LaunchSpec) -> ProviderMachine:
        self._check_launch(launch)
        if not is_ascii_whole(offer.offer_id):
            raise ValueError(f"{offer.offer_id!r} is not a Vast offer id")
        bid = offer_bid(offer)
        spec = offer.spec
        body: dict[str, Any] = {
            "client_id": "me",
            "image": spec.image,
            "disk": spec.disk_gb,
            "label": launch.label,
            "env": dict(launch.env),
            "runtype": "args",
            "cancel_unavail": True,
        }
        if bid is not None:
            body["price"] = bid  # interruptible at this bid per machine; without it on demand
        path = f"/api/v0/asks/{offer.offer_id}/"
        try:
            resp = self._http.request("PUT", path, json=body, idempotent=False)
        except AmbiguousCreateError as exc:
            return self._recover(launch.label, str(exc))
        data = json_body(resp)
        status = resp.status_code
        contract = data.get("new_contract") if isinstance(data, dict) else None
        success = isinstance(data, dict) and data.get("success") is True
        if status == 200 and success and contract is not None:
            log.info(
                "%s: created instance %s (%s)%s",
                self.name,
                contract,
                launch.label,
                f", interruptible at {bid:g} $/h" if bid is not None else "",
            )
            return ProviderMachine(
                provider_instance_id=str(contract),
                label=launch.label,
                status=MachineStatus.STARTING,
                raw_status=None,
                price_per_hour=offer.price_per_hour,
                host_id=offer.host_id,
                gpu=offer.gpu,
            )
        text = self._http.redact(_error_text(data)) or self._http.excerpt(resp)
        if status == 200 and success:
            # "Rented" without a contract id: the instance may well exist. Trying the next offer
            # could rent a second one for this launch; look it up by label instead.
            return self._recover(launch.label, f"HTTP 200 success without new_contract: {text}")
        if contract is not None:
            # Failed, yet an instance exists and bills: destroy it before moving on.
            log.warning(
                "%s: create failed (HTTP %d: %s) but instance %s exists; destroying it",
                self.name,
                status,
                text,
                contract,
            )
            self._delete(str(contract))
            raise CapacityError(
                f"{self.name}: offer {offer.offer_id} failed after creating instance {contract} "
                f"(destroyed): {text}",
                provider=self.name,
            )
        if status in (404, 410) or "no_such_ask" in text:
            raise OfferGoneError(
                f"{self.name}: offer {offer.offer_id} is gone: {text}", provider=self.name
            )
        if status >= 500 or (status == 200 and not success and not text):
            return self._recover(launch.label, f"HTTP {status}: {text}")
        if status == 200 or "invalid_price" in text or "unavail" in text:
            raise CapacityError(
                f"{self.name}: offer {offer.offer_id} refused: {text}", provider=self.name
            )
        raise ProviderRequestError(
            f"{self.name}: create refused (HTTP {status}): {text}", provider=self.name
        )

    # ------------------------------------------------------------------ read

    def _pages(self, select_filters: dict[str, Any]) -> Iterator[dict[str, Any]]:
        token: str | None = None
        seen: set[str] = set()
        while True:
            params: dict[str, Any] = {
                "limit": PAGE_SIZE,
                "select_filters": json.dumps(select_filters, separators=(",", ":")),
            }
            if token:
                params["after_token"] = token
            resp = self._http.request("GET", "/api/v1/instances/", params=params)
            body = self._ok_json(resp, "list instances")
            instances = body.get("instances")
            if not isinstance(instances, list):
                raise ProviderError(
                    f"{self.name}: instance list answer has no 'instances' list", provider=self.name
                )
            yield from (i for i in instances if isinstance(i, dict))
            token = body.get("next_token")
            if not token:
                return
            if token in seen:  # a server bug must not loop us forever
                raise ProviderError(
                    f"{self.name}: instance list repeats a page", provider=self.name
                )
            seen.add(token)

    def list_owned(self) -> list[ProviderMachine]:
        return [self._machine(i) for i in self._pages({}) if self.owns(i.get("label"))]

    def find_by_label(self, label: str) -> ProviderMachine | None:
        if not self.owns(label):
            return None
        for inst in self._pages({"label": {"eq": label}}):
            if inst.get("label") == label:
                return self._machine(inst)
        return None

    def _get_instance(self, instance_id: str) -> dict[str, Any] | None:
        if not is_ascii_whole(instance_id):
            raise ValueError(f"{instance_id!r} is not a Vast instance id")
        resp = self._http.request("GET", f"/api/v0/instances/{instance_id}/")
        if resp.status_code == 404:
            return None
        body = self._ok_json(resp, "show instance")
        if "instances" not in body:
            # Not the documented answer: reading it as "gone" would let destroy() do nothing.
            raise ProviderError(
                f"{self.name}: show instance {instance_id} answered without 'instances': "
                f"{self._http.excerpt(resp)}",
                provider=self.name,
            )
        inst = body["instances"]
        return inst if isinstance(inst, dict) and inst else None

    def get(self, provider_instance_id: str) -> ProviderMachine | None:
        inst = self._get_instance(provider_instance_id)
        if inst is None or not self.owns(inst.get("label")):
            return None
        return self._machine(inst)

    # ------------------------------------------------------------------ destroy

    def _owned_instance(self, instance_id: str) -> dict[str, Any] | None:
        """The instance, None when gone; `NotOwnedError` when it is not ours."""
        inst = self._get_instance(instance_id)
        if inst is not None and not self.owns(inst.get("label")):
            raise NotOwnedError(
                f"{self.name}: instance {instance_id} was not created by this installation; "
                "it is left alone",
                provider=self.name,
            )
        return inst

    def destroy(self, provider_instance_id: str) -> None:
        if self._owned_instance(provider_instance_id) is None:
            return
        self._delete(provider_instance_id)

    def _delete(self, instance_id: str) -> None:
        resp = self._http.request("DELETE", f"/api/v0/instances/{instance_id}/")
        if resp.status_code == 404:
            return
        body = self._ok_json(resp, "destroy instance")
        if body.get("success") is False:
            raise ProviderError(
                f"{self.name}: destroy of {instance_id} failed: "
                f"{self._http.redact(_error_text(body))}",
                provider=self.name,
            )
        log.info("%s: destroyed instance %s", self.name, instance_id)

    # ------------------------------------------------------------------ stop / start

    def stop(self, provider_instance_id: str) -> None:
        inst = self._owned_instance(provider_instance_id)
        if inst is None or inst.get("intended_status") == "stopped":
            return  # gone, or already stopped (or stopping)
        ok, text = self._set_state(provider_instance_id, "stopped")
        if ok:
            log.info("%s: stopping instance %s", self.name, provider_instance_id)
            return
        after = self._get_instance(provider_instance_id)
        if after is None or after.get("intended_status") == "stopped":
            return
        raise ProviderError(
            f"{self.name}: stop of instance {provider_instance_id} failed: {text}",
            provider=self.name,
        )

    def start(self, provider_instance_id: str) -> None:
        inst = self._owned_instance(provider_instance_id)
        if inst is None:
            raise self._refused(provider_instance_id, "it is gone")
        status = machine_status(inst)
        if status is MachineStatus.DEAD:
            raise self._refused(
                provider_instance_id,
                f"it is dead ({inst.get('actual_status')}: {inst.get('status_msg') or '-'})",
            )
        if inst.get("intended_status") == "running" and status is not MachineStatus.STOPPED:
            return  # running, or already starting
        ok, text = self._set_state(provider_instance_id, "running")
        if ok:
            log.info("%s: starting instance %s", self.name, provider_instance_id)
            return
        if _UNAVAILABLE_RE.search(text):
            raise self._refused(provider_instance_id, text)
        raise ProviderError(
            f"{self.name}: start of instance {provider_instance_id} failed: {text}",
            provider=self.name,
        )

    def _set_state(self, instance_id: str, state: str) -> tuple[bool, str]:
        """PUT the instance's state: (True, '') on success, else (False, what Vast said). A
        404 answers (False, 'not found')."""
        resp = self._http.request("PUT", f"/api/v0/instances/{instance_id}/", json={"state": state})
        body = json_body(resp)
        if 200 <= resp.status_code < 300 and isinstance(body, dict):
            if body.get("success") is not False:
                return True, ""
            return False, self._http.redact(_error_text(body)) or "success=false"
        text = self._http.redact(_error_text(body)) or self._http.excerpt(resp)
        if resp.status_code == 404:
            return False, f"not found (HTTP 404): {text}"
        if resp.status_code in (400, 422) and not _UNAVAILABLE_RE.search(text):
            raise ProviderRequestError(
                f"{self.name}: setting instance {instance_id} {state} was refused (HTTP "
                f"{resp.status_code}): {text}",
                provider=self.name,
            )
        return False, f"HTTP {resp.status_code}: {text}"

    def _refused(self, instance_id: str, why: str) -> ResumeRefusedError:
        return ResumeRefusedError(
            f"{self.name}: instance {instance_id} cannot be resumed: {why}; destroy it and rent "
            "afresh",
            provider=self.name,
        )

    # ------------------------------------------------------------------ helpers

    def _ok_json(self, resp: requests.Response, what: str) -> dict[str, Any]:
        """A 2xx JSON object whose `success` is not false — anything else is an error, never
        an empty result (the deprecated list answers 200 with success false)."""
        body = json_body(resp)
        if 200 <= resp.status_code < 300 and isinstance(body, dict):
            if body.get("success") is False:
                raise ProviderError(
                    f"{self.name}: {what} failed: "
                    f"{self._http.redact(_error_text(body)) or 'success=false'}",
                    provider=self.name,
                )
            return body
        text = self._http.redact(_error_text(body)) or self._http.excerpt(resp)
        raise ProviderRequestError(
            f"{self.name}: {what} answered HTTP {resp.status_code}: {text}", provider=self.name
        )

    def _machine(self, inst: dict[str, Any]) -> ProviderMachine:
        price = inst.get("dph_total")
        return ProviderMachine(
            provider_instance_id=str(inst["id"]),
            label=str(inst.get("label") or ""),
            status=machine_status(inst),
            raw_status=raw_status(inst),
            price_per_hour=float(price) if isinstance(price, int | float) else None,
            host_id=str(inst["machine_id"]) if inst.get("machine_id") is not None else None,
            gpu=inst.get("gpu_name"),
            storage_price_per_hour=storage_price(inst),
        )


def build(name: str, config: VastOptions, ctx: ProviderBuild) -> VastProvider:
    """Vast.ai's factory (`providers.registry.FACTORIES`): hosts to avoid live in the store."""
    from autoscaler.store.avoided_hosts import StoredHostsToAvoid

    assert ctx.credential is not None  # the registry refuses a keyed kind without its key
    return VastProvider(
        name,
        config,
        ctx.credential,
        ctx.installation_id,
        StoredHostsToAvoid(ctx.sessions),
        timeout=ctx.timeout,
        retry=ctx.retry,
    )
