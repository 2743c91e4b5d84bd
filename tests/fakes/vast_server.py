"""A fake Vast.ai console API: offer search, asks, instances (v1 keyset paging, v0 get/delete).

Switches (attributes, set them from a test):
- `vanish`: offer ids that are gone by the time they are rented (404 `no_such_ask`, or 410 when
  `vanish_status` is 410). `vanish_after_search = N`: the N cheapest offers of the next search
  disappear right after it is answered (offers vanishing between search and create).
- `fail_after_create`: the next N creates make the instance, then answer 500.
- `fail_with_contract`: the next N creates make the instance, then answer a failure that still
  carries `new_contract` (the client must destroy it).
- `delay_after_create`: seconds to hold a create's answer after making the instance (timeout).
- `hold_search`: a `threading.Event`: searches wait for it (60 s at most) before answering (a
  provider that does not answer in time).
- `rate_limit_next`, `fail_next` (base class): 429 (plain text, no Retry-After) / 503.
- `v0_list_mode`: what the deprecated `GET /api/v0/instances/` answers: "deprecated" (as the
  real API does) or "empty" (the trap a client reading it would fall into). Either way our
  client must never call it; it is outside the spec, so it skips validation.
- `boot_seconds`: loading → running after this long; `kill(id, status, msg)`: a machine dies.
- Stop and start: `PUT /api/v0/instances/{id}/` with `{"state": "stopped"|"running"}` (and/or
  a `label`), idempotent. A stop sets `intended_status`/`cur_state` stopped and `actual_status`
  to `stopped_actual_status` ("stopped"; Vast shows "exited" too); a start loads again (then
  runs after `boot_seconds`). `resume_without_gpu`: a start is refused, the machine's GPU being
  rented by someone else (`{"success": false, "error": "resources_unavailable", ...}`).
  `start_stuck_scheduling`: a start is accepted but the instance waits for its GPU, at rest
  with `intended_status` running, for ever. `stop_times_out_but_happens`: a stop happens, then
  its answer is lost — held `lost_answer_delay` seconds (past the client's read timeout) when
  `lost_answer` is "timeout", answered 500 when it is "500" (a retry finds it stopped already
  and is answered at once). `refuse_state_change = (error, msg)`: every state change
  is answered 200 `success: false` with them, nothing changed.
`add_instance(label)` makes an instance as a human would (hand-made, not ours).

Interruptible (bid) instances, as the spec, the CLI and the docs describe them:
- Every offer has `min_bid` (the whole offer's current minimum bid, $/h). A search with
  `type: "bid"` prices the offers at it (`dph_total` = `min_bid`; "uses minimum bid price").
  `ignore_search_filters`: fields whose conditions the search does not apply (a server that
  answers more than asked, or a market that moved), so the client's own re-checks are tested.
- A create with `price` rents interruptible at that bid: the instance says `is_bid` true, its
  `min_bid`, and bills the bid (`dph_total`). A bid below the offer's `min_bid` cannot run now:
  with `cancel_unavail` true (what our client sends) it is refused 410 `no_such_ask` as the spec
  documents ("when cancel_unavail is true and instance cannot start"); nothing is created.
  (Without it Vast creates a stopped instance instead — not modelled.)
- `outbid(id)`: a higher bid takes the machine. Vast stops the instance (processes killed, disk
  kept and billed): `actual_status`, `cur_state` and `next_state` "stopped", and by default
  `intended_status` "stopped" too (as dstack observed; `intended="running"` for the reading
  where it stays paused waiting for priority); `min_bid` may be raised to the winning bid.
  `resume_outbid(id)`: its bid leads again and it runs again by itself (loading, then running
  after `boot_seconds`).
"""

from __future__ import annotations

import base64
import itertools
import json
import re
import shlex
import threading
import time
from typing import Any

from werkzeug.wrappers import Request, Response

from tests.fakes import FakeServer, sleep_quietly
from tests.fakes.openapi_check import VAST_SERVER, SpecChecker, vast_api

SEARCH_META = {"order", "limit", "type", "allocated_storage"}
SEARCH_DEFAULTS = {"verified": {"eq": True}, "rentable": {"eq": True}, "rented": {"eq": False}}
FILTERABLE = {
    "actual_status",
    "gpu_name",
    "verification",
    "id",
    "label",
    "machine_id",
    "intended_status",
    "cur_state",
}


