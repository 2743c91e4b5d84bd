"""The worker cannot take its agent's token.

The user's worker read the agent's token from `/proc/<agent>/environ` (same uid; the agent is
PID 1 in the image) and could fetch the deployment, the private repository's token with it.
Now the agent starts itself again without the token in its environment (same PID, the token
handed over through a pipe), makes itself non-dumpable, and — running as root with
AUTOSCALER_WORKER_USER set — runs the worker as that user. A real agent process against a real
uvicorn API; the worker is the system Python, as `nobody`.
"""

from __future__ import annotations

import json
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from autoscaler.store import config_versions
from tests.agent.agentkit import AgentProc, git_repo, serve, wait_for
from tests.api.apikit import CONFIG, World, make_world

SYSTEM_PYTHON = "/usr/bin/python3"  # the worker's interpreter: readable by any account
WORKER = """
import json, os, time
me = {"uid": os.getuid(), "token_in_env": "AUTOSCALER_WORKER_TOKEN" in os.environ}
try:
    with open(f"/proc/{os.getppid()}/environ", "rb") as fh:
        me["agent_environ"] = fh.read().decode(errors="replace")
except OSError as exc:
    me["agent_environ_error"] = type(exc).__name__
with open(os.path.join(os.environ["MARKS"], "worker.json"), "w") as fh:
    json.dump(me, fh)
while True:
    time.sleep(0.2)
"""


@pytest.fixture
def world(sqlite_url, tmp_path) -> Iterator[World]:
    w = make_world(sqlite_url, tmp_path)
    try:
        yield w
    finally:
        w.close()


def _open_folder() -> Path:
    """A folder any account can reach (a test's own tmp_path is root's alone)."""
    path = Path(tempfile.mkdtemp(prefix="asg-agent-token-"))
    path.chmod(0o777)
    return path


def test_the_token_leaves_the_agents_environment_and_the_worker_runs_as_another_user(
    world, tmp_path
):
    shared = _open_folder()
    marks = shared / "marks"
    marks.mkdir()
    marks.chmod(0o777)
    url = git_repo(shared / "repo", {"worker.py": WORKER})
    for p in (shared / "repo").rglob("*"):
        p.chmod(p.stat().st_mode | stat.S_IROTH | (stat.S_IXOTH if p.is_dir() else 0))
    doc = json.loads(json.dumps(CONFIG))
    doc["queues"]["q1"]["deployment"] = {
        "git_url": url,
        "git_ref": "main",
        "startup_cmd": f"{SYSTEM_PYTHON} worker.py",
        "env": {"MARKS": str(marks)},
    }
    with world.rt.transaction() as session:
        config_versions.record(session, doc, "test", datetime.now(UTC), "token test")
    token = world.tokens["m1"]
    with serve(world) as api:
        env = {
            "AUTOSCALER_API_URL": api,
            "AUTOSCALER_WORKER_TOKEN": token,
            "AUTOSCALER_LAUNCH_ID": "m1",
            "AUTOSCALER_QUEUE": "q1",
            "AUTOSCALER_HEARTBEAT_INTERVAL": "0.3",
            "AUTOSCALER_AGENT_WORKDIR": str(shared / "work"),
            "AUTOSCALER_WORKER_USER": "nobody",
        }
        agent = AgentProc(env, tmp_path / "agent.log")
        try:
            report = marks / "worker.json"
            wait_for(report.exists, 30, "the worker's report", agent.text)
            # the agent's own environment, as the kernel shows it: no token (read as root)
            environ = Path(f"/proc/{agent.popen.pid}/environ").read_bytes()
            assert token.encode() not in environ and b"AUTOSCALER_WORKER_TOKEN" not in environ
            assert world.row("m1").agent_registered_at is not None  # it still used the token
            seen = json.loads(report.read_text())
            assert seen["uid"] == 65534 and seen["token_in_env"] is False, seen
            # as another user, the worker cannot read the agent's /proc files at all
            assert seen.get("agent_environ_error") == "PermissionError", seen
            assert token not in agent.text()
        finally:
            agent.stop()
            shutil.rmtree(shared, ignore_errors=True)


def test_the_agent_makes_itself_non_dumpable():
    """PR_GET_DUMPABLE (3) reads 0 once the guard ran: no process of its uid may ptrace it or
    read its /proc files."""
    code = (
        "import ctypes; from autoscaler.agent.guard import not_dumpable; "
        "ok = not_dumpable(); print(ok, ctypes.CDLL(None).prctl(3, 0, 0, 0, 0))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["True", "0"], out
