"""The local provider: a real process group per machine, found, stopped, started again and
destroyed from anywhere; a stopped machine keeps its folder."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from autoscaler.config.provider_options import LocalOptions
from autoscaler.providers import LaunchSpec, MachineStatus, NotOwnedError, ResumeRefusedError
from autoscaler.providers.local import DEFAULT_COMMAND, LocalProvider
from tests.providers.conftest import INSTALLATION, OTHER_INSTALLATION, spec

PY = sys.executable


def local(
    state: Path, command: str | None = None, installation: str = INSTALLATION, grace: float = 2.0
) -> LocalProvider:
    config = LocalOptions.model_validate({"kind": "local", "command": command})
    return LocalProvider("here", config, installation, state, grace=grace)


def launch(installation: str = INSTALLATION) -> LaunchSpec:
    return LaunchSpec.new(installation, uuid.uuid4().hex, {"QUEUE": "local-q"})


def wait_for(path: Path, timeout: float = 5.0) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and path.read_text():
            return path.read_text()
        time.sleep(0.02)
    raise AssertionError(f"{path} never written")


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[-1].split()[0] not in ("Z", "X")
    except OSError:
        return False


def test_process_gets_env_and_whole_group_is_stopped_by_another_provider(tmp_path: Path) -> None:
    out = tmp_path / "out"
    # The "machine" writes its env, then starts a child in the same group and waits.
    cmd = (
        f"{PY} -c \"import os; open('{out}', 'w').write(os.environ['AUTOSCALER_LABEL'] + "
        f"' ' + os.environ['QUEUE'])\" && sleep 300 & "
        f"echo $! > {tmp_path / 'child'}; wait"
    )
    a = local(tmp_path / "state", cmd)
    lx = launch()
    m = a.create(a.find_offers(spec())[0], lx)
    assert wait_for(out) == f"{lx.label} local-q"
    child = int(wait_for(tmp_path / "child"))
    assert alive(child)
    assert m.status is MachineStatus.RUNNING and m.provider_instance_id == lx.label
    b = local(tmp_path / "state", cmd)  # another process: same state dir, fresh object
    assert [x.label for x in b.list_owned()] == [lx.label]
    b.destroy(m.provider_instance_id)
    deadline = time.monotonic() + 3
    while alive(child) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not alive(child)  # the whole group went, not just the shell
    assert b.list_owned() == [] and a.get(m.provider_instance_id) is None
    b.destroy(m.provider_instance_id)  # already gone: success


def test_sigterm_ignored_means_sigkill_after_grace(tmp_path: Path) -> None:
    ready = tmp_path / "ready"
    cmd = (
        f'exec {PY} -c "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); '
        f"open('{ready}', 'w').write('x'); time.sleep(300)\""
    )
    p = local(tmp_path / "state", cmd, grace=0.3)
    m = p.create(p.find_offers(spec())[0], launch())
    wait_for(ready)
    t0 = time.monotonic()
    p.destroy(m.provider_instance_id)
    assert 0.3 <= time.monotonic() - t0 < 5
    assert p.list_owned() == []


def test_exited_process_reads_dead(tmp_path: Path) -> None:
    p = local(tmp_path / "state", "exit 3")
    m = p.create(p.find_offers(spec())[0], launch())
    deadline = time.monotonic() + 5
    while p.get(m.provider_instance_id).status is not MachineStatus.DEAD:  # type: ignore[union-attr]
        assert time.monotonic() < deadline
        time.sleep(0.02)
    p.destroy(m.provider_instance_id)


def test_default_command_runs_until_stopped(tmp_path: Path) -> None:
    p = local(tmp_path / "state")
    assert p.command == DEFAULT_COMMAND and "autoscaler.cli agent" in DEFAULT_COMMAND
    # the agent: with an API that does not answer (yet), it keeps trying to register
    api = {"AUTOSCALER_API_URL": "http://127.0.0.1:9", "AUTOSCALER_WORKER_TOKEN": "t"}
    m = p.create(p.find_offers(spec())[0], LaunchSpec.new(INSTALLATION, uuid.uuid4().hex, api))
    time.sleep(0.2)
    assert p.get(m.provider_instance_id).status is MachineStatus.RUNNING  # type: ignore[union-attr]
    p.destroy(m.provider_instance_id)
    assert p.get(m.provider_instance_id) is None


def test_foreign_machines_and_recycled_pids_are_left_alone(tmp_path: Path) -> None:
    state = tmp_path / "state"
    theirs = local(state, "sleep 300", installation=OTHER_INSTALLATION)
    tm = theirs.create(theirs.find_offers(spec())[0], launch(OTHER_INSTALLATION))
    mine = local(state, "sleep 300")
    assert mine.list_owned() == [] and mine.get(tm.provider_instance_id) is None
    with pytest.raises(NotOwnedError):
        mine.destroy(tm.provider_instance_id)
    assert theirs.get(tm.provider_instance_id).status is MachineStatus.RUNNING  # type: ignore[union-attr]
    theirs.destroy(tm.provider_instance_id)
    # A pid file whose pid now belongs to an unrelated process is never signalled.
    bystander = os.getpid()
    lx = launch()
    (state / "here").mkdir(parents=True, exist_ok=True)
    mine._write(
        lx.label,
        {
            "pid": bystander,
            "pgid": os.getpgid(bystander),
            "start_time": "1",
            "label": lx.label,
            "env": {},
            "price_per_hour": 0.0,
        },
    )
    got = mine.get(lx.label)
    assert got is not None and got.status is MachineStatus.DEAD
    old = signal.signal(signal.SIGTERM, lambda *_: pytest.fail("signalled a bystander"))
    try:
        mine.destroy(lx.label)
    finally:
        signal.signal(signal.SIGTERM, old)
    assert mine.get(lx.label) is None


def test_the_autoscalers_own_secrets_never_reach_a_local_machine(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AUTOSCALER_VAULT_KEY", "vault-SECRET-must-not-leak")
    monkeypatch.setenv("RUNPOD_API_KEY", "rpa-SECRET-must-not-leak")
    out = tmp_path / "env"
    cmd = f"{PY} -c \"import os, json; open('{out}', 'w').write(json.dumps(dict(os.environ)))\""
    p = local(tmp_path / "state", cmd)
    lx = launch()
    m = p.create(p.find_offers(spec())[0], lx)
    seen = wait_for(out)
    p.destroy(m.provider_instance_id)
    assert "SECRET-must-not-leak" not in seen
    assert lx.label in seen and '"PATH"' in seen  # the launch's env and a usable PATH arrive


def test_a_process_that_left_the_machines_group_goes_with_the_machine(tmp_path: Path) -> None:
    """The agent starts its worker in a session of its own: destroying the machine must stop it
    too (it carries the machine's label), as a rented machine takes everything with it."""
    pidfile = tmp_path / "escaped"
    escaped = (
        f'{PY} -c "import os, subprocess; '
        f"p = subprocess.Popen(['sleep', '300'], start_new_session=True); "
        f"open('{pidfile}', 'w').write(str(p.pid))\"; sleep 300"
    )
    p = local(tmp_path / "state", escaped)
    m = p.create(p.find_offers(spec())[0], launch())
    pid = int(wait_for(pidfile))
    assert alive(pid) and os.getpgid(pid) != os.getpgid(os.getpid())
    p.destroy(m.provider_instance_id)
    deadline = time.monotonic() + 5
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not alive(pid)
    # a process of another machine (another label) is left alone
    other = subprocess.Popen(["sleep", "300"], env={"AUTOSCALER_LABEL": "asg-other-x"})
    try:
        q = local(tmp_path / "state2", "sleep 300")
        m2 = q.create(q.find_offers(spec())[0], launch())
        q.destroy(m2.provider_instance_id)
        assert other.poll() is None
    finally:
        other.kill()
        other.wait()


# ---------------------------------------------------------------- stop / start (warm pools)


def test_stop_ends_every_process_keeps_the_folder_and_start_runs_it_again_there(
    tmp_path: Path,
) -> None:
    """Stopped: the group and a process that left it are gone, the folder (the agent's work
    folder) stays with what was written there. Started — by another process — the same command
    runs again in the same folder with the same environment, and finds what it left."""
    escaped_pid = tmp_path / "escaped"
    cmd = (
        f'echo "$PWD $AUTOSCALER_AGENT_WORKDIR $QUEUE $AUTOSCALER_WORKER_TOKEN" >> runs; '
        f'{PY} -c "import subprocess; '
        f"p = subprocess.Popen(['sleep', '300'], start_new_session=True); "
        f"open('{escaped_pid}', 'w').write(str(p.pid))\"; exec sleep 300"
    )
    a = local(tmp_path / "state", cmd)
    env = {"QUEUE": "q", "AUTOSCALER_WORKER_TOKEN": "tok"}
    lx = LaunchSpec.new(INSTALLATION, uuid.uuid4().hex, env)
    m = a.create(a.find_offers(spec())[0], lx)
    folder = tmp_path / "state" / "here" / lx.label
    first = int(wait_for(escaped_pid))
    escaped_pid.unlink()
    assert (folder / "runs").read_text() == f"{folder} {folder} q tok\n"
    pid = a.get(m.provider_instance_id).raw_status.split()[1]  # type: ignore[union-attr]
    a.stop(m.provider_instance_id)
    assert not alive(int(pid)) and not alive(first)
    got = a.get(m.provider_instance_id)
    assert got is not None and got.status is MachineStatus.STOPPED
    assert got.storage_price_per_hour == 0.0
    assert [x.status for x in a.list_owned()] == [MachineStatus.STOPPED]
    a.stop(m.provider_instance_id)  # stopped already: success
    b = local(tmp_path / "state", "exit 1")  # another process; the machine's own command wins
    b.start(m.provider_instance_id)
    second = int(wait_for(escaped_pid))
    assert alive(second) and second != first
    assert b.get(m.provider_instance_id).status is MachineStatus.RUNNING  # type: ignore[union-attr]
    assert (folder / "runs").read_text() == f"{folder} {folder} q tok\n" * 2
    b.start(m.provider_instance_id)  # running already: no second copy
    assert (folder / "runs").read_text().count("\n") == 2
    a.destroy(m.provider_instance_id)
    assert not folder.exists() and not alive(second)
    assert a.get(m.provider_instance_id) is None


def test_a_machine_that_exits_by_itself_reads_dead_and_is_not_started_again(
    tmp_path: Path,
) -> None:
    p = local(tmp_path / "state", "exit 3")
    m = p.create(p.find_offers(spec())[0], launch())
    deadline = time.monotonic() + 5
    while p.get(m.provider_instance_id).status is not MachineStatus.DEAD:  # type: ignore[union-attr]
        assert time.monotonic() < deadline
        time.sleep(0.02)
    with pytest.raises(ResumeRefusedError, match="exited by itself"):
        p.start(m.provider_instance_id)
    p.stop(m.provider_instance_id)  # a stop now: nothing runs, and it reads STOPPED
    assert p.get(m.provider_instance_id).status is MachineStatus.STOPPED  # type: ignore[union-attr]
    p.destroy(m.provider_instance_id)


def test_a_stop_cut_short_still_reads_stopped(tmp_path: Path) -> None:
    """The record says "stopped" before any signal: a stopper killed mid-way leaves a machine
    that reads STOPPED once its processes are gone, not DEAD."""
    p = local(tmp_path / "state", "exec sleep 300")
    m = p.create(p.find_offers(spec())[0], launch())
    record = p._read(m.provider_instance_id)
    assert record is not None
    record["stopped_at"] = 1.0
    p._write(m.provider_instance_id, record)  # as the stop writes it first
    assert p.get(m.provider_instance_id).status is MachineStatus.RUNNING  # type: ignore[union-attr]
    os.killpg(int(record["pgid"]), signal.SIGKILL)  # ... and then the stopper died
    deadline = time.monotonic() + 5
    while p.get(m.provider_instance_id).status is not MachineStatus.STOPPED:  # type: ignore[union-attr]
        assert time.monotonic() < deadline
        time.sleep(0.02)
    p.start(m.provider_instance_id)
    assert p.get(m.provider_instance_id).status is MachineStatus.RUNNING  # type: ignore[union-attr]
    p.destroy(m.provider_instance_id)


def test_a_stop_that_sigterm_does_not_end_kills_after_the_grace(tmp_path: Path) -> None:
    ready = tmp_path / "ready"
    cmd = (
        f'exec {PY} -c "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); '
        f"open('{ready}', 'w').write('x'); time.sleep(300)\""
    )
    p = local(tmp_path / "state", cmd, grace=0.3)
    m = p.create(p.find_offers(spec())[0], launch())
    wait_for(ready)
    t0 = time.monotonic()
    p.stop(m.provider_instance_id)
    assert 0.3 <= time.monotonic() - t0 < 5
    assert p.get(m.provider_instance_id).status is MachineStatus.STOPPED  # type: ignore[union-attr]
    p.destroy(m.provider_instance_id)


def test_a_start_whose_folder_is_gone_is_refused(tmp_path: Path) -> None:
    p = local(tmp_path / "state", "exec sleep 300")
    m = p.create(p.find_offers(spec())[0], launch())
    p.stop(m.provider_instance_id)
    (tmp_path / "state" / "here" / m.label).rmdir()
    with pytest.raises(ResumeRefusedError, match="folder"):
        p.start(m.provider_instance_id)
    p.destroy(m.provider_instance_id)


def test_a_launch_that_names_its_own_work_folder_keeps_it(tmp_path: Path) -> None:
    out = tmp_path / "seen"
    p = local(tmp_path / "state", f'echo "$AUTOSCALER_AGENT_WORKDIR" > {out}; exec sleep 300')
    mine = tmp_path / "elsewhere"
    lx = LaunchSpec.new(INSTALLATION, uuid.uuid4().hex, {"AUTOSCALER_AGENT_WORKDIR": str(mine)})
    m = p.create(p.find_offers(spec())[0], lx)
    assert wait_for(out) == f"{mine}\n"
    mine.mkdir()
    p.destroy(m.provider_instance_id)
    assert mine.is_dir()  # not a folder the provider made: never removed


def test_stop_and_start_of_a_machine_not_ours(tmp_path: Path) -> None:
    state = tmp_path / "state"
    theirs = local(state, "exec sleep 300", installation=OTHER_INSTALLATION)
    tm = theirs.create(theirs.find_offers(spec())[0], launch(OTHER_INSTALLATION))
    mine = local(state, "exec sleep 300")
    try:
        for call in (mine.stop, mine.start):
            with pytest.raises(NotOwnedError):
                call(tm.provider_instance_id)
        got = theirs.get(tm.provider_instance_id)
        assert got is not None and got.status is MachineStatus.RUNNING
        mine.stop("not-a-label")  # never a machine of this provider: nothing to do
        with pytest.raises(ResumeRefusedError):
            mine.start("not-a-label")
    finally:
        theirs.destroy(tm.provider_instance_id)
