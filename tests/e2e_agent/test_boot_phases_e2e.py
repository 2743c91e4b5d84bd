"""e2e of boot phases on the local provider: the real launch step rents a local machine, whose
process is the real agent (the local provider's default command); it registers with a real
API (uvicorn), clones a Git repository made by the test, installs its requirements (a
comment: nothing), starts a worker that takes a "task", and reports each phase as it happens
(its heartbeat every 0.3 s instead of 10).
The phases arrive in their order, for this boot, with the provider, GPU and host of the
instance row (the control plane's, not the machine's word); the row is ready from the agent's
heartbeat, and its boot time (launch → ready) is the one `boot_stats` counts.

No beat, no Celery worker, no broker: seconds, not minutes (the full loops are in
test_agent_e2e.py and test_warm_pool_e2e.py)."""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
import uvicorn

from autoscaler.api.app import create_app
from autoscaler.control.runtime import Runtime
from autoscaler.control.steps import launch
from autoscaler.control.steps.frame import Kind, run_step
from autoscaler.lifecycle import InstanceState as S
from autoscaler.policy.boots import BOOT_PHASES
from autoscaler.providers.local import DEFAULT_COMMAND
from autoscaler.settings import Settings
from autoscaler.store import boot_phases, boots, config_versions, instances, intents, migrate
from autoscaler.store.db import store_now
from tests.agent.agentkit import free_port, git_repo, wait_for

QUEUE = "e2e-phases"
AGENT = f"AUTOSCALER_HEARTBEAT_INTERVAL=0.3 {DEFAULT_COMMAND}"
WORKER = """
import json, os, signal, time
path = os.environ["AUTOSCALER_STATUS_FILE"]
stop = []
signal.signal(signal.SIGTERM, lambda *a: stop.append(1))
time.sleep(0.3)
with open(path + ".tmp", "w") as fh:
    json.dump({"running": 1}, fh)  # a task runs
os.replace(path + ".tmp", path)
while not stop:
    time.sleep(0.05)
"""


@contextlib.contextmanager
def api_on(rt: Runtime, port: int) -> Iterator[None]:
    server = uvicorn.Server(
        uvicorn.Config(create_app(rt), host="127.0.0.1", port=port, log_level="warning")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        assert time.monotonic() < deadline, "the API did not start"
        time.sleep(0.05)
    try:
        yield
    finally:
        server.should_exit = True
        thread.join(timeout=10)


def config(repo: str) -> dict[str, object]:
    return {
        "poll_interval": 5,
        # the local provider's default command (the agent), heartbeating every 0.3 s
        "providers": {"desk": {"kind": "local", "command": AGENT}},
        "queues": {
            QUEUE: {
                "deployment": {
                    "git_url": repo,
                    "git_ref": "main",
                    "startup_cmd": f"{sys.executable} worker.py",
                },
                # never read here; a source with no per-machine broker user
                "metrics": {"source": "redis-list", "url": "redis://127.0.0.1:6379/11"},
                "autoscale": {
                    "provider": "desk",
                    "max_workers": 1,
                    "scale_up": [{"trigger": "no_workers"}],
                    "instance": {"gpu": "RTX 4090", "max_price_per_hour": 1.0},
                },
            }
        },
    }


def machine_log(home: Path) -> str:
    logs = sorted((home / "local-machines").rglob("*.log"))
    return "\n".join(p.read_text(errors="replace")[-3000:] for p in logs)


@pytest.mark.timeout(90)
def test_e2e_local_machine_reports_its_phases_in_order_with_the_rows_provider_gpu_and_host(
    sqlite_url, tmp_path
):
    port = free_port()
    home = tmp_path / "home"
    repo = git_repo(
        tmp_path / "repo", {"worker.py": WORKER, "requirements.txt": "# nothing to install\n"}
    )
    migrate.upgrade(sqlite_url)
    env = {
        "AUTOSCALER_DATABASE_URL": sqlite_url,
        "AUTOSCALER_HOME": str(home),
        "AUTOSCALER_API_URL": f"http://127.0.0.1:{port}",
    }
    rt = Runtime(Settings.from_env(env), env=env)
    machine_id = None
    try:
        with rt.transaction() as session:
            now = store_now(session)
            version = config_versions.record(session, config(repo), "e2e", now, "phases")
            assert version is not None
            intents.add_intents(
                session,
                [intents.Intent("phases1", QUEUE, "desk", "e2e: one machine")],
                now,
                config_version=version.version,
            )
        with api_on(rt, port):
            outcome = run_step(launch.STEP, rt, "phases1")
            assert outcome.kind is Kind.DONE, outcome
            with rt.transaction() as session:
                row = instances.get(session, "phases1")
                assert row is not None
                machine_id = row.provider_instance_id

            def kept() -> list[tuple[int, str, datetime, str, str | None, str | None]]:
                with rt.transaction() as session:
                    return [
                        (p.boot, p.phase, p.at, p.provider, p.gpu, p.host_id)
                        for p in boot_phases.of_launch(session, "phases1")
                    ]

            got = wait_for(
                lambda: (k := kept()) and len(k) == len(BOOT_PHASES) and k,
                60,
                "every boot phase from the machine's agent",
                lambda: machine_log(home),
            )
        with rt.transaction() as session:
            row = instances.get(session, "phases1")
            assert row is not None
            stats = boots.boot_stats(session, store_now(session))
        # in their order, for the cold boot, with the row's provider, GPU and host
        assert [p for _, p, *_ in sorted(got, key=lambda g: g[2])] == list(BOOT_PHASES)
        assert row.provider == "desk" and row.gpu == "RTX 4090"
        assert row.host_id == os.uname().nodename
        assert {(b, prov, gpu, host) for b, _, _, prov, gpu, host in got} == {
            (0, "desk", "RTX 4090", row.host_id)
        }
        at = {p: t for _, p, t, *_ in got}
        assert row.created_at <= at["started"] <= at["first_job"] <= datetime.now(UTC)
        # ready from the agent's heartbeat, before its worker could take a task
        assert row.state == S.READY and row.ready_at is not None
        assert row.ready_at <= at["first_job"]
        # what boot statistics count: the control plane's launch → ready, this one boot
        stat = stats[("desk", "RTX 4090")]
        assert stat.samples == 1
        assert stat.median == pytest.approx((row.ready_at - row.created_at).total_seconds())
    finally:
        if machine_id is not None:
            rt.provider("desk").destroy(machine_id)
        rt.close()
