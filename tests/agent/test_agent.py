"""The agent against the real API (uvicorn) and a Git repository made by the test: register,
clone at the ref, install requirements, run the worker, heartbeat its status file, drain with
a warm shutdown (the running task finishes), report a crash; a hand-made machine's agent is
counted as capacity and never told to drain."""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from sqlalchemy import select

from autoscaler.agent.run import BUSY_POLL
from autoscaler.control.observe import read_sightings
from autoscaler.lifecycle import InstanceState as S
from autoscaler.store import config_versions
from autoscaler.store.models import ScaleEvent
from tests.agent.agentkit import AgentProc, git_repo, serve, wait_for
from tests.api.apikit import CONFIG, World, make_world

WORKER = """
import json, os, signal, sys, time
path = os.environ["AUTOSCALER_STATUS_FILE"]
out = os.path.join(os.environ["MARKS"], "marks.jsonl")
assert "AUTOSCALER_WORKER_TOKEN" not in os.environ  # the worker never holds the token
stop = []
signal.signal(signal.SIGTERM, lambda *a: stop.append(time.time()))

def mark(what):
    with open(out, "a") as fh:
        fh.write(json.dumps({"what": what, "at": time.time()}) + "\\n")

def status(running, last=None):
    if os.path.exists("use_http"):  # the small HTTP call instead of the file
        import urllib.request

        body = json.dumps({"running": running, "last_task_at": last}).encode()
        req = urllib.request.Request(os.environ["AUTOSCALER_STATUS_URL"], data=body)
        urllib.request.urlopen(req, timeout=5).close()
        return
    with open(path + ".tmp", "w") as fh:
        json.dump({"running": running, "last_task_at": last}, fh)
    os.replace(path + ".tmp", path)

if os.path.exists("crash"):
    mark("crashing")
    time.sleep(0.5)
    sys.exit(3)
mark("start-task")
status(1)
end = time.time() + float(open("task_seconds").read())
while time.time() < end:
    time.sleep(0.05)
status(0, time.time())
mark("end-task")
while not stop:
    time.sleep(0.05)
mark("stopped")
"""


@pytest.fixture
def world(sqlite_url, tmp_path) -> Iterator[World]:
    w = make_world(sqlite_url, tmp_path)
    try:
        yield w
    finally:
        w.close()


def deploy(
    world: World, tmp_path: Path, *, crash: bool = False, seconds: float = 3.0, http: bool = False
) -> Path:
    marks = tmp_path / "marks"
    marks.mkdir()
    files = {
        "worker.py": WORKER,
        "task_seconds": str(seconds),
        "requirements.txt": "# nothing to install\n",
    }
    if crash:
        files["crash"] = ""
    if http:
        files["use_http"] = ""
    url = git_repo(tmp_path / "repo", files)
    doc = json.loads(json.dumps(CONFIG))
    doc["queues"]["q1"]["deployment"] = {
        "git_url": url,
        "git_ref": "main",
        "startup_cmd": f"{sys.executable} worker.py",
    }
    with world.rt.transaction() as session:
        config_versions.record(session, doc, "test", datetime.now(UTC), "agent test")
    return marks


def agent_env(world: World, api: str, tmp_path: Path, marks: Path) -> dict[str, str]:
    return {
        "AUTOSCALER_API_URL": api,
        "AUTOSCALER_WORKER_TOKEN": world.tokens["m1"],
        "AUTOSCALER_LAUNCH_ID": "m1",
        "AUTOSCALER_QUEUE": "q1",
        "AUTOSCALER_HEARTBEAT_INTERVAL": "0.3",
        "AUTOSCALER_AGENT_WORKDIR": str(tmp_path / "work"),
        "MARKS": str(marks),
    }


def marks_of(marks: Path) -> list[str]:
    f = marks / "marks.jsonl"
    return [json.loads(x)["what"] for x in f.read_text().splitlines()] if f.exists() else []


@pytest.mark.timeout(60)
@pytest.mark.parametrize("report", ["status-file", "http"])
def test_agent_registers_deploys_heartbeats_and_drains_after_its_task(world, tmp_path, report):
    marks = deploy(world, tmp_path, seconds=3.0, http=report == "http")
    with serve(world) as api:
        agent = AgentProc(agent_env(world, api, tmp_path, marks), tmp_path / "agent.log")
        try:
            dump = agent.text
            wait_for(lambda: world.row("m1").running_tasks == 1, 30, "busy", dump)
            row = world.row("m1")
            assert row.worker_name == "agent@m1" and row.agent_registered_at is not None
            # the control plane drains it while its task runs
            world.set_state("m1", S.DRAINING)
            assert agent.wait_exit(30) == 0, agent.text()
            assert world.row("m1").state == S.TERMINATING
            got = marks_of(marks)
            # the task was not cut short: it ended, then the worker stopped
            assert got == ["start-task", "end-task", "stopped"], (got, agent.text())
            assert world.row("m1").last_task_at is not None
            assert (tmp_path / "work" / "repo" / "worker.py").is_file()
        finally:
            agent.stop()


