"""A fake RunPod REST v2 API: catalog with stock and prices, pods, RFC 9457 problem errors.

Switches (attributes, set them from a test):
- `stock[gpu_id]`: pods of that type still available; 0 = no capacity (catalog says NONE and a
  create is refused with a problem whose detail says no instances are available).
- `refuse_create`: the catalog shows stock but creates are refused for capacity (field pitfall);
  `capacity_status` picks the status of that refusal (RunPod uses both 4xx and 5xx).
- `fail_after_create`: the next N creates make the pod, then answer 500.
- `fail_before_create`: the next N creates answer 500 without making anything.
- `delay_after_create`: seconds to hold the answer of a create after making the pod (timeout).
- `delay_catalog`: seconds the GPU catalog (the offers) takes to answer (a slow provider).
- `echo_request_in_errors`: a refused create quotes the request body in its detail (some APIs
  do: the machine's environment, secrets included, would reach our error text).
- `hold_create`: a `threading.Event`: creates make the pod, set `create_held`, then hold their
  answer until the event is set (a create in flight, for as long as the test needs; 60 s at most).
- `rate_limit_next`, `fail_next` (base class): 429 (no Retry-After) / 503 for the next N calls;
  `rate_limit_header`: the 429's IETF `RateLimit` header (RunPod's own; `t=` or `reset=`).
- `boot_seconds`: PROVISIONING (after a create) or STARTING (after a start) → RUNNING after
  this long (slow boots).
- `kill(pod_id, status)`: a machine dies (EXITED or ERROR).
- Stop and start (`POST /v2/pods/{id}/action`) as the spec says: `actions` follows the status,
  an action not allowed in the pod's status is a 409 problem, stop releases the GPU to `stock`
  and start takes it again — when `stock` has none left, the pod starts without a GPU (its
  `gpu` block omitted: the spec's `count` cannot be 0), as RunPod does when the host's GPU was
  rented meanwhile. `resume_without_gpu`: every start comes back without a GPU, whatever the
  stock. `start_stuck_scheduling`: a started pod stays STARTING. `stop_times_out_but_happens`:
  a stop stops the pod, then its answer is lost: held `lost_answer_delay` seconds (past the
  client's read timeout) when `lost_answer` is "timeout", answered 500 when it is "500".
`add_pod(name)` makes a pod as a human would (hand-made, not ours).
"""

from __future__ import annotations

import itertools
import json
import re
import threading
import time
from datetime import UTC, datetime
from typing import Any

from werkzeug.wrappers import Request, Response

from tests.fakes import FakeServer, sleep_quietly
from tests.fakes.openapi_check import RUNPOD_SERVER, SpecChecker, runpod_api

PROBLEM = "application/problem+json"
NO_CAPACITY = (
    "There are no longer any instances available with the requested specifications. "
    "Please refresh and try again."
)

DEFAULT_GPUS: list[dict[str, Any]] = [
    {
        "id": "NVIDIA GeForce RTX 4090",
        "name": "RTX 4090",
        "memory": 24,
        "secure": 0.69,
        "community": 0.34,
    },
    {
        "id": "NVIDIA RTX A5000",
        "name": "RTX A5000",
        "memory": 24,
        "secure": 0.29,
        "community": 0.16,
    },
    {
        "id": "NVIDIA A100 80GB PCIe",
        "name": "A100 PCIe",
        "memory": 80,
        "secure": 1.64,
        "community": 1.19,
    },
    {
        "id": "NVIDIA GeForce RTX 3090",
        "name": "RTX 3090",
        "memory": 24,
        "secure": 0.43,
        "community": 0.22,
    },
]
DATA_CENTERS = [("US-TX-3", "US Texas 3"), ("EU-RO-1", "EU Romania 1")]
ACTIONS = {
    "PROVISIONING": ["stop", "terminate"],
    "STARTING": ["stop", "terminate"],
    "RUNNING": ["stop", "restart", "terminate"],
    "EXITED": ["start", "terminate"],
    "ERROR": ["start", "terminate"],
}
"""What the spec's podAction allows in each status (published in the pod's `actions`)."""


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _level(n: int) -> str:
    if n <= 0:
        return "NONE"
    if n <= 2:
        return "LOW"
    if n <= 5:
        return "MEDIUM"
    return "HIGH"


