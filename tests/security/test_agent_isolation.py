"""The agent imports and runs nothing it did not bring.

A security review found: `autoscaler agent` started in a folder where the worker (another uid)
had left `autoscaler/__init__.py` imported it in its re-exec (`python -m` puts the cwd first on
the path): the planted code ran as root and read the worker token from the hand-over pipe; the
image's entrypoint started in the worker's home folder, kept across a warm pool's stop. And a
warm deploy ran `python -m pip` in the checkout, where the worker had left `pip/` after
rewriting `deploy.json` to force an install.

Now the re-exec is `python -I` from `/`, the image's entrypoint the same; git is the system's
(found on a fixed PATH), pip is `python -I -m pip`, both with a clean environment; and
`deploy.json` is trusted only when it is the agent's own (its uid, one link, writable by no
group or other), else ignored: a cold deploy. Real agent processes against a real API (uvicorn),
real git and pip. Every planted thing appends a line to a marker file: there must be none (of
the agent's process, for code a worker of the same environment may import itself).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import stat
import sys
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from autoscaler.agent.deploy import STATE, Deployed, prepare
from autoscaler.store import config_versions
from tests.agent.agentkit import (
    AgentProc,
    deployment,
    git_commit,
    git_repo,
    make_wheel,
    serve,
    wait_for,
)
from tests.api.apikit import CONFIG, World, make_world

ROOT = Path(__file__).resolve().parents[2]
ENTRYPOINT = ROOT / "deploy" / "worker" / "entrypoint.sh"
IMAGE_PYTHON = "/opt/autoscaler/venv/bin/python"


def planted_code(marks: Path, what: str) -> str:
    """Python that says it ran: a line in `marks` with its pid."""
    return (
        "import json, os, sys\n"
        f"with open({str(marks)!r}, 'a') as fh:\n"
        f"    fh.write(json.dumps({{'what': {what!r}, 'pid': os.getpid(),\n"
        "                         'argv': list(getattr(sys, 'argv', []))}) + '\\n')\n"
    )


def planted_program(marks: Path, what: str) -> str:
    """A program that says it ran, then fails."""
    return f'#!/bin/sh\necho \'{{"what": "{what}", "pid": 0}}\' >> {marks}\nexit 1\n'


def ran(marks: Path) -> list[dict[str, Any]]:
    if not marks.exists():
        return []
    return [json.loads(line) for line in marks.read_text().splitlines() if line.strip()]


def _executable(path: Path, text: str) -> None:
    path.write_text(text)
    path.chmod(0o755)


# --- (a) the agent's own interpreter ------------------------------------------------------

WORKER = """
import os, time
open(os.path.join(os.environ["MARKS"], "worker-started"), "w").close()
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


@pytest.fixture
def deployed(world, tmp_path) -> Path:
    """The queue's deployment: a worker that says it started (then the agent ran through)."""
    marks = tmp_path / "marks"
    marks.mkdir()
    url = git_repo(tmp_path / "src", {"worker.py": WORKER})
    doc = json.loads(json.dumps(CONFIG))
    doc["queues"]["q1"]["deployment"] = {
        "git_url": url,
        "git_ref": "main",
        "startup_cmd": f"{sys.executable} worker.py",
        "env": {"MARKS": str(marks)},
    }
    with world.rt.transaction() as session:
        config_versions.record(session, doc, "test", datetime.now(UTC), "isolation test")
    return marks


def _plant_package(folder: Path, marks: Path) -> None:
    """`autoscaler/__init__.py` (and a `sitecustomize.py`) in `folder`, as a worker leaves them."""
    (folder / "autoscaler").mkdir(parents=True)
    (folder / "autoscaler" / "__init__.py").write_text(planted_code(marks, "autoscaler"))
    (folder / "sitecustomize.py").write_text(planted_code(marks, "sitecustomize"))


def _run_agent(
    world: World, api: str, marks: Path, log: Path, command: list[str], cwd: Path, **env: str
) -> AgentProc:
    base = {
        "AUTOSCALER_API_URL": api,
        "AUTOSCALER_WORKER_TOKEN": world.tokens["m1"],
        "AUTOSCALER_LAUNCH_ID": "m1",
        "AUTOSCALER_QUEUE": "q1",
        "AUTOSCALER_HEARTBEAT_INTERVAL": "0.3",
    }
    agent = AgentProc(base | env, log, command=command, cwd=cwd)
    wait_for((marks / "worker-started").exists, 60, "the worker", agent.text)
    return agent


