"""The loop's promises checked against the store and the providers (`check_invariants`), and
the views of the providers' machines it checks them against.

Apart from `loopkit.Loop` because only the end-to-end and chaos tests judge a run this way.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import select

from autoscaler.lifecycle import LIVE_STATES
from autoscaler.providers.labels import parse_label
from autoscaler.store.db import transaction
from autoscaler.store.models import MockMachine
from tests.control.loopkit import Loop
from tests.control.loopprocs import labelled_processes

ENDED = {"terminated_at", "failed_at", "lost_at"}


@dataclass(frozen=True)
class AtProvider:
    """One machine a provider holds (not destroyed): its provider, id and label."""

    provider: str
    machine_id: str
    label: str


def mock_machines(loop: Loop) -> list[AtProvider]:
    with transaction(loop.sessions) as session:
        return [
            AtProvider(m.provider, f"mock-{m.id}", m.label)
            for m in session.scalars(select(MockMachine).where(MockMachine.status != "destroyed"))
        ]


def local_machines(loop: Loop, provider: str) -> list[AtProvider]:
    """State files of the local provider plus any living process with our label."""
    out = {}
    for path in loop.home.glob(f"local-machines/{provider}/*.json"):
        label = path.name[: -len(".json")]
        out[label] = AtProvider(provider, label, label)
    for label in labelled_processes(loop.installation_id).values():
        out.setdefault(label, AtProvider(provider, label, label))
    return list(out.values())


# --------------------------------------------------------------------------- invariants


def check_invariants(
    loop: Loop,
    max_workers: Mapping[str, int],
    at_provider: Iterable[AtProvider],
    *,
    extra: str = "",
) -> None:
    """The loop's promises, checked against the store and the providers:

    1. no two live rows hold the same provider machine;
    2. every machine a provider holds is owned by a live row of that provider (no orphan, no
       leak: nothing here waits for ORPHAN_GRACE);
    3. no machine was destroyed busy: a row reaches terminating from ready/draining without
       being drained only when its machine was dead, silent or never booted;
    4. never more rows that may bill than max_workers, at any instant (from the timestamps);
    5. every action is audited: a launch event per row, and an event with a reason for every
       drain, destroy, failure and reconcile move the row made.
    """
    rows = loop.instances()
    events = loop.events()
    problems: list[str] = []
    by_launch: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for e in events:
        if e["launch_id"]:
            by_launch[e["launch_id"]].append(e)
        if not (e["reason"] or "").strip():
            problems.append(f"event without a reason: {e}")

    live = [r for r in rows if r["state"] in LIVE_STATES]
    # 1.
    holders: dict[tuple[str, str], list[str]] = defaultdict(list)
    for r in live:
        if r["provider_instance_id"]:
            holders[(r["provider"], r["provider_instance_id"])].append(r["launch_id"])
    for key, launches in holders.items():
        if len(launches) > 1:
            problems.append(f"live rows {launches} share the machine {key}")
    # 2.
    live_by_launch = {r["launch_id"]: r for r in live}
    for m in at_provider:
        parsed = parse_label(m.label)
        if parsed is None or parsed.installation_id != loop.installation_id:
            continue
        owner = live_by_launch.get(parsed.launch_id)
        if owner is None or owner["provider"] != m.provider:
            state = next((r["state"] for r in rows if r["launch_id"] == parsed.launch_id), None)
            problems.append(
                f"{m.provider} holds {m.machine_id} ({m.label}) but no live row owns it "
                f"(its row: {state})"
            )
    # 3.
    for r in rows:
        if r["terminating_at"] is None or r["drained_at"] is not None:
            continue
        if r["ready_at"] is None:
            continue  # never served: a failed boot
        moves = [
            e
            for e in by_launch[r["launch_id"]]
            if e["kind"] == "reconcile" and e["action"].endswith("->terminating")
        ]
        if not any(
            ("dead at the provider" in e["reason"]) or ("silent for" in e["reason"]) for e in moves
        ):
            problems.append(
                f"{r['launch_id']} went to terminating from service without being drained, "
                f"and not for a dead or silent machine: {[e['reason'] for e in moves]}"
            )
    # 4.
    for queue, limit in max_workers.items():
        points: list[tuple[datetime, int]] = []
        for r in rows:
            if r["queue"] != queue:
                continue
            points.append((r["created_at"], 1))
            end = min((r[k] for k in ENDED if r[k] is not None), default=None)
            if end is not None:
                points.append((end, -1))
        points.sort(key=lambda p: (p[0], p[1]))  # an end before a start at the same instant
        n = peak = 0
        for _, d in points:
            n += d
            peak = max(peak, n)
        if peak > limit:
            problems.append(
                f"{queue}: {peak} machines may have billed at once, max_workers {limit}"
            )
    # 5.
    for r in rows:
        mine = by_launch[r["launch_id"]]
        actions = {(e["kind"], e["action"]) for e in mine}
        if ("scale_up", "launch") not in actions:
            problems.append(f"{r['launch_id']}: no launch event")
        if r["draining_at"] is not None and not (
            actions & {("scale_down", "drain"), ("drain", "start")}
        ):
            problems.append(f"{r['launch_id']}: drained without a drain event")
        if r["terminating_at"] is not None and not (
            ("drain", "drained") in actions
            or any(k == "reconcile" and a.endswith("->terminating") for k, a in actions)
        ):
            problems.append(f"{r['launch_id']}: terminating without a drained/reconcile event")
        if r["terminated_at"] is not None and not (
            ("terminate", "destroyed") in actions
            or ("reconcile", "terminating->terminated") in actions
        ):
            problems.append(f"{r['launch_id']}: terminated without a destroy event")
        if r["failed_at"] is not None and not (
            ("launch", "failed") in actions
            or any(k == "reconcile" and a.endswith("->failed") for k, a in actions)
        ):
            problems.append(f"{r['launch_id']}: failed without an event")
        if r["lost_at"] is not None and not any(
            k == "reconcile" and a.endswith("->lost") for k, a in actions
        ):
            problems.append(f"{r['launch_id']}: lost without an event")
    if problems:
        raise AssertionError(
            "invariants broken:\n  " + "\n  ".join(problems) + f"\n{extra}\n{loop.dump()}"
        )


def first_event(
    events: Iterable[Mapping[str, Any]], kind: str, action: str, launch_id: str | None = None
) -> Mapping[str, Any] | None:
    return next(
        (
            e
            for e in events
            if e["kind"] == kind
            and e["action"] == action
            and (launch_id is None or e["launch_id"] == launch_id)
        ),
        None,
    )