@pytest.mark.timeout(90)
def test_a_worker_turning_busy_is_reported_at_once_not_a_heartbeat_later(world, tmp_path):
    """Heartbeats every 60 s: the worker's first job is reported within the agent's status
    poll of its idle heartbeat (a machine the control plane believes idle may be drained with
    the job in hand), and a worker that stays busy sends nothing more until the interval."""
    marks = deploy(world, tmp_path, seconds=30.0)
    with serve(world) as api:
        env = agent_env(world, api, tmp_path, marks) | {"AUTOSCALER_HEARTBEAT_INTERVAL": "60"}
        agent = AgentProc(env, tmp_path / "agent.log")
        try:
            wait_for(lambda: world.row("m1").running_tasks == 1, 20, "busy at once", agent.text)
            first = world.row("m1").last_heartbeat_at
            wait_for(lambda: "start-task" in marks_of(marks), 10, "the task runs", agent.text)
            time.sleep(2 * BUSY_POLL + 1.0)  # several status polls while it stays busy
            assert world.row("m1").last_heartbeat_at == first, agent.text()
        finally:
            agent.stop()


@pytest.mark.timeout(60)
def test_agent_reports_a_crashed_worker_and_exits(world, tmp_path):
    marks = deploy(world, tmp_path, crash=True)
    with serve(world) as api:
        agent = AgentProc(agent_env(world, api, tmp_path, marks), tmp_path / "agent.log")
        try:
            assert agent.wait_exit(30) == 1, agent.text()
            with world.rt.transaction() as session:
                crashed = session.scalars(
                    select(ScaleEvent).where(
                        ScaleEvent.kind == "agent", ScaleEvent.action == "crashed"
                    )
                ).all()
                assert crashed and "code 3" in crashed[0].reason
            assert "exited on its own (code 3)" in agent.text()
        finally:
            agent.stop()


@pytest.mark.timeout(60)
def test_agent_refuses_a_wrong_token_and_says_why(world, tmp_path):
    marks = deploy(world, tmp_path)
    with serve(world) as api:
        env = agent_env(world, api, tmp_path, marks) | {"AUTOSCALER_WORKER_TOKEN": "nope"}
        agent = AgentProc(env, tmp_path / "agent.log")
        try:
            assert agent.wait_exit(30) == 2
            assert "HTTP 401" in agent.text() and world.tokens["m1"] not in agent.text()
        finally:
            agent.stop()


@pytest.mark.timeout(60)
def test_hand_made_agent_is_counted_and_never_drained(world, tmp_path):
    marks = deploy(world, tmp_path, seconds=0.2)
    with serve(world) as api:
        env = {
            "AUTOSCALER_API_URL": api,
            "AUTOSCALER_ENROLMENT_KEY": world.enrolment,
            "AUTOSCALER_HEARTBEAT_INTERVAL": "0.3",
            "AUTOSCALER_AGENT_WORKDIR": str(tmp_path / "work"),
            "MARKS": str(marks),
        }
        agent = AgentProc(env, tmp_path / "agent.log", "--queue", "q1", "--name", "desk-7")

        def counted() -> bool:
            with world.rt.transaction() as session:
                seen, _, _ = read_sightings(session, "x", set(), datetime.now(UTC), 60)
            return seen.get("q1") == ("agent@desk-7",)

        try:
            wait_for(counted, 30, "the hand-made machine counted", agent.text)
            wait_for(lambda: "end-task" in marks_of(marks), 30, "its task", agent.text)
            assert agent.popen.poll() is None  # never told to drain
            agent.stop()
            assert agent.popen.returncode == 0, agent.text()
            assert marks_of(marks)[-1] == "stopped"
        finally:
            agent.stop()