def test_the_agent_started_in_a_folder_holding_a_planted_package_does_not_import_it(
    world, deployed, tmp_path
):
    """`autoscaler agent` (the console script) from a folder where the worker left
    `autoscaler/__init__.py`: its re-exec, the process that takes the token, imports none of
    it. A relative --workdir is still the one under that folder."""
    script = Path(sys.executable).with_name("autoscaler")
    if not script.is_file():
        pytest.skip("no `autoscaler` console script next to this interpreter")
    planted = tmp_path / "planted"
    marker = tmp_path / "planted.jsonl"
    _plant_package(planted, marker)
    with serve(world) as api:
        agent = _run_agent(
            world,
            api,
            deployed,
            tmp_path / "agent.log",
            [str(script), "agent", "--workdir", "work"],
            planted,
        )
        try:
            assert world.row("m1").agent_registered_at is not None
            assert ran(marker) == [], agent.text()[-2000:]
            assert (planted / "work" / STATE).is_file()  # the folder named, relative to its cwd
            with contextlib.suppress(PermissionError):  # non-dumpable: root may look
                assert os.readlink(f"/proc/{agent.popen.pid}/cwd") == "/"
        finally:
            agent.stop()


def test_the_images_entrypoint_imports_nothing_from_its_folder_or_a_pythonpath(
    world, deployed, tmp_path
):
    """The image's entrypoint (deploy/worker/entrypoint.sh, its interpreter this one), started
    in a folder holding a planted package and with PYTHONPATH naming another: neither the
    agent's first process nor its re-exec imports any of it (the worker, whose environment is
    made from the agent's, may: it is the worker's own process)."""
    text = ENTRYPOINT.read_text()
    assert IMAGE_PYTHON in text
    planted, other = tmp_path / "planted", tmp_path / "on-pythonpath"
    marker = tmp_path / "planted.jsonl"
    _plant_package(planted, marker)
    _plant_package(other, marker)
    with serve(world) as api:
        agent = _run_agent(
            world,
            api,
            deployed,
            tmp_path / "agent.log",
            ["/bin/sh", "-c", text.replace(IMAGE_PYTHON, sys.executable), "entrypoint"],
            planted,
            PYTHONPATH=str(other),
            AUTOSCALER_AGENT_WORKDIR=str(tmp_path / "work"),
        )
        try:
            mine = [r for r in ran(marker) if r["pid"] == agent.popen.pid]
            assert mine == [], agent.text()[-2000:]
            assert not any("autoscaler.cli" in " ".join(r["argv"]) for r in ran(marker))
        finally:
            agent.stop()


def test_the_worker_image_starts_in_a_folder_its_worker_cannot_write():
    lines = (ROOT / "deploy" / "worker" / "Dockerfile").read_text().splitlines()
    workdirs = [x.split(None, 1)[1].strip() for x in lines if x.startswith("WORKDIR ")]
    assert workdirs and workdirs[-1] == "/", workdirs
    exec_line = [x for x in ENTRYPOINT.read_text().splitlines() if x.startswith("exec ")]
    assert exec_line == [f'exec {IMAGE_PYTHON} -I -u -m autoscaler.cli agent "$@"']
    assert "\ncd /\n" in ENTRYPOINT.read_text()


# --- (b) the tools a deploy runs ----------------------------------------------------------


@pytest.fixture
def wheels(tmp_path, monkeypatch) -> Path:
    """pip's only source: a folder of wheels (no index)."""
    folder = tmp_path / "wheels"
    folder.mkdir()
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(folder))
    make_wheel(folder, "asgmarker", "1.0")
    make_wheel(folder, "asgmarker", "2.0")
    return folder


@pytest.fixture
def source(tmp_path, wheels) -> tuple[Path, str]:
    src = tmp_path / "src"
    url = git_repo(src, {"tasks.py": "X = 1\n", "requirements.txt": "asgmarker==1.0\n"})
    return src, url


def start(url: str, work: Path) -> Deployed:
    return prepare(deployment(git_url=url, git_ref="main"), work)


