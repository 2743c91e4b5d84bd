"""The worker-status port: what the loop knows about each worker comes through here.

Two sources feed the same columns of an instance row (`worker_name`, `last_heartbeat_at`,
`running_tasks`, `last_task_at`):
(a) Celery workers on a watched broker, seen through Celery's remote control. Our machines
    name their worker after the launch label (`celery worker -n <label>@%h`), so a reply from
    `asg-<installation>-<launch>@host` is the machine `<launch>`; no agent is needed;
(b) heartbeats the worker agent sends through the API (written to the same columns there).
Every worker seen, ours or hand-made, is also kept in `worker_sightings`, so that every process
counts hand-made machines (the GPU under the desk) as capacity alike, with what it reported per
queue (running, prefetched, held until an ETA: `brokers.workers.QueueLoad`, in the row's JSON):
`worker_loads` sums those into the running counts the triggers use (the broker cannot count a
running job under Celery's default early acks).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from datetime import datetime, timedelta

from autoscaler.brokers.base import SourceError
from autoscaler.brokers.registry import broker_domain
from autoscaler.brokers.workers import QueueLoad, WorkerStatus, host_of
from autoscaler.config.models import Queue
from autoscaler.control import machines
from autoscaler.control.runtime import Loaded, Runtime, log
from autoscaler.control.steps.resume import avoid_host
from autoscaler.providers.labels import parse_label
from autoscaler.store import worker_sightings
from autoscaler.store.db import Session


def launch_of(worker: str, installation_id: str) -> str | None:
    """The launch id of one of our workers (`<label>@host`), None for anyone else's."""
    parsed = parse_label(worker.rsplit("@", 1)[0])
    if parsed is None or parsed.installation_id != installation_id:
        return None
    return parsed.launch_id


def observe_celery_workers(
    rt: Runtime, loaded: Loaded, now: datetime, only: Iterable[Queue] | None = None
) -> dict[str, str]:
    """Probe every watched Celery broker once (or those of `only`'s queues); write what
    answered, each under the domain it answered through. Returns errors by source."""
    seen: dict[str, dict[str, WorkerStatus]] = {}
    errors: dict[str, str] = {}
    probed: set[object] = set()
    for q in loaded.autoscaled.values() if only is None else only:
        key = q.metrics.model_copy(update={"queue": None})
        if key in probed:
            continue
        probed.add(key)
        probe = rt.worker_probe(q.metrics)
        if probe is None:
            continue
        try:
            answers = probe.status()
        except SourceError as exc:
            errors[str(exc)[:80]] = str(exc)
            log.warning("worker probe failed: %s", exc)
            continue
        seen.setdefault(broker_domain(q.metrics, rt.env), {}).update(answers)
    slow: list[machines.SlowHost] = []
    with rt.transaction() as session:
        install = rt.installation_id(session)
        for domain, answers in sorted(seen.items()):
            slow += record_sightings(session, answers, install, now, domain)
    for s in slow:  # once the moves are committed (SQLite: one writer at a time)
        avoid_host(rt, s.provider, s.host_id, s.reason)
    return errors


def _status(value: WorkerStatus | tuple[tuple[str, ...], int]) -> WorkerStatus:
    return value if isinstance(value, WorkerStatus) else WorkerStatus(value[0], value[1])


def record_sightings(
    session: Session,
    seen: Mapping[str, WorkerStatus | tuple[tuple[str, ...], int]],
    installation_id: str,
    now: datetime,
    domain: str,
) -> list[machines.SlowHost]:
    """Upsert every sighting heard through `domain`; move our machines' rows to what their
    worker just said. Returns the hosts of slow cold boots made ready here, for the caller to
    avoid once its transaction has committed.

    `seen`: worker name -> `WorkerStatus` (or the older (queues, running) pair)."""
    status = {name: _status(v) for name, v in seen.items()}
    worker_sightings.record(
        session,
        [
            {
                "domain": domain[:300],
                "worker": name[:200],
                "queues": {"queues": list(st.queues)}
                | (
                    {"loads": {q: load.as_json() for q, load in st.loads.items()}}
                    if st.loads is not None
                    else {}
                ),
                "running": st.running,
                "seen_at": now,
            }
            for name, st in status.items()
        ],
    )
    ours = {
        launch: (name, st.running)
        for name, st in status.items()
        if (launch := launch_of(name, installation_id)) is not None
    }
    # ready at first sight, the row told what its worker said (`control.machines`: a machine
    # whose agent heartbeats is known from its authenticated heartbeats alone)
    return machines.answered_remote_control(session, ours, now)


Scope = Callable[[str, str, bool], Iterable[str]]
"""Which queues a sighting counts for: (the domain it was heard through, a queue it names,
whether it is a broker-seen hand-made worker, whose word `Autoscale.hand_made` may refuse)
-> queue names."""


def as_named(domain: str, queue: str, broker_seen: bool) -> tuple[str, ...]:
    """The scope that takes every sighting at its word (what it names, wherever heard)."""
    return (queue,)


def read_sightings(
    session: Session,
    installation_id: str,
    ours: set[str],
    now: datetime,
    window: float,
    scope: Scope = as_named,
) -> tuple[dict[str, tuple[str, ...]], dict[str, QueueLoad], set[str]]:
    """One read of `worker_sightings` (older than `window` forgotten on the way):

    - per queue, the hand-made workers (not our machines, one per host);
    - per queue, the load every worker seen reported, ours and hand-made (every worker process:
      two on one host run different tasks);
    - the names of every worker whose sighting carried a load report.

    `scope` says which queues each sighting counts for: the loop's counts one only for the
    queues of the domain that heard it, and a hand-made worker seen only through the broker (no
    enrolment key behind it) only where `Autoscale.hand_made` allows: a remote-control reply
    can be forged by anyone who may publish on the broker."""
    since = now - timedelta(seconds=window)
    out: dict[str, dict[str, str]] = defaultdict(dict)
    loads: dict[str, QueueLoad] = {}
    reported: set[str] = set()
    for w in worker_sightings.recent(session, since):
        data = w.queues if isinstance(w.queues, dict) else {}
        mine = launch_of(w.worker, installation_id) is not None or host_of(w.worker) in ours
        broker_seen = not mine and "enrolled_by" not in data
        per_queue = data.get("loads")
        if isinstance(per_queue, dict):
            reported.add(w.worker)
            for q, raw in per_queue.items():
                load = QueueLoad.from_json(raw)
                if load is None:
                    continue
                for name in scope(w.domain, str(q), broker_seen):
                    loads[name] = loads.get(name, QueueLoad()) + load
        if mine:
            continue
        for q in data.get("queues", []):
            for name in scope(w.domain, str(q), broker_seen):
                out[name].setdefault(host_of(w.worker), w.worker)
    hand_made = {q: tuple(sorted(names.values())) for q, names in out.items()}
    return hand_made, loads, reported