def default_offers() -> list[dict[str, Any]]:
    """A small market: RTX 4090s at several prices, places and qualities."""
    rows = [
        # id, machine, host, price, geo, inet_down, cuda, reliability, verified, disk
        (5001, 101, 11, 0.31, "Lyon, FR", 800.0, 12.4, 0.995, True, 200.0),
        (5002, 102, 12, 0.35, "US", 900.0, 12.8, 0.999, True, 500.0),
        (5003, 103, 13, 0.40, "Austin, US", 150.0, 12.8, 0.990, True, 500.0),
        (5004, 104, 14, 0.45, "Toronto, CA", 1000.0, 12.2, 0.980, True, 500.0),
        (5005, 105, 15, 0.28, "US", 1000.0, 12.8, 0.999, False, 500.0),  # unverified, cheapest
        (5006, 106, 16, 0.50, "Ohio, US", 1000.0, 11.8, 0.999, True, 500.0),  # old CUDA
        (5007, 107, 17, 0.55, "US", 1000.0, 12.8, 0.999, True, 30.0),  # small disk
        (5008, 108, 18, 0.95, "US", 1000.0, 12.8, 0.999, True, 500.0),  # too dear
        (5009, 109, 19, 0.52, "US", 1000.0, 12.8, 0.900, True, 500.0),  # unreliable
    ]
    # interruptible at half the on-demand price or a little more (the current minimum bid)
    min_bids = {5001: 0.15, 5002: 0.17, 5003: 0.2, 5004: 0.23, 5005: 0.13, 5006: 0.26}
    min_bids |= {5007: 0.28, 5008: 0.47, 5009: 0.26}
    return [
        {
            "id": oid,
            "min_bid": min_bids[oid],
            "ask_contract_id": oid,
            "machine_id": mid,
            "host_id": hid,
            "dph_total": price,
            "dph_base": round(price * 0.9, 4),
            "geolocation": geo,
            "inet_down": down,
            "inet_up": down / 2,
            "cuda_max_good": cuda,
            "reliability": rel,
            "reliability2": rel,
            "verified": ver,
            "verification": "verified" if ver else "unverified",
            "rentable": True,
            "rented": False,
            "external": False,
            "gpu_name": "RTX 4090",
            "num_gpus": 1,
            "gpu_ram": 24564,
            "disk_space": disk,
            "storage_cost": 0.15,
        }
        for oid, mid, hid, price, geo, down, cuda, rel, ver, disk in rows
    ]


def _country(geo: Any) -> str:
    return str(geo or "").rsplit(",", 1)[-1].strip().upper()


def _compare(op: str, value: Any, arg: Any) -> bool:
    if op == "eq":
        return bool(value == arg)
    if op == "neq":
        return bool(value != arg)
    if op == "in":
        return value in arg
    if op == "notin":
        return value not in arg
    if value is None:
        return False
    if op == "gt":
        return bool(value > arg)
    if op == "gte":
        return bool(value >= arg)
    if op == "lt":
        return bool(value < arg)
    if op == "lte":
        return bool(value <= arg)
    raise KeyError(op)


def _matches(value: Any, cond: dict[str, Any], key: str) -> bool:
    if key == "geolocation":
        value = _country(value)
    for op, arg in cond.items():
        if key == "geolocation" and isinstance(arg, str):
            arg = arg.upper()
        try:
            if not _compare(op, value, arg):
                return False
        except (KeyError, TypeError):
            return False
    return True


def _env_dict(env: Any) -> dict[str, str]:
    """The CLI's object form, or the spec's docker-flag string `-e K=V -p 80:80`."""
    if isinstance(env, dict):
        return {str(k): str(v) for k, v in env.items()}
    out: dict[str, str] = {}
    if isinstance(env, str):
        parts = shlex.split(env)
        for flag, val in itertools.pairwise(parts):
            if flag == "-e" and "=" in val:
                k, v = val.split("=", 1)
                out[k] = v
    return out