class FakeRunPod(FakeServer):
    def __init__(self, api_key: str, gpus: list[dict[str, Any]] | None = None) -> None:
        self.gpus = [dict(g) for g in (gpus or DEFAULT_GPUS)]
        self.stock: dict[str, int] = {g["id"]: 10 for g in self.gpus}
        self.pods: dict[str, dict[str, Any]] = {}
        self._born: dict[str, float] = {}
        self._ids = itertools.count(1)
        self.refuse_create = False
        self.capacity_status = 500
        self.fail_after_create = 0
        self.fail_before_create = 0
        self.delay_after_create = 0.0
        self.delay_catalog = 0.0
        self.hold_create: threading.Event | None = None
        self.echo_request_in_errors = False
        self.create_held = threading.Event()
        self.boot_seconds = 0.0
        self.resume_without_gpu = False
        self.start_stuck_scheduling = False
        self.stop_times_out_but_happens = False
        self.lost_answer = "timeout"
        self.lost_answer_delay = 1.0
        self._holding: dict[str, tuple[str, int]] = {}  # pod id -> the GPUs it holds
        self._stuck: set[str] = set()
        self._gpu_of: dict[str, dict[str, Any]] = {}  # pod id -> the GPUs it was made with
        self.rate_limit_header = '"minute";r=0;t=12'
        super().__init__(
            SpecChecker(runpod_api(), RUNPOD_SERVER, strip_trailing_slash=False), api_key
        )

    # ------------------------------------------------------------------ errors

    @staticmethod
    def problem(status: int, title: str, detail: str, errors: list[str] | None = None) -> Response:
        body: dict[str, Any] = {"title": title, "status": status, "detail": detail}
        if errors:
            body["errors"] = errors
        resp = FakeServer.json(body, status, PROBLEM)
        resp.headers["RateLimit-Policy"] = '"minute";q=60;w=60, "hour";q=3000;w=3600'
        return resp

    def unauthorized(self) -> Response:
        return self.problem(401, "Unauthorized", "invalid bearer token")

    def invalid(self, kind: str, messages: list[str]) -> Response:
        if kind == "security":
            return self.unauthorized()
        if kind == "path":
            return self.problem(404, "Not Found", "no such route")
        return self.problem(400, "Bad Request", "request validation failed", messages[:10])

    def rate_limited(self) -> Response:
        resp = self.problem(429, "Too Many Requests", "rate limit exceeded for the minute window")
        resp.headers["RateLimit"] = self.rate_limit_header
        return resp  # deliberately no Retry-After: clients must back off by themselves

    def unavailable(self) -> Response:
        return self.problem(503, "Service Unavailable", "upstream temporarily unavailable")

    # ------------------------------------------------------------------ state

    def _status(self, pod_id: str) -> str:
        pod = self.pods[pod_id]
        if (
            pod["status"] in ("PROVISIONING", "STARTING")
            and pod_id not in self._stuck
            and time.monotonic() - self._born[pod_id] >= self.boot_seconds
        ):
            self._set_status(pod, "RUNNING")
            pod["startedAt"] = _now()
            pod["runtime"] = {"uptime": 0}
            pod["ssh"]["proxy"] = {
                "host": "ssh.runpod.io",
                "port": 22,
                "username": f"{pod_id}-x",
                "command": f"ssh {pod_id}-x@ssh.runpod.io",
            }
        return str(pod["status"])

    @staticmethod
    def _set_status(pod: dict[str, Any], status: str) -> None:
        pod["status"] = status
        pod["actions"] = list(ACTIONS.get(status, ["terminate"]))

    def _view(self, pod_id: str) -> dict[str, Any]:
        self._status(pod_id)
        return dict(self.pods[pod_id])

    def _make_pod(self, body: dict[str, Any]) -> dict[str, Any]:
        pod_id = f"pod{next(self._ids):06d}x"
        gpu = body.get("gpu") or {"id": self.gpus[0]["id"], "count": 1}
        entry = next((g for g in self.gpus if g["id"] == gpu["id"]), self.gpus[0])
        cloud = body.get("cloud", "SECURE")
        count = int(gpu.get("count", 1))
        dcs = body.get("dataCenterIds") or [DATA_CENTERS[0][0]]
        pod = {
            "id": pod_id,
            "name": body["name"],
            "status": "PROVISIONING",
            "actions": list(ACTIONS["PROVISIONING"]),
            "image": body.get("image", ""),
            "args": body.get("args", ""),
            "disk": body.get("disk", 20),
            "mounts": dict(body.get("mounts") or {}),
            "ports": body.get("ports", []),
            "env": dict(body.get("env") or {}),
            "registry": None,
            "gpu": {"id": entry["id"], "count": count},
            "cloud": cloud,
            "dataCenterId": dcs[0],
            "cudaVersion": "12.8",
            "ssh": {"proxy": None, "direct": None},
            "template": None,
            "cost": round(entry["secure" if cloud == "SECURE" else "community"] * count, 4),
            "locked": False,
            "runtime": None,
            "createdAt": _now(),
            "startedAt": None,
            "globalNetworking": {"enabled": False},
        }
        with self.lock:
            self.pods[pod_id] = pod
            self._born[pod_id] = time.monotonic()
            self.stock[entry["id"]] = self.stock.get(entry["id"], 0) - count
            self._holding[pod_id] = (entry["id"], count)
            self._gpu_of[pod_id] = dict(pod["gpu"])
        return pod

    def add_pod(self, name: str, **overrides: Any) -> str:
        """A pod made by hand in the console (not ours)."""
        gpu_id = overrides.pop("gpu_id", self.gpus[0]["id"])
        pod = self._make_pod(
            {"name": name, "image": "someone/else:latest", "gpu": {"id": gpu_id, "count": 1}}
        )
        pod.update(overrides)
        return str(pod["id"])

    def kill(self, pod_id: str, status: str = "EXITED") -> None:
        with self.lock:
            self._status(pod_id)
            pod = self.pods[pod_id]
            self._set_status(pod, status)
            pod["cost"] = 0.0
            pod["runtime"] = None

    def live_pods(self) -> list[dict[str, Any]]:
        with self.lock:
            return [self._view(i) for i in self.pods]

    # ------------------------------------------------------------------ routes

    def listing(self, request: Request) -> bool:
        return request.method == "GET" and request.path == "/v2/pods"

    def route(self, request: Request) -> Response:
        path, method = request.path, request.method
        if path == "/v2/catalog/gpus" and method == "GET":
            return self._catalog(request)
        if path == "/v2/pods" and method == "GET":
            with self.lock:
                return self.json({"pods": [self._view(i) for i in self.pods]})
        if path == "/v2/pods" and method == "POST":
            return self._create(request)
        m = re.fullmatch(r"/v2/pods/([^/]+)", path)
        if m and method == "GET":
            with self.lock:
                if m.group(1) not in self.pods:
                    return self.problem(404, "Not Found", "pod not found")
                return self.json(self._view(m.group(1)))
        if m and method == "DELETE":
            return self._terminate(m.group(1))
        m = re.fullmatch(r"/v2/pods/([^/]+)/action", path)
        if m and method == "POST":
            return self._action(m.group(1), str(request.get_json()["action"]))
        return self.problem(404, "Not Found", "route not implemented by the fake")

    def _terminate(self, pod_id: str) -> Response:
        with self.lock:
            pod = self.pods.pop(pod_id, None)
            if pod is None:
                return self.problem(404, "Not Found", "pod not found")
            self._release(pod_id)
        return Response(status=204)

    def _release(self, pod_id: str) -> None:
        held = self._holding.pop(pod_id, None)
        if held is not None:
            self.stock[held[0]] = self.stock.get(held[0], 0) + held[1]

    def _action(self, pod_id: str, action: str) -> Response:
        if action == "terminate":
            return self._terminate(pod_id)
        with self.lock:
            if pod_id not in self.pods:
                return self.problem(404, "Not Found", "pod not found")
            pod = self.pods[pod_id]
            status = self._status(pod_id)
            if action not in ACTIONS.get(status, []):
                return self.problem(
                    409, "Conflict", f"action {action!r} is not valid for a pod in {status}"
                )
            lost = False
            if action == "stop":
                self._set_status(pod, "EXITED")
                pod["cost"] = 0.0
                pod["runtime"] = None
                self._release(pod_id)
                self._stuck.discard(pod_id)
                lost = self.stop_times_out_but_happens
            elif action == "start":
                self._start(pod)
            else:  # restart: the container again, in place
                self._set_status(pod, "STARTING")
                self._born[pod_id] = time.monotonic()
            view = self._view(pod_id)
            mode, delay = self.lost_answer, self.lost_answer_delay
        if lost and mode == "500":
            return self.problem(500, "Internal Server Error", "upstream error")
        if lost:
            sleep_quietly(delay)
        return self.json(view)

    def _start(self, pod: dict[str, Any]) -> None:
        """Back onto its host: with its GPU if the host still has one free, else without."""
        pod_id = pod["id"]
        self._release(pod_id)  # a pod at rest holds nothing (one `kill`ed may still say it does)
        gpu = self._gpu_of[pod_id]
        count = int(gpu["count"])
        if self.stock.get(gpu["id"], 0) >= count and not self.resume_without_gpu:
            pod["gpu"] = dict(gpu)
            self.stock[gpu["id"]] = self.stock.get(gpu["id"], 0) - count
            self._holding[pod_id] = (gpu["id"], count)
            entry = next((g for g in self.gpus if g["id"] == gpu["id"]), self.gpus[0])
            unit = entry["secure" if pod["cloud"] == "SECURE" else "community"]
            pod["cost"] = round(unit * count, 4)
        else:
            pod.pop("gpu", None)  # the spec's count cannot say 0: the block is omitted
            pod["cost"] = 0.05
        self._set_status(pod, "STARTING")
        self._born[pod_id] = time.monotonic()
        if self.start_stuck_scheduling:
            self._stuck.add(pod_id)

    def _catalog(self, request: Request) -> Response:
        if self.delay_catalog:  # a slow answer (outside the lock)
            time.sleep(self.delay_catalog)
        with_availability = request.args.get("include") == "AVAILABILITY"
        if with_availability != ("product" in request.args):
            return self.problem(400, "Bad Request", "include=AVAILABILITY and product go together")
        # Availability is the same in both clouds in this fake.
        count = int(request.args.get("count", "1"))
        out = []
        with self.lock:
            for g in self.gpus:
                entry: dict[str, Any] = {
                    "id": g["id"],
                    "name": g["name"],
                    "pool": None,
                    "manufacturer": "NVIDIA",
                    "memory": g["memory"],
                    "secure": True,
                    "community": True,
                    "price": {"secure": g["secure"], "community": g["community"]},
                    "maxCount": {"secure": 8, "community": 4},
                }
                if with_availability:
                    left = self.stock.get(g["id"], 0) // max(count, 1)
                    level = _level(left)
                    entry["availability"] = level
                    if level != "NONE":
                        entry["dataCenters"] = [
                            {"id": dc, "name": dc_name, "availability": level}
                            for dc, dc_name in DATA_CENTERS
                        ]
                    entry["cudaVersions"] = [{"version": "12.8", "available": level != "NONE"}]
                out.append(entry)
        return self.json({"gpus": out})

    def _create(self, request: Request) -> Response:
        body = request.get_json()
        gpu = body.get("gpu")
        if not gpu:
            return self.problem(400, "Bad Request", "exactly one of gpu or cpu must be set")
        with self.lock:
            if not any(g["id"] == gpu["id"] for g in self.gpus):
                return self.problem(404, "Not Found", f"GPU type {gpu['id']} not found")
            if self.fail_before_create > 0:
                self.fail_before_create -= 1
                return self.problem(500, "Internal Server Error", "something went wrong")
            if self.refuse_create or self.stock.get(gpu["id"], 0) < int(gpu.get("count", 1)):
                status = self.capacity_status
                title = "Internal Server Error" if status >= 500 else "Bad Request"
                detail = NO_CAPACITY
                if self.echo_request_in_errors:
                    detail += f" (request: {json.dumps(body, sort_keys=True)})"
                return self.problem(status, title, detail)
            pod = self._make_pod(body)
            fail = self.fail_after_create > 0
            if fail:
                self.fail_after_create -= 1
            delay = self.delay_after_create
            hold = self.hold_create
        if hold is not None:
            self.create_held.set()
            hold.wait(60)
        if delay:
            sleep_quietly(delay)
        if fail:
            return self.problem(500, "Internal Server Error", "upstream error")
        return self.json(self._view(pod["id"]), 201)
