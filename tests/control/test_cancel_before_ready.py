"""Draining a machine that is not ready yet cancels it, through every door an operator has.

`autoscaler drain`, the admin API's drain (a real `autoscaler serve`) and `celery call
autoscaler.drain` (a real worker) on a machine that is
- pending: it is never rented (its launch finds nothing to claim);
- creating (its create held in flight by the RunPod fake): it is destroyed as soon as the
  provider answers, by the launch that made it;
- booting with no worker up: it is destroyed at once;
and each answer says which. Run on the embedded defaults (SQLite, kombu's SQL broker) and on
PostgreSQL + Redis. The fake counts the creates: never two for one launch, none for a pending
one. A machine that no longer exists is the only refusal.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import requests

from autoscaler.control.runtime import Runtime
from autoscaler.control.steps import launch
from autoscaler.control.steps.frame import Kind, run_step
from autoscaler.settings import Settings
from autoscaler.store import intents
from tests.agent.agentkit import free_port
from tests.control.loopkit import Loop
from tests.control.loopprocs import WATCH_BROKER, unique
from tests.fakes.runpod_server import FakeRunPod

KEY = "rpa_CANCELTEST_4f9c2e7b1d_not_a_real_key"
CANCELLED = "cancelled before it was ready"


@pytest.fixture(params=["embedded", "postgresql+redis"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[Loop, str]]:
    """A control plane on the embedded defaults or on PostgreSQL + Redis, its watched
    queue's source of the same kind."""
    env = {"CANCEL_RUNPOD_KEY": KEY}
    if request.param == "embedded":
        loop = Loop(tmp_path, None, broker_url=None, result_backend=None, extra_env=env)
        source = {"source": "celery", "url": f"sqla+sqlite:///{tmp_path / 'watched.db'}"}
    else:
        loop = Loop(tmp_path, request.getfixturevalue("pg_url"), extra_env=env)
        source = {"source": "celery", "url": WATCH_BROKER}
    try:
        yield loop, source  # type: ignore[misc]
    finally:
        loop.close()


def _config(fake: FakeRunPod, queue: str, source: dict[str, Any]) -> dict[str, Any]:
    return {
        "poll_interval": 2,
        "boot_timeout": 300,
        "providers": {
            "pods": {
                "kind": "runpod",
                "api_key_env": "CANCEL_RUNPOD_KEY",
                "base_url": fake.url,
                "gpu_types": ["NVIDIA GeForce RTX 4090"],
            }
        },
        "queues": {
            queue: {
                "metrics": source,
                "autoscale": {
                    "provider": "pods",
                    "max_workers": 9,
                    "scale_up": [{"trigger": "no_workers"}],
                    "scale_down": [{"trigger": "idle", "timeout": "5m"}],
                    "instance": {"gpu": "RTX 4090", "max_price_per_hour": 1.0},
                },
            }
        },
    }


