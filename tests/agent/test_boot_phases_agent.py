"""The agent reports its boot's phases as they happen (wall clock, UTC) to the real API:
started, registered, code fetched, requirements installed, worker up, and first job at the
first heartbeat that saw a task running. A report that cannot be sent waits for the next; one
the API refuses is dropped; neither stops the boot."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import update

from autoscaler.agent.run import Agent
from autoscaler.agent.server_api import AgentConfig
from autoscaler.lifecycle import InstanceState as S
from autoscaler.policy.boots import BOOT_PHASES
from autoscaler.store import boot_phases, config_versions
from autoscaler.store.models import Instance
from tests.agent.agentkit import AgentProc, free_port, git_repo, serve, wait_for
from tests.api.apikit import CONFIG, World, add_machine, make_world

WORKER = """
import json, os, signal, time
path = os.environ["AUTOSCALER_STATUS_FILE"]
stop = []
signal.signal(signal.SIGTERM, lambda *a: stop.append(1))
time.sleep(0.5)
with open(path + ".tmp", "w") as fh:
    json.dump({"running": 1}, fh)
os.replace(path + ".tmp", path)
while not stop:
    time.sleep(0.05)
"""


@pytest.fixture
def world(sqlite_url, tmp_path) -> Iterator[World]:
    w = make_world(sqlite_url, tmp_path)
    try:
        yield w
    finally:
        w.close()


def _phases(world: World, launch_id: str) -> list[tuple[int, str, datetime, datetime]]:
    with world.rt.transaction() as session:
        return [
            (p.boot, p.phase, p.at, p.received_at)
            for p in boot_phases.of_launch(session, launch_id)
        ]


@pytest.mark.timeout(60)
def test_the_agent_reports_each_phase_as_it_happens(world, tmp_path):
    url = git_repo(tmp_path / "repo", {"worker.py": WORKER})
    doc = json.loads(json.dumps(CONFIG))
    doc["queues"]["q1"]["deployment"] = {
        "git_url": url,
        "git_ref": "main",
        "startup_cmd": f"{sys.executable} worker.py",
    }
    with world.rt.transaction() as session:
        config_versions.record(session, doc, "test", datetime.now(UTC), "phases")
    token = add_machine(world.rt, "b1", S.BOOTING)
    with world.rt.transaction() as session:
        session.execute(
            update(Instance)
            .where(Instance.launch_id == "b1")
            .values(gpu="RTX 4090", host_id="desk-host", created_at=datetime.now(UTC))
        )
    before = datetime.now(UTC)
    with serve(world) as api:
        env = {
            "AUTOSCALER_API_URL": api,
            "AUTOSCALER_WORKER_TOKEN": token,
            "AUTOSCALER_LAUNCH_ID": "b1",
            "AUTOSCALER_QUEUE": "q1",
            "AUTOSCALER_HEARTBEAT_INTERVAL": "0.3",
            "AUTOSCALER_AGENT_WORKDIR": str(tmp_path / "work"),
        }
        agent = AgentProc(env, tmp_path / "agent.log")
        try:
            wait_for(
                lambda: len(_phases(world, "b1")) == len(BOOT_PHASES),
                30,
                "every phase kept",
                agent.text,
            )
        finally:
            agent.stop()
    got = _phases(world, "b1")
    assert [p for _, p, _, _ in sorted(got, key=lambda g: g[2])] == list(BOOT_PHASES)
    assert {b for b, *_ in got} == {0}  # a cold boot
    at = {p: t for _, p, t, _ in got}
    assert before - timedelta(seconds=1) <= at["started"]
    # first job: the heartbeat that saw the task, after the worker started (0.5 s later)
    assert (at["first_job"] - at["worker_up"]).total_seconds() >= 0.4
    # each phase was reported as it happened, not all at the end: registered was received
    # before the worker was up
    received = {p: r for _, p, _, r in got}
    assert received["registered"] <= at["worker_up"] + timedelta(seconds=1)
    assert received["registered"] < received["first_job"]
    assert world.row("b1").state == S.READY


def test_unsent_phases_wait_for_the_next_report_and_refused_ones_are_dropped(world, tmp_path):
    dead = f"http://127.0.0.1:{free_port()}"  # nobody listens there
    cfg = AgentConfig(api_url=dead, token=world.tokens["m1"], launch_id="m1", queue="q1")
    cfg.workdir = tmp_path / "w"
    agent = Agent(cfg)
    agent.phase("started")
    agent.phase("started", 1.0)  # a phase is noted once
    first = agent.phases["started"]
    agent.report_phases()  # unreachable: kept for the next report
    assert agent.phases_sent == set() and agent.phases["started"] == first
    with pytest.raises(ValueError):
        agent.phase("rebooted")
    with serve(world) as api:
        agent.cfg.api_url = api
        agent.phase("registered")
        agent.report_phases()
        assert agent.phases_sent == {"started", "registered"}
        assert [p for _, p, _, _ in _phases(world, "m1")] == ["started", "registered"]
        # another machine's id with this token: the API refuses (403); dropped, not resent
        other = Agent(
            AgentConfig(api_url=api, token=world.tokens["m1"], launch_id="m2", workdir=tmp_path)
        )
        other.phase("started")
        other.report_phases()
        assert other.phases_sent == {"started"} and _phases(world, "m2") == []
        # a hand-made machine reports none (the route is a worker token's)
        hand = Agent(AgentConfig(api_url=api, token=world.enrolment, queue="q1", workdir=tmp_path))
        hand.phase("started")
        hand.report_phases()
        assert hand.phases_sent == set()