def test_heartbeats_carry_finished_jobs_once_and_forget_gone_children(world, tmp_path):
    """Through the real API: a child's jobs are sent once, its file removed once it is gone and
    its jobs went; its last "running" never counts; a job the API cannot take never costs the
    heartbeat (clocks that disagree are clamped)."""
    from sqlalchemy import select

    from autoscaler.agent.run import Agent
    from autoscaler.agent.server_api import AgentConfig
    from autoscaler.agent.worker_status import read_status
    from autoscaler.store.models import JobRecord

    work = tmp_path / "work"
    work.mkdir()
    gone = 2**22 + 12345  # above any pid this machine hands out
    now = datetime.now(UTC).timestamp()
    jobs = [
        {
            "id": "j1",
            "queue": "q1",
            "published_at": now - 9,
            "started_at": now - 8,
            "finished_at": now - 5,
        },
        # a producer clock ahead, a worker clock stepping back: clamped, not refused
        {
            "id": "j2",
            "queue": "odd/key",
            "published_at": now - 1,
            "started_at": now - 4,
            "finished_at": now - 6,
        },
    ]
    (work / f"status.json.{gone}").write_text(json.dumps({"running": 1, "jobs": jobs}))
    live = work / f"status.json.{os.getpid()}"
    live.write_text(json.dumps({"running": 1}))
    assert read_status(str(work / "status.json"))[0] == 1  # the live child only
    with serve(world) as api:
        agent = Agent(AgentConfig.from_env(agent_env(world, api, tmp_path, tmp_path)))
        agent.beat("auto")
        agent.beat("auto")
    with world.rt.transaction() as session:
        rows = session.scalars(select(JobRecord).order_by(JobRecord.task_id)).all()
        got = [(r.task_id, r.queue, r.runtime_s, r.arrived_at <= r.started_at) for r in rows]
    assert got == [("j1", "q1", pytest.approx(3.0), True), ("j2", "q1", 0.0, True)]
    assert not (work / f"status.json.{gone}").exists() and live.exists()


@pytest.mark.timeout(60)
def test_the_agent_asks_before_starting_its_worker_and_a_cancelled_machine_starts_none(
    world, tmp_path
):
    """The heartbeat that says the worker starts comes first: on a booting machine it makes
    the machine ready (then the worker may take jobs); on one cancelled while its agent
    deployed (its token dead) or drained before its worker ran, nothing is started."""
    from autoscaler.agent.run import Agent
    from autoscaler.agent.server_api import AgentConfig
    from autoscaler.control.steps.drain import DrainStep
    from autoscaler.control.steps.frame import Kind, run_step
    from tests.api.apikit import add_machine

    with serve(world) as api:

        def agent_of(launch_id: str, token: str) -> Agent:
            cfg = AgentConfig(api_url=api, token=token, launch_id=launch_id, queue="q1")
            cfg.workdir = tmp_path / launch_id
            agent = Agent(cfg)
            agent.register()
            return agent

        # booting: ready on the agent's word, before any job could run
        booting = agent_of("m4", add_machine(world.rt, "m4", S.BOOTING))
        assert world.row("m4").state == S.BOOTING
        assert booting.may_start() is True and world.row("m4").state == S.READY
        # cancelled while its agent deployed: its token is dead, no worker starts
        cancelled = agent_of("m5", add_machine(world.rt, "m5", S.BOOTING))
        said = run_step(DrainStep("ops asked to drain it"), world.rt, "m5")
        assert said.kind is Kind.CANCELLED and "being destroyed" in str(said), said
        assert cancelled.may_start() is False and cancelled.proc is None
        assert world.row("m5").state == S.TERMINATING
        # drained before its worker ran: reported drained, no worker starts
        drained = agent_of("m6", add_machine(world.rt, "m6", S.READY))
        world.set_state("m6", S.DRAINING)
        assert drained.may_start() is False and drained.proc is None
        assert world.row("m6").state == S.TERMINATING
        # cancelled between the heartbeat's token check and its write: told to drain, its
        # drained report refused (the token died with the move); nothing starts, no error
        raced = agent_of("m7", add_machine(world.rt, "m7", S.BOOTING))
        with _committed_before_the_heartbeat_write("m7", S.BOOTING, S.TERMINATING, world):
            assert raced.may_start() is False and raced.proc is None
        assert world.row("m7").state == S.TERMINATING


@contextlib.contextmanager
def _committed_before_the_heartbeat_write(
    launch_id: str, src: S, dst: S, world: World
) -> Iterator[None]:
    """Another transaction moves `launch_id` src -> dst just before the heartbeat's write."""
    import sqlalchemy as sa

    from autoscaler.store.models import Instance

    other = sa.create_engine(world.rt.settings.database_url)
    fired: list[bool] = []

    def move_first(conn, cursor, statement, params, context, executemany):
        sql = statement.lower()
        if fired or conn.engine is other or not sql.startswith("update instances"):
            return
        if "running_tasks" not in sql:
            return
        fired.append(True)
        with other.begin() as c:
            c.execute(
                sa.update(Instance)
                .where(Instance.launch_id == launch_id, Instance.state == src)
                .values(state=dst)
            )

    sa.event.listen(sa.engine.Engine, "before_cursor_execute", move_first)
    try:
        yield
    finally:
        sa.event.remove(sa.engine.Engine, "before_cursor_execute", move_first)
        other.dispose()
    assert fired, "no heartbeat write: the race was not staged"