class FakeVast(FakeServer):
    def __init__(self, api_key: str, offers: list[dict[str, Any]] | None = None) -> None:
        self.offers: dict[int, dict[str, Any]] = {
            o["id"]: dict(o) for o in (offers if offers is not None else default_offers())
        }
        self.instances: dict[int, dict[str, Any]] = {}
        self._born: dict[int, float] = {}
        self._ids = itertools.count(7835610)
        self.vanish: set[int] = set()
        self.vanish_status = 404
        self.vanish_after_search = 0
        self.fail_after_create = 0
        self.fail_with_contract = 0
        self.omit_contract = 0  # rent, then answer {"success": true} without new_contract
        self.truncate_after_create = 0  # rent, then send a body shorter than its Content-Length
        self.delay_after_create = 0.0
        self.boot_seconds = 0.0
        self.resume_without_gpu = False
        self.start_stuck_scheduling = False
        self.stop_times_out_but_happens = False
        self.lost_answer = "timeout"
        self.lost_answer_delay = 1.0
        self.stopped_actual_status = "stopped"
        self.refuse_state_change: tuple[str, str] | None = None
        self._stuck: set[int] = set()
        self.v0_list_mode = "deprecated"
        self.rate_limit_plain_text = False
        self.searches: list[dict[str, Any]] = []
        self.hold_search: threading.Event | None = None
        self.ignore_search_filters: set[str] = set()
        super().__init__(SpecChecker(vast_api(), VAST_SERVER, strip_trailing_slash=True), api_key)

    # ------------------------------------------------------------------ errors

    @staticmethod
    def error(status: int, error: str, msg: str, **extra: Any) -> Response:
        return FakeServer.json({"success": False, "error": error, "msg": msg, **extra}, status)

    def unauthorized(self) -> Response:
        return self.error(401, "auth_error", "Invalid user key")

    def invalid(self, kind: str, messages: list[str]) -> Response:
        if kind == "security":
            return self.unauthorized()
        if kind == "path":
            return self.error(404, "not_found", "no such endpoint")
        return self.error(400, "invalid_args", "; ".join(messages)[:500])

    def rate_limited(self) -> Response:
        # No Retry-After, ever. JSON as the spec documents for most endpoints; plain text when
        # `rate_limit_plain_text` is set (seen live on some endpoints).
        text = "API requests too frequent endpoint threshold=2.0"
        if self.rate_limit_plain_text:
            return Response(text, status=429, content_type="text/plain")
        return self.json(
            {"success": False, "error": "rate_limit_exceeded", "msg": text, "detail": text}, 429
        )

    def unavailable(self) -> Response:
        return Response("Service Temporarily Unavailable", status=503, content_type="text/html")

    def unchecked(self, request: Request) -> bool:
        return self._is_v0_list(request)

    @staticmethod
    def _is_v0_list(request: Request) -> bool:
        return request.method == "GET" and request.path.rstrip("/") == "/api/v0/instances"

    # ------------------------------------------------------------------ state

    def _view(self, iid: int) -> dict[str, Any]:
        inst = self.instances[iid]
        if (
            inst["actual_status"] == "loading"
            and iid not in self._stuck
            and time.monotonic() - self._born[iid] >= self.boot_seconds
        ):
            inst.update(actual_status="running", cur_state="running", status_msg="success, running")
        return dict(inst)

    def _make_instance(self, offer: dict[str, Any], body: dict[str, Any]) -> int:
        iid = next(self._ids)
        env = _env_dict(body.get("env"))
        bid = body.get("price")
        self.instances[iid] = {
            "id": iid,
            "label": body.get("label"),
            "actual_status": "loading",
            "cur_state": "running",
            "next_state": "running",
            "intended_status": "running",
            "status_msg": "pulling image",
            "machine_id": offer["machine_id"],
            "host_id": offer["host_id"],
            "dph_total": offer["dph_total"] if bid is None else bid,
            "is_bid": bid is not None,
            "gpu_name": offer["gpu_name"],
            "num_gpus": offer["num_gpus"],
            "geolocation": offer["geolocation"],
            "image_uuid": body.get("image", ""),
            "image_runtype": body.get("runtype", "ssh"),
            "extra_env": [[k, v] for k, v in env.items()],
            "disk_space": body.get("disk", 8),
            "start_date": time.time(),
            "storage_cost": offer.get("storage_cost", 0.15),
            # Vast's own $/h for the disk: storage_cost ($/GB-month) over a 720-hour month
            "storage_total_cost": round(
                offer.get("storage_cost", 0.15) * float(body.get("disk", 8)) / 720, 6
            ),
        }
        if offer.get("min_bid") is not None:
            self.instances[iid]["min_bid"] = offer["min_bid"]
        self._born[iid] = time.monotonic()
        return iid

    def add_instance(self, label: str | None, **overrides: Any) -> int:
        """An instance rented by hand (console or CLI): not ours."""
        with self.lock:
            offer = next(iter(self.offers.values()), default_offers()[0])
            iid = self._make_instance(offer, {"label": label, "image": "someone/else"})
            self.instances[iid].update(overrides)
            return iid

    def kill(self, iid: int, status: str = "exited", msg: str | None = None) -> None:
        with self.lock:
            self._view(iid)
            self.instances[iid].update(actual_status=status, cur_state="stopped")
            if msg is not None:
                self.instances[iid]["status_msg"] = msg

    def outbid(
        self,
        iid: int,
        *,
        intended: str = "stopped",
        actual: str = "stopped",
        winning_bid: float | None = None,
        msg: str | None = None,
    ) -> None:
        """A higher bid takes this interruptible instance's machine: Vast stops it, its disk
        kept (and billed). `winning_bid` becomes its `min_bid` (the bid that now leads)."""
        with self.lock:
            inst = self.instances[iid]
            if inst.get("is_bid") is not True:
                raise ValueError(f"instance {iid} is on demand: it cannot be outbid")
            self._view(iid)
            inst.update(
                actual_status=actual,
                cur_state="stopped",
                next_state="stopped",
                intended_status=intended,
            )
            self._stuck.discard(iid)
            if winning_bid is not None:
                inst["min_bid"] = winning_bid
            if msg is not None:
                inst["status_msg"] = msg

    def resume_outbid(self, iid: int) -> None:
        """The outbid instance's bid leads again: it runs again by itself (loading first)."""
        with self.lock:
            inst = self.instances[iid]
            inst.update(
                intended_status="running",
                cur_state="running",
                next_state="running",
                actual_status="loading",
                status_msg="loading",
            )
            self._stuck.discard(iid)
            self._born[iid] = time.monotonic()

    # ------------------------------------------------------------------ routes

    def listing(self, request: Request) -> bool:
        return request.method == "GET" and request.path.rstrip("/") == "/api/v1/instances"

    def route(self, request: Request) -> Response:
        path, method = request.path.rstrip("/"), request.method
        if path == "/api/v0/bundles" and method == "POST":
            return self._search(request.get_json())
        m = re.fullmatch(r"/api/v0/asks/(\d+)", path)
        if m and method == "PUT":
            return self._create(int(m.group(1)), request.get_json())
        if self._is_v0_list(request):
            if self.v0_list_mode == "empty":
                return self.json({"instances": []})
            return self.json(
                {
                    "success": False,
                    "error": "deprecated_endpoint",
                    "msg": "GET /api/v0/instances/ is deprecated; use GET /api/v1/instances/",
                }
            )
        if path == "/api/v1/instances" and method == "GET":
            return self._list(request)
        m = re.fullmatch(r"/api/v0/instances/(\d+)", path)
        if m and method == "GET":
            with self.lock:
                iid = int(m.group(1))
                if iid not in self.instances:
                    return self.json({"instances": None})
                view = self._view(iid)
                # The show-instance schema types extra_env as ["K=V", ...]; the v1 list as pairs.
                view["extra_env"] = [f"{k}={v}" for k, v in view["extra_env"]]
                return self.json({"instances": view})
        if m and method == "DELETE":
            with self.lock:
                if self.instances.pop(int(m.group(1)), None) is None:
                    return self.error(404, "not_found", "Instance not found")
            return self.json({"success": True})
        if m and method == "PUT":
            return self._manage(int(m.group(1)), request.get_json())
        return self.error(404, "not_found", "route not implemented by the fake")

    def _manage(self, iid: int, body: dict[str, Any]) -> Response:
        state = body.get("state")
        lost = False
        with self.lock:
            if iid not in self.instances:
                return self.error(404, "no_such_instance", f"Instance {iid} not found")
            if self.refuse_state_change is not None and state is not None:
                error, msg = self.refuse_state_change
                return self.json({"success": False, "error": error, "msg": msg})
            inst = self.instances[iid]
            self._view(iid)
            if "label" in body:
                inst["label"] = body["label"]
            if state == "stopped" and inst["intended_status"] != "stopped":
                inst.update(
                    intended_status="stopped",
                    cur_state="stopped",
                    next_state="stopped",
                    actual_status=self.stopped_actual_status,
                    status_msg="stopped by the user",
                )
                self._stuck.discard(iid)
                lost = self.stop_times_out_but_happens
            elif state == "running" and inst["intended_status"] != "running":
                if self.resume_without_gpu:
                    return self.json(
                        {
                            "success": False,
                            "error": "resources_unavailable",
                            "msg": f"Required resources are unavailable on machine "
                            f"{inst['machine_id']}: its GPU is rented by another client",
                        }
                    )
                inst.update(intended_status="running", next_state="running")
                if self.start_stuck_scheduling:
                    self._stuck.add(iid)
                    inst["status_msg"] = "scheduling: waiting for the machine's GPU"
                else:
                    inst.update(actual_status="loading", cur_state="running", status_msg="loading")
                    self._born[iid] = time.monotonic()
            mode, delay = self.lost_answer, self.lost_answer_delay
        if lost and mode == "500":
            return Response("Internal Server Error", status=500, content_type="text/html")
        if lost:
            sleep_quietly(delay)
        return self.json({"success": True})

    def _search(self, body: dict[str, Any]) -> Response:
        if self.hold_search is not None:  # a search that does not answer (outside the lock)
            self.hold_search.wait(60)
        with self.lock:
            self.searches.append(body)
            conds = {**SEARCH_DEFAULTS, **{k: v for k, v in body.items() if k not in SEARCH_META}}
            conds = {k: c for k, c in conds.items() if k not in self.ignore_search_filters}
            rows = [dict(o) for o in self.offers.values()]
            if body.get("type") == "bid":  # priced at the minimum bid
                for row in rows:
                    if row.get("min_bid") is not None:
                        row["dph_total"] = row["min_bid"]
            found = [
                o
                for o in rows
                if all(isinstance(c, dict) and _matches(o.get(k), c, k) for k, c in conds.items())
            ]
            for field_name, direction in body.get("order") or [["dph_total", "asc"]]:
                found.sort(key=lambda o: o.get(field_name) or 0, reverse=direction == "desc")
            found = found[: int(body.get("limit") or 64)]
            gone, self.vanish_after_search = found[: self.vanish_after_search], 0
            for o in gone:
                self.offers.pop(o["id"], None)
        return self.json({"offers": found})

    def _create(self, offer_id: int, body: dict[str, Any]) -> Response:
        with self.lock:
            offer = self.offers.get(offer_id)
            if offer is None or offer_id in self.vanish or not offer.get("rentable"):
                msg = (
                    f"error 404/3603: no_such_ask Instance type by id {offer_id} is not available."
                )
                if self.vanish_status == 410:
                    return self.error(410, "no_such_ask", msg)
                return self.error(404, "invalid_args", msg, ask_id=offer_id)
            bid, min_bid = body.get("price"), offer.get("min_bid")
            if bid is not None and (min_bid is None or bid < min_bid):
                # the bid cannot run now; with cancel_unavail (our client's) nothing is made
                return self.error(
                    410,
                    "no_such_ask",
                    f"error 410/3907: no_such_ask Instance type {offer_id} is no longer "
                    f"available (bid {bid} below the minimum bid {min_bid}).",
                    ask_id=offer_id,
                )
            iid = self._make_instance(offer, body)
            self.offers.pop(offer_id)  # rented: no longer on the market
            if self.fail_with_contract > 0:
                self.fail_with_contract -= 1
                return self.error(
                    400,
                    "invalid_args",
                    "error 400/3467: container failed to start",
                    new_contract=iid,
                )
            if self.omit_contract > 0:
                self.omit_contract -= 1
                return self.json({"success": True})
            if self.truncate_after_create > 0:
                self.truncate_after_create -= 1
                broken = Response(b'{"success": true, "new_con', content_type="application/json")
                broken.headers["Content-Length"] = "200"
                broken.headers["Connection"] = "close"
                return broken
            fail = self.fail_after_create > 0
            if fail:
                self.fail_after_create -= 1
            delay = self.delay_after_create
        if delay:
            sleep_quietly(delay)
        if fail:
            return Response("Internal Server Error", status=500, content_type="text/html")
        return self.json({"success": True, "new_contract": iid})

    def _list(self, request: Request) -> Response:
        try:
            filters = json.loads(request.args.get("select_filters", "{}"))
            if not isinstance(filters, dict):
                raise ValueError
        except ValueError:
            return self.error(400, "invalid_args", "select_filters must be a JSON object")
        bad = [k for k in filters if k not in FILTERABLE]
        if bad:
            return self.error(400, "invalid_args", f"cannot filter on {bad}")
        limit = int(request.args.get("limit", "25"))
        limit = 5 if limit <= 0 else limit
        after = 0
        token = request.args.get("after_token")
        if token:
            try:
                after = int(json.loads(base64.b64decode(token))["values"]["id"])
            except (ValueError, KeyError, TypeError):
                return self.error(400, "invalid_args", "invalid after_token")
        with self.lock:
            rows = [
                self._view(i)
                for i in sorted(self.instances)
                if all(_matches(self.instances[i].get(k), c, k) for k, c in filters.items())
            ]
        page = [r for r in rows if r["id"] > after][:limit]
        more = bool(page) and any(r["id"] > page[-1]["id"] for r in rows)
        next_token = (
            base64.b64encode(json.dumps({"values": {"id": page[-1]["id"]}}).encode()).decode()
            if more
            else None
        )
        labels: dict[str, int] = {}
        for r in rows:
            labels[r.get("label") or ""] = labels.get(r.get("label") or "", 0) + 1
        return self.json(
            {
                "success": True,
                "instances_found": len(page),
                "total_instances": len(rows),
                "label_counts": labels,
                "next_token": next_token,
                "instances": page,
            }
        )