@pytest.mark.parametrize("dot_on_path", [False, True], ids=["path", "dot-on-path"])
def test_a_planted_pip_or_git_in_the_checkout_or_cwd_never_runs(
    source, tmp_path, monkeypatch, dot_on_path
):
    """After a first deploy the worker leaves a `pip/` package and `pip.py`, and executables
    `git` and `pip`, in the checkout and in the agent's cwd (and `.` and an empty entry on the
    agent's PATH, or not); the requirements change, so the next (warm) deploy installs: with
    the real pip, the real git."""
    src, url = source
    work = tmp_path / "work"
    assert start(url, work).install == "installed"
    marker = tmp_path / "planted.jsonl"
    repo, cwd = work / "repo", tmp_path / "cwd"
    cwd.mkdir()
    for folder in (repo, cwd):
        (folder / "pip.py").write_text(planted_code(marker, f"pip.py in {folder.name}"))
        _executable(folder / "git", planted_program(marker, f"git in {folder.name}"))
    (repo / "pip").mkdir()
    for name in ("__init__.py", "__main__.py"):
        (repo / "pip" / name).write_text(planted_code(marker, f"pip/{name} in the checkout"))
    _executable(cwd / "pip", planted_program(marker, "pip in the cwd"))
    new = git_commit(src, {"requirements.txt": "asgmarker==2.0\n"})
    monkeypatch.chdir(cwd)
    if dot_on_path:
        monkeypatch.setenv("PATH", os.pathsep.join([".", "", os.environ["PATH"]]))

    again = start(url, work)
    assert ran(marker) == []
    assert (again.checkout, again.install, again.commit) == ("kept", "installed", new)
    init = work / "site-packages" / "asgmarker" / "__init__.py"
    assert "VERSION = '2.0'" in init.read_text()


# --- (c) the warm state file --------------------------------------------------------------


def _group_writable(state: Path, tmp_path: Path) -> None:
    state.chmod(0o664)


def _rewritten_by_another(state: Path, tmp_path: Path) -> None:
    """What the worker does to force an install: a new record (its own file, as it can only
    make one: here writable by others) saying something else was installed."""
    doc = json.loads(state.read_text())
    doc["install"]["requirements_sha256"] = "0" * 64
    state.unlink()
    state.write_text(json.dumps(doc))
    state.chmod(0o666)


def _hard_linked(state: Path, tmp_path: Path) -> None:
    os.link(state, tmp_path / "a-link-to-the-record")


def _owned_by_another(state: Path, tmp_path: Path) -> None:
    os.chown(state, 65534, 65534)


def _a_link(state: Path, tmp_path: Path) -> None:
    copy = tmp_path / "copy.json"
    copy.write_text(state.read_text())
    copy.chmod(0o600)
    state.unlink()
    state.symlink_to(copy)


@pytest.mark.parametrize(
    "damage",
    [
        pytest.param(_group_writable, id="group-writable"),
        pytest.param(_rewritten_by_another, id="rewritten-world-writable"),
        pytest.param(_hard_linked, id="hard-linked"),
        pytest.param(
            _owned_by_another,
            id="another-owner",
            marks=pytest.mark.skipif(os.geteuid() != 0, reason="chown needs root"),
        ),
        pytest.param(_a_link, id="symlink"),
    ],
)
def test_a_deploy_record_the_agent_did_not_write_is_not_trusted(source, tmp_path, caplog, damage):
    """A deploy.json that is not the agent's own is ignored, said in the log: the deploy is
    cold (fresh clone, install), so what the worker left in the checkout (`pip/`) is gone
    before pip runs; the record written then is trusted again at the next start."""
    _, url = source
    work = tmp_path / "work"
    start(url, work)
    state = work / STATE
    assert stat.S_IMODE(state.stat().st_mode) == 0o600
    marker = tmp_path / "planted.jsonl"
    (work / "repo" / "pip").mkdir()
    (work / "repo" / "pip" / "__main__.py").write_text(planted_code(marker, "pip/__main__.py"))
    (work / "repo" / "pip" / "__init__.py").write_text(planted_code(marker, "pip/__init__.py"))
    damage(state, tmp_path)

    with caplog.at_level(logging.WARNING, logger="autoscaler.agent"):
        again = start(url, work)
    assert (again.checkout, again.install) == ("cloned", "installed"), again
    assert again.why.startswith("the deploy record is not trusted"), again.why
    assert any("is not trusted" in r.getMessage() for r in caplog.records), caplog.text
    assert ran(marker) == []
    assert not (work / "repo" / "pip").exists()
    after = os.lstat(state)
    assert stat.S_ISREG(after.st_mode) and stat.S_IMODE(after.st_mode) == 0o600
    assert after.st_uid == os.geteuid() and after.st_nlink == 1
    assert start(url, work).warm  # its own record: warm again