@pytest.mark.timeout(280)
def test_drain_cancels_a_machine_that_is_not_ready_through_every_door(store, tmp_path):
    loop, source = store
    fake = FakeRunPod(KEY)
    try:
        queue = unique("cancel")
        loop.setup(_config(fake, queue, source))
        admin = loop.cli("keys", "create-admin", "--name", "ops").stdout.split()[-1]
        rt = Runtime(Settings.from_env(loop.env), env=loop.env)
        api = loop.serve_api(free_port())
        loop.worker("w1", concurrency=3)

        def via_cli(launch_id: str) -> str:
            return loop.cli("drain", launch_id, "--by", "ops").stdout

        def via_api(launch_id: str) -> str:
            r = requests.post(
                f"{api}/v1/admin/instances/{launch_id}/drain",
                headers={"Authorization": f"Bearer {admin}"},
                timeout=30,
            )
            assert r.status_code == 200, r.text
            return str(r.json()["message"])

        def via_celery(launch_id: str) -> str:
            loop.celery_call("autoscaler.drain", [launch_id])
            return ""  # the answer is the task's result; the row says what it did

        doors: dict[str, Callable[[str], str]] = {
            "cli": via_cli,
            "api": via_api,
            "celery": via_celery,
        }
        made = 0
        for door, drain in doors.items():
            # pending: never rented
            pending = _intent(rt, queue, f"p_{door}")
            said = drain(pending)
            row = loop.wait(partial(_ended, loop, pending), 30, f"{door}: pending cancelled")
            assert row["state"] == "failed" and CANCELLED in row["state_reason"], row
            assert door == "celery" or "nothing will be" in said, said
            assert run_step(launch.STEP, rt, pending).kind is Kind.SKIPPED

            # creating: the create is held in flight; the machine goes once it returns
            creating = _intent(rt, queue, f"c_{door}")
            fake.hold_create, fake.create_held = threading.Event(), threading.Event()
            loop.celery_call("autoscaler.launch", [creating])
            assert fake.create_held.wait(30), loop.dump()
            said = drain(creating)
            assert door == "celery" or "destroyed as soon as it exists" in said, said
            if door == "celery":
                loop.wait(partial(_cancel_marked, loop, creating), 30, "cancel marked")
            fake.hold_create.set()
            made += 1
            row = loop.wait(partial(_ended, loop, creating), 60, f"{door}: creating destroyed")
            assert row["state"] == "terminated", row
            assert row["terminating_at"] is not None and row["ready_at"] is None
            fake.hold_create = None

            # booting, no worker up yet: destroyed at once
            booting = _intent(rt, queue, f"b_{door}")
            assert run_step(launch.STEP, rt, booting).kind is Kind.DONE
            made += 1
            said = drain(booting)
            assert door == "celery" or "being destroyed" in said, said
            row = loop.wait(partial(_ended, loop, booting), 60, f"{door}: booting destroyed")
            assert row["state"] == "terminated" and row["ready_at"] is None, row

        # the fake's view: one create per launch that got that far, nothing left running
        assert len(fake.calls("POST", "/v2/pods")) == made == 6
        assert fake.live_pods() == []
        events = loop.events(queue)
        cancelled = [e for e in events if (e["kind"], e["action"]) == ("drain", "cancelled")]
        asked = [e for e in events if (e["kind"], e["action"]) == ("drain", "cancelling")]
        assert len(cancelled) == 9 and all(CANCELLED in e["reason"] for e in cancelled)
        assert [e["launch_id"] for e in asked] == ["c_cli", "c_api", "c_celery"]
        # who asked is in the audit trail, and only a closed machine is refused
        said_by = {e["launch_id"]: e["reason"] for e in cancelled if e["launch_id"][0] != "c"}
        assert "(ops asked" in said_by["b_cli"] and "(api:ops asked" in said_by["b_api"]
        assert "autoscaler.drain" in said_by["p_celery"], said_by
        refused = loop.cli("drain", "b_cli", check=False)
        assert refused.returncode == 2 and "already terminated" in refused.stderr, refused
        r = requests.post(
            f"{api}/v1/admin/instances/p_cli/drain",
            headers={"Authorization": f"Bearer {admin}"},
            timeout=30,
        )
        assert r.status_code == 409 and "already failed" in r.json()["detail"], r.text
        rt.close()
    finally:
        if fake.hold_create is not None:
            fake.hold_create.set()
        fake.close()
    assert fake.spec_violations == [], fake.spec_violations


def _intent(rt: Runtime, queue: str, name: str) -> str:
    with rt.transaction() as session:
        intents.add_intents(session, [(name, queue, "pods", "test")], datetime.now(UTC))
    return name


def _row(loop: Loop, launch_id: str) -> dict[str, Any]:
    return next(r for r in loop.instances() if r["launch_id"] == launch_id)


def _cancel_marked(loop: Loop, launch_id: str) -> bool:
    return _row(loop, launch_id)["cancel_requested_at"] is not None


def _ended(loop: Loop, launch_id: str) -> dict[str, Any] | None:
    row = _row(loop, launch_id)
    return row if row["state"] in ("terminated", "failed", "lost") else None
