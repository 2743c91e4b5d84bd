"""The agent's side of a warm pool's resume: the machine starts again with the work folder it
had; the agent fetches its ref into the checkout it finds, and installs nothing when the
requirements are what it installed. Real git (file:// and dumb HTTP with a token), real pip
(a wheel made by the test, no package index): a start that must not run pip finds the wheel
gone, so a pip run would fail it."""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from datetime import UTC, datetime
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from autoscaler.agent.deploy import STATE, Deployed, names_local_files, prepare
from autoscaler.agent.run import Agent, prepare_deploy
from autoscaler.agent.server_api import AgentConfig, AgentError
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

TOKEN = "ghp-WARM-POOL-PRIVATE-TOKEN-42"


@pytest.fixture
def wheels(tmp_path, monkeypatch) -> Path:
    """pip's only source: a folder of wheels the test fills and empties (no index)."""
    folder = tmp_path / "wheels"
    folder.mkdir()
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(folder))
    return folder


def start(url: str, work: Path, ref: str | None = "main", **dep: str) -> Deployed:
    """One start of the agent's deploy, as a machine (fresh or resumed) does it."""
    return prepare(deployment(git_url=url, git_ref=ref, **dep), work)


def head(repo: Path) -> str:
    out = subprocess.run(
        ["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True, check=True
    )
    return out.stdout.strip()


@pytest.fixture
def source(tmp_path, wheels) -> tuple[Path, str]:
    """The team's repository: task code and a requirement pip can only get from `wheels`."""
    make_wheel(wheels, "asgmarker", "1.0")
    url = git_repo(
        tmp_path / "src", {"tasks.py": "X = 1\n", "requirements.txt": "asgmarker==1.0\n"}
    )
    return tmp_path / "src", url


def test_a_second_start_with_the_same_folder_skips_clone_and_install(source, wheels, tmp_path):
    src, url = source
    work = tmp_path / "work"
    first = start(url, work)
    assert (first.checkout, first.install, first.warm) == ("cloned", "installed", False)
    assert (work / "site-packages" / "asgmarker" / "__init__.py").is_file()
    assert first.commit == head(src) == head(work / "repo")
    # what a clone would not keep, and what a second install would need
    (work / "repo" / "model-cache").write_text("kept")
    site_inode = (work / "site-packages").stat().st_ino
    for wheel in wheels.iterdir():
        wheel.unlink()  # pip run again would fail: no index, no wheel

    again = start(url, work)
    assert (again.checkout, again.install, again.warm, again.why) == ("kept", "skipped", True, "")
    assert again.commit == first.commit
    assert (work / "repo" / "model-cache").read_text() == "kept"  # no fresh clone
    assert (work / "site-packages").stat().st_ino == site_inode  # not reinstalled
    assert set(again.seconds) == {"git", "install"}
    assert "warm start" in again.summary() and again.report()["warm"] is True


def test_a_new_commit_on_the_ref_is_fetched_and_checked_out_without_an_install(
    source, wheels, tmp_path
):
    src, url = source
    work = tmp_path / "work"
    start(url, work)
    (work / "repo" / "tasks.py").write_text("X = 'changed by the worker'\n")
    new = git_commit(src, {"tasks.py": "X = 2\n"})
    for wheel in wheels.iterdir():
        wheel.unlink()

    again = start(url, work)
    assert (again.checkout, again.install, again.commit) == ("kept", "skipped", new)
    assert head(work / "repo") == new
    assert (work / "repo" / "tasks.py").read_text() == "X = 2\n"
    branch = subprocess.run(
        ["git", "-C", str(work / "repo"), "branch", "--show-current"],
        capture_output=True,
        text=True,
    )
    assert branch.stdout.strip() == "main"  # as a fresh clone checks it out
    assert json.loads((work / STATE).read_text())["commit"] == new


def test_a_changed_requirements_file_is_installed_again(source, wheels, tmp_path):
    src, url = source
    work = tmp_path / "work"
    start(url, work)
    make_wheel(wheels, "asgmarker", "2.0")
    git_commit(src, {"requirements.txt": "asgmarker==2.0\n"})
    again = start(url, work)
    assert (again.checkout, again.install, again.warm) == ("kept", "installed", False)
    assert again.why == "the requirements changed"
    init = work / "site-packages" / "asgmarker" / "__init__.py"
    assert "VERSION = '2.0'" in init.read_text()
    assert not list((work / "site-packages").glob("asgmarker-1.0.dist-info"))  # a clean folder
    # the requirements gone: nothing installed is left for the worker to import
    git_commit(src, {"requirements.txt": None})
    gone = start(url, work)
    assert (gone.install, gone.site_packages) == ("none", None)
    assert not (work / "site-packages").exists()


def test_requirements_naming_files_of_the_checkout_are_installed_again_at_a_new_commit(
    tmp_path, wheels
):
    make_wheel(wheels, "asgmarker", "1.0")
    make_wheel(wheels, "asgother", "1.0")
    src = tmp_path / "src"
    url = git_repo(src, {"base.txt": "asgmarker==1.0\n", "requirements.txt": "-r base.txt\n"})
    work = tmp_path / "work"
    assert start(url, work).install == "installed"
    git_commit(src, {"base.txt": "asgmarker==1.0\nasgother==1.0\n"})
    again = start(url, work)
    assert again.install == "installed"  # requirements.txt's bytes alone did not change
    assert (work / "site-packages" / "asgother").is_dir()


@pytest.mark.parametrize(
    ("text", "local"),
    [
        ("celery[redis]==5.4\ntorch>=2 ; python_version >= '3.10'  # GPU\n", False),
        ("--extra-index-url https://download.pytorch.org/whl/cu121\ntorch\n", False),
        ("pkg @ https://example.invalid/pkg-1.0.tar.gz\n", False),
        ("git+https://example.invalid/team/lib.git@v1#egg=lib\n", False),
        ("-r base.txt\n", True),
        ("-rbase.txt\n", True),
        ("--constraint=c.txt\nx\n", True),
        ("-e .\n", True),
        (".\n", True),
        ("./wheels/x-1.0-py3-none-any.whl\n", True),
        ("wheels/x.whl\n", True),
        ("x-1.0-py3-none-any.whl\n", True),
        ("--find-links ./wheels\nx\n", True),
        ("pkg @ file:///opt/pkg\n", True),
        ("numpy==2.0 \\\n  --hash=sha256:0f0f\n", False),
        ("-r \\\n  more.txt\n", True),
    ],
)
def test_what_names_files_of_the_checkout(text, local):
    assert names_local_files(text) is local


def _garble_objects(git: Path) -> None:
    for path in (git / "objects").rglob("*"):
        if path.is_file():
            path.chmod(0o644)
            path.write_bytes(b"\x00garbage" * 8)


@pytest.mark.parametrize(
    ("damage", "cloned"),
    [
        pytest.param(lambda git: (git / "HEAD").write_text("garbage\n"), True, id="head-garbage"),
        pytest.param(lambda git: shutil.rmtree(git), True, id="git-dir-gone"),
        pytest.param(
            lambda git: (git / "commondir").write_text("/elsewhere\n"), True, id="commondir"
        ),
        pytest.param(lambda git: (git / "index").write_bytes(b"DIRC junk"), True, id="index"),
        pytest.param(
            lambda git: (git.parent.parent / STATE).write_text('{"vers'), True, id="state"
        ),
        pytest.param(lambda git: shutil.rmtree(git.parent), True, id="checkout-gone"),
        # git mends this itself, fetching all it lacks: a good checkout either way
        pytest.param(lambda git: shutil.rmtree(git / "objects"), None, id="objects-gone"),
        pytest.param(_garble_objects, True, id="objects-garbled"),
    ],
)
def test_a_broken_checkout_or_record_falls_back_to_a_clean_clone(source, tmp_path, damage, cloned):
    src, url = source
    work = tmp_path / "work"
    start(url, work)
    (work / "repo" / "model-cache").write_text("a fresh clone drops it")
    damage(work / "repo" / ".git")
    new = git_commit(src, {"tasks.py": "X = 3\n"})

    again = start(url, work)
    if cloned:
        assert again.checkout == "cloned" and again.why, again
        assert not (work / "repo" / "model-cache").exists()
    assert again.commit == new == head(work / "repo")
    assert (work / "repo" / "tasks.py").read_text() == "X = 3\n"
    fsck = subprocess.run(
        ["git", "-C", str(work / "repo"), "fsck", "--no-dangling"], capture_output=True, text=True
    )
    assert fsck.returncode == 0, (again, fsck.stderr)
    assert not any(p.name.endswith((".new", ".old")) for p in work.iterdir())
    # and the next start is warm again
    assert start(url, work).checkout == "kept"


def test_another_repository_is_a_fresh_clone_and_install(source, tmp_path):
    _, url = source
    work = tmp_path / "work"
    start(url, work)
    other = git_repo(tmp_path / "other", {"tasks.py": "Y = 1\n", "requirements.txt": "asgmarker"})
    again = start(other, work)
    assert (again.checkout, again.install) == ("cloned", "installed")
    assert again.why == "the checkout is of another repository"
    assert (work / "repo" / "tasks.py").read_text() == "Y = 1\n"


def test_a_branch_that_cannot_be_fetched_fails_and_leaves_the_folder_as_it_was(source, tmp_path):
    """A moving ref is never started stale: without its Git host the resume fails as a fresh
    machine would (the control plane then rents a fresh one), and the folder is still good for
    the next start once the host is back."""
    src, url = source
    work = tmp_path / "work"
    first = start(url, work)
    state = (work / STATE).read_text()
    src.rename(tmp_path / "away")
    with pytest.raises(AgentError, match="git clone failed"):
        prepare_deploy(deployment(git_url=url, git_ref="main"), work)
    assert head(work / "repo") == first.commit and (work / STATE).read_text() == state
    assert (work / "site-packages" / "asgmarker").is_dir()
    (tmp_path / "away").rename(src)
    assert start(url, work).warm


def test_a_pinned_commit_the_checkout_holds_starts_without_its_git_host(source, tmp_path):
    """A full commit id never changes: the checkout holding it needs no fetch."""
    src, url = source
    work = tmp_path / "work"
    pinned = head(src)
    start(url, work, ref=pinned)
    src.rename(tmp_path / "away")
    again = start(url, work, ref=pinned)
    assert (again.checkout, again.install, again.commit) == ("kept", "skipped", pinned)


def test_nothing_the_worker_leaves_in_the_checkout_runs_as_the_agent(source, tmp_path):
    """The worker may write the checkout's .git (same uid, or the folder given to it): hooks,
    an fsmonitor command, an include, a URL rewrite sending the fetch elsewhere. The next
    start runs none of them and fetches from the deployment's URL."""
    src, url = source
    work = tmp_path / "work"
    start(url, work)
    git = work / "repo" / ".git"
    ran = tmp_path / "ran"
    script = f'#!/bin/sh\necho "$0" >> {ran}\n'
    for hook in ("reference-transaction", "post-checkout", "pre-auto-gc", "post-merge"):
        (git / "hooks" / hook).write_text(script)
        (git / "hooks" / hook).chmod(0o755)
    (tmp_path / "evil.sh").write_text(script)
    (tmp_path / "evil.sh").chmod(0o755)
    (tmp_path / "evil.cfg").write_text(f"[core]\n\tfsmonitor = {tmp_path / 'evil.sh'}\n")
    with (git / "config").open("a") as fh:
        fh.write(
            f"[core]\n\tfsmonitor = {tmp_path / 'evil.sh'}\n\thooksPath = {git / 'hooks'}\n"
            f"[include]\n\tpath = {tmp_path / 'evil.cfg'}\n"
            f'[url "file:///nowhere/"]\n\tinsteadOf = {url}\n'
        )
    new = git_commit(src, {"tasks.py": "X = 4\n"})

    again = start(url, work)
    assert (again.checkout, again.commit) == ("kept", new)
    assert not ran.exists(), ran.read_text()
    config = (git / "config").read_text()
    assert "fsmonitor" not in config and "include" not in config and "nowhere" not in config


class _TokenGitServer:
    """A repository served over Git's dumb HTTP protocol, to a request with the token only."""

    def __init__(self, repo: Path) -> None:
        expected = "Basic " + base64.b64encode(f"x-access-token:{TOKEN}".encode()).decode()

        class Handler(SimpleHTTPRequestHandler):
            def __init__(self, *a: Any, **kw: Any) -> None:
                super().__init__(*a, directory=str(repo), **kw)

            def do_GET(self) -> None:
                if self.headers.get("Authorization") != expected:
                    self.send_response(401)
                    self.send_header("WWW-Authenticate", 'Basic realm="git"')
                    self.end_headers()
                    return
                super().do_GET()

            def log_message(self, format: str, *args: object) -> None:
                return

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/.git"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def private(source) -> Iterator[_TokenGitServer]:
    src, _ = source
    subprocess.run(["git", "-C", str(src), "update-server-info"], check=True)
    server = _TokenGitServer(src)
    try:
        yield server
    finally:
        server.close()


def test_a_private_repositorys_token_is_in_no_file_of_the_work_folder(source, private, tmp_path):
    src, _ = source
    work = tmp_path / "work"
    with pytest.raises(AgentError, match="git clone failed"):  # the server wants the token
        prepare_deploy(deployment(git_url=private.url, git_ref="main"), tmp_path / "no-token")
    first = start(private.url, work, git_token=TOKEN)
    new = git_commit(src, {"tasks.py": "X = 5\n"})
    subprocess.run(["git", "-C", str(src), "update-server-info"], check=True)
    again = start(private.url, work, git_token=TOKEN)  # a fetch with the token
    assert first.checkout == "cloned" and (again.checkout, again.commit) == ("kept", new)
    basic = base64.b64encode(f"x-access-token:{TOKEN}".encode())
    config = (work / "repo" / ".git" / "config").read_bytes()
    assert b"extraHeader" not in config and b"Authorization" not in config
    for path in work.rglob("*"):
        if path.is_file() and not path.is_symlink():
            data = path.read_bytes()
            assert TOKEN.encode() not in data and basic not in data, path


WORKER = """
import json, os, subprocess, sys
import asgmarker
import autoscaler.agent.hook
script = subprocess.run(["asgmarker"], capture_output=True, text=True)
with open(os.environ["OUT"], "w") as fh:
    json.dump({"version": asgmarker.VERSION, "from": asgmarker.__file__,
               "script": script.stdout.strip(), "hook": autoscaler.agent.hook.__file__}, fh)
"""


def test_the_worker_imports_the_installed_packages_and_the_agents_hook(source, tmp_path):
    """The requirements live in the work folder, not the agent's interpreter: the worker finds
    them through PYTHONPATH (its scripts through PATH), and still the agent's hook."""
    src, url = source
    git_commit(src, {"worker.py": WORKER})
    work = tmp_path / "work"
    done = start(url, work)
    cfg = AgentConfig(api_url="http://127.0.0.1:9", token="t", launch_id="m1", queue="q1")
    cfg.workdir = work
    agent = Agent(cfg)
    out = tmp_path / "out.json"
    agent.start_worker(
        deployment(startup_cmd=f"{sys.executable} worker.py", env={"OUT": str(out)}),
        done.repo,
        done.site_packages,
    )
    assert agent.proc is not None and agent.proc.wait(timeout=60) == 0
    seen = json.loads(out.read_text())
    assert seen["version"] == "1.0" and seen["script"] == "1.0", seen
    assert seen["from"].startswith(str(work / "site-packages")), seen
    import autoscaler.agent.hook

    assert seen["hook"] == autoscaler.agent.hook.__file__
    # and not in the agent's own interpreter
    probe = subprocess.run([sys.executable, "-c", "import asgmarker"], capture_output=True)
    assert probe.returncode != 0
    assert "asgmarker" not in os.environ.get("PYTHONPATH", "")


@pytest.mark.skipif(os.geteuid() != 0, reason="the agent as root, its worker as another uid")
def test_a_folder_given_to_the_worker_is_still_warm_for_an_agent_running_as_root(
    source, wheels, tmp_path
):
    """As root the agent gives the work folder to the worker's account (all but its deploy
    record, which it trusts only as its own); git would refuse a repository it discovers there
    (another owner), but the agent names its git dir."""
    from autoscaler.agent.run import _give

    src, url = source
    work = tmp_path / "work"
    start(url, work)
    _give(work, 65534, 65534)
    assert (work / "repo" / "tasks.py").stat().st_uid == 65534
    assert (work / STATE).stat().st_uid == 0
    new = git_commit(src, {"tasks.py": "X = 6\n"})
    for wheel in wheels.iterdir():
        wheel.unlink()
    again = start(url, work)
    assert (again.checkout, again.install, again.commit) == ("kept", "skipped", new)


RESUMED_WORKER = """
import json, os, signal, time
import asgmarker
import autoscaler.agent.hook
stop = []
signal.signal(signal.SIGTERM, lambda *a: stop.append(1))
with open(os.path.join(os.environ["MARKS"], "started.jsonl"), "a") as fh:
    fh.write(json.dumps({"version": asgmarker.VERSION}) + "\\n")
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


def _reports(text: str) -> list[dict[str, Any]]:
    return [
        json.loads(line.split("deploy report ", 1)[1])
        for line in text.splitlines()
        if "deploy report " in line
    ]


@pytest.mark.timeout(120)
def test_a_resumed_agent_finds_its_folder_and_starts_its_worker_warm(
    world, source, wheels, tmp_path
):
    """The real agent twice on one work folder, as a stopped machine started again: the second
    start clones and installs nothing, its worker imports what the first installed, and its
    log says so with each phase's seconds."""
    src, url = source
    git_commit(src, {"worker.py": RESUMED_WORKER})
    marks = tmp_path / "marks"
    marks.mkdir()
    doc = json.loads(json.dumps(CONFIG))
    doc["queues"]["q1"]["deployment"] = {
        "git_url": url,
        "git_ref": "main",
        "startup_cmd": f"{sys.executable} worker.py",
    }
    with world.rt.transaction() as session:
        config_versions.record(session, doc, "test", datetime.now(UTC), "warm start test")
    started = marks / "started.jsonl"

    def lines() -> list[str]:
        return started.read_text().splitlines() if started.exists() else []

    with serve(world) as api:
        env = {
            "AUTOSCALER_API_URL": api,
            "AUTOSCALER_WORKER_TOKEN": world.tokens["m1"],
            "AUTOSCALER_LAUNCH_ID": "m1",
            "AUTOSCALER_QUEUE": "q1",
            "AUTOSCALER_HEARTBEAT_INTERVAL": "0.3",
            "AUTOSCALER_AGENT_WORKDIR": str(tmp_path / "work"),
            "MARKS": str(marks),
            "PIP_NO_INDEX": "1",
            "PIP_FIND_LINKS": str(wheels),
        }
        runs = []
        for n in (1, 2):
            agent = AgentProc(env, tmp_path / f"agent-{n}.log")
            try:
                wait_for(lambda n=n: len(lines()) == n, 60, f"worker {n}", agent.text)
            finally:
                agent.stop()  # the machine stops: SIGTERM, the worker ends with the agent
            assert agent.popen.returncode == 0, agent.text()
            runs.append(agent.text())
            for wheel in wheels.iterdir():
                wheel.unlink()  # a second pip run would fail

    assert [json.loads(x)["version"] for x in lines()] == ["1.0", "1.0"]
    (cold,), (warm,) = _reports(runs[0]), _reports(runs[1])
    assert (cold["warm"], cold["checkout"], cold["install"]) == (False, "cloned", "installed")
    assert (warm["warm"], warm["checkout"], warm["install"]) == (True, "kept", "skipped")
    assert set(warm["seconds"]) == {"register", "deployment", "git", "install"}
    assert "warm start" in runs[1] and world.tokens["m1"] not in runs[1]


def test_a_work_folder_the_agent_cannot_write_is_a_temp_folder_not_an_exit(tmp_path):
    from autoscaler.agent.deploy import usable_workdir

    blocker = tmp_path / "a-file"
    blocker.write_text("")
    got = usable_workdir(blocker / "autoscaler")  # under a file: never a folder
    try:
        assert got.is_dir() and got != blocker / "autoscaler"
        assert usable_workdir(tmp_path / "vol" / "autoscaler") == tmp_path / "vol" / "autoscaler"
    finally:
        shutil.rmtree(got, ignore_errors=True)
