"""The local provider: "rents" a machine by starting a local process, so the whole loop can run
for real on one computer.

Each machine is one process started in its own session (`start_new_session=True`, so it leads
its own process group) running `command` through `/bin/sh -c` in the machine's folder
(`<state_dir>/<label>/`, its "disk": the agent's work folder, `WORKDIR_ENV`, with its checkout
and virtualenv) with the machine's environment (the ownership marker and whatever the launch
carries) on top of a few variables of this process's. Destroy stops the whole group (SIGTERM,
then SIGKILL after `grace` seconds) and removes the folder. Stop ends the processes the same way
and keeps the folder; start runs the same command again there with the same environment, so
the agent finds its work folder. Only a machine we stopped reads STOPPED: one whose processes
ended by themselves reads DEAD, and is not started again.

State is one JSON file per machine under `state_dir` (`<label>.json`, mode 0600 since the env
may carry the worker's token) holding the pid, the process start time (so a recycled pid is
never signalled), the label, command, folder and environment, and when we stopped it. Any
process with the same `state_dir` — beat, a worker, the CLI — can therefore find, stop, start
and destroy machines started by another; a lock file per machine keeps two of them from
starting (or stopping and starting) one machine at once.

The default command (`DEFAULT_COMMAND`) is the worker agent (`autoscaler agent`), so the whole
loop (register, deploy from Git, heartbeat, drain) runs on one computer; `command` in the
provider's config replaces it.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from autoscaler.config.machine_specs import InstanceSpec
from autoscaler.config.provider_options import LocalOptions
from autoscaler.providers.base import (
    WORKDIR_ENV,
    LaunchSpec,
    MachineStatus,
    NotOwnedError,
    Offer,
    Provider,
    ProviderBuild,
    ProviderError,
    ProviderMachine,
    ResumeRefusedError,
)
from autoscaler.providers.labels import ENV_LABEL, parse_label

BASE_ENV = ("PATH", "HOME", "LANG", "LC_ALL", "TZ", "TMPDIR", "VIRTUAL_ENV", "PYTHONPATH")
"""Variables a local machine inherits from the autoscaler; everything else comes from the launch."""

log = logging.getLogger("autoscaler.providers.local")

DEFAULT_COMMAND = f"exec {shlex.quote(sys.executable)} -m autoscaler.cli agent"
"""The worker agent, as on a rented machine: it registers with the API named in the launch's
environment, deploys the queue's Git repository and runs its worker (`autoscaler agent`)."""


def _start_time(pid: int) -> str | None:
    """The kernel's start time of `pid` (field 22 of /proc/pid/stat), None if no such process."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as fh:
            stat = fh.read()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[-1].split()
    return fields[19] if len(fields) > 19 else None


def _state(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as fh:
            stat = fh.read()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[-1].split()
    return fields[0] if fields else None


def _group_alive(pgid: int) -> bool:
    """True while any process of the group exists and is not a zombie."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # pragma: no cover - someone else's group now
        return False
    # killpg(0) also succeeds for zombies; look for a living member.
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="ascii", errors="replace") as fh:
                fields = fh.read().rsplit(")", 1)[-1].split()
        except OSError:
            continue
        if len(fields) > 2 and fields[2] == str(pgid) and fields[0] not in ("Z", "X"):
            return True
    return False


def _labelled_pids(label: str) -> list[int]:
    """Living processes whose environment names this machine (`AUTOSCALER_LABEL=<label>`)."""
    marker = f"{ENV_LABEL}={label}".encode() + b"\0"
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as fh:
                environ = fh.read() + b"\0"
        except OSError:
            continue
        if (b"\0" + marker) in (b"\0" + environ) and _state(int(entry)) not in (None, "Z", "X"):
            found.append(int(entry))
    return found


class LocalProvider(Provider):
    kind = "local"

    def __init__(
        self,
        name: str,
        config: LocalOptions,
        installation_id: str,
        state_dir: Path,
        *,
        grace: float = 10.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        super().__init__(name, installation_id)
        self.config = config
        self.command = config.command or DEFAULT_COMMAND
        self.state_dir = Path(state_dir) / name
        self.grace = grace
        self._clock = clock
        self._children: dict[str, subprocess.Popen[bytes]] = {}

    # ------------------------------------------------------------------ offers / create

    def find_offers(self, spec: InstanceSpec) -> list[Offer]:
        price = self.config.price_per_hour
        if price > spec.max_price_per_hour:
            return []
        return [
            Offer(
                provider=self.name,
                offer_id="local",
                gpu=spec.gpus[0],  # this machine: whatever GPU is asked, the first one
                gpu_count=spec.gpu_count,
                price_per_hour=price,
                spec=spec,
                host_id=os.uname().nodename,
            )
        ]

    def create(self, offer: Offer, launch: LaunchSpec) -> ProviderMachine:
        self._check_launch(launch)
        existing = self.find_by_label(launch.label)
        if existing is not None:
            return existing
        self.state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        folder = self._folder(launch.label)
        folder.mkdir(exist_ok=True, mode=0o700)
        env = dict(launch.env)
        env.setdefault(WORKDIR_ENV, str(folder))  # where a resumed agent finds its checkout
        record: dict[str, Any] = {
            "label": launch.label,
            "env": env,
            # Only what a process needs to start, never the autoscaler's own environment
            # (provider keys, the vault key, database URLs): a local machine gets what a rented
            # one gets. Kept, so a start from another process runs with the same.
            "base_env": {k: os.environ[k] for k in BASE_ENV if k in os.environ},
            "folder": str(folder),
            "gpu": offer.gpu,
            "price_per_hour": offer.price_per_hour,
            "created_at": self._clock(),
            "command": self.command,
            "stopped_at": None,
        }
        proc = self._spawn(record)
        self._write(launch.label, record)
        log.info("%s: started local machine %s (pid %d)", self.name, launch.label, proc.pid)
        return self._machine(record)

    def _spawn(self, record: dict[str, Any]) -> subprocess.Popen[bytes]:
        """Run the machine's command in its folder with its environment; the record gets the
        new process's pid, group and start time."""
        label = str(record["label"])
        env = {**record.get("base_env", {}), **record.get("env", {})}
        folder = record.get("folder")
        with open(self.state_dir / f"{label}.log", "ab") as out:
            try:
                proc = subprocess.Popen(
                    ["/bin/sh", "-c", str(record.get("command") or self.command)],
                    env=env,
                    cwd=folder,
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                    close_fds=True,
                )
            except OSError as exc:
                raise ProviderError(
                    f"{self.name}: cannot start the local machine command ({exc.strerror})",
                    provider=self.name,
                ) from None
        record.update(pid=proc.pid, pgid=proc.pid, start_time=_start_time(proc.pid))
        self._children[label] = proc
        return proc

    def _folder(self, label: str) -> Path:
        return self.state_dir / label

    # ------------------------------------------------------------------ read

    def _path(self, label: str) -> Path:
        return self.state_dir / f"{label}.json"

    def _write(self, label: str, record: dict[str, Any]) -> None:
        tmp = self.state_dir / f".{label}.json.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(record, fh)
        os.replace(tmp, self._path(label))

    def _read(self, label: str) -> dict[str, Any] | None:
        try:
            data = json.loads(self._path(label).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        return data if isinstance(data, dict) and data.get("label") == label else None

    def _alive(self, record: dict[str, Any]) -> bool:
        label = str(record["label"])
        child = self._children.get(label)
        if child is not None:
            child.poll()  # reap our own child so it is not a zombie
        pid = int(record["pid"])
        if record.get("start_time") is not None and _start_time(pid) not in (
            None,
            record["start_time"],
        ):
            return False  # the pid was recycled: our process is long gone
        return _group_alive(int(record["pgid"]))

    def _machine(self, record: dict[str, Any]) -> ProviderMachine:
        alive = self._alive(record)
        if alive:
            status, raw = MachineStatus.RUNNING, "alive"
        elif record.get("stopped_at") is not None:
            status, raw = MachineStatus.STOPPED, "stopped"
        else:  # it ended by itself: not ours to start again
            status, raw = MachineStatus.DEAD, "exited"
        return ProviderMachine(
            provider_instance_id=str(record["label"]),
            label=str(record["label"]),
            status=status,
            raw_status=f"pid {record['pid']} {raw}",
            price_per_hour=float(record.get("price_per_hour") or 0.0),
            host_id=os.uname().nodename,
            gpu=record.get("gpu"),
            storage_price_per_hour=0.0,
        )

    def get(self, provider_instance_id: str) -> ProviderMachine | None:
        if not self.owns(provider_instance_id):
            return None
        record = self._read(provider_instance_id)
        return self._machine(record) if record is not None else None

    def find_by_label(self, label: str) -> ProviderMachine | None:
        return self.get(label)

    def list_owned(self) -> list[ProviderMachine]:
        if not self.state_dir.is_dir():
            return []
        machines = []
        for path in sorted(self.state_dir.glob("*.json")):
            label = path.name[: -len(".json")]
            if not self.owns(label):
                continue
            record = self._read(label)
            if record is not None:
                machines.append(self._machine(record))
        return machines

    # ------------------------------------------------------------------ destroy, stop, start

    def _owned_id(self, provider_instance_id: str) -> bool:
        """True for a machine id of ours; False for one this provider never made; raises
        `NotOwnedError` for another installation's."""
        if parse_label(provider_instance_id) is None:
            return False
        if not self.owns(provider_instance_id):
            raise NotOwnedError(
                f"{self.name}: {provider_instance_id} was not created by this installation",
                provider=self.name,
            )
        return True

    @contextlib.contextmanager
    def _locked(self, label: str) -> Iterator[None]:
        """One stop, start or destroy of a machine at a time, across processes (none for a
        machine without a record: nothing to race on, and no lock file left behind)."""
        if not self._path(label).exists():
            yield
            return
        fd = os.open(self.state_dir / f".{label}.lock", os.O_WRONLY | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def destroy(self, provider_instance_id: str) -> None:
        if not self._owned_id(provider_instance_id):
            return  # not a machine id this provider ever made
        with self._locked(provider_instance_id):
            record = self._read(provider_instance_id)
            if record is None:
                return
            self._end(record)
            folder = Path(str(record.get("folder") or self._folder(provider_instance_id)))
            if folder.resolve().parent == self.state_dir.resolve():  # never one we did not make
                shutil.rmtree(folder, ignore_errors=True)
            with contextlib.suppress(FileNotFoundError):
                self._path(provider_instance_id).unlink()
            with contextlib.suppress(FileNotFoundError):
                (self.state_dir / f".{provider_instance_id}.lock").unlink()
        log.info("%s: destroyed local machine %s", self.name, provider_instance_id)

    def stop(self, provider_instance_id: str) -> None:
        """Its processes end (as destroy ends them); its folder and record stay."""
        if not self._owned_id(provider_instance_id):
            return
        with self._locked(provider_instance_id):
            record = self._read(provider_instance_id)
            if record is None:
                return  # gone: nothing runs
            if record.get("stopped_at") is None:
                # Written first: a stop cut short still reads STOPPED once its processes end.
                record["stopped_at"] = self._clock()
                self._write(provider_instance_id, record)
            self._end(record)
        log.info("%s: stopped local machine %s", self.name, provider_instance_id)

    def start(self, provider_instance_id: str) -> None:
        """The same command again, in the same folder, with the same environment."""
        if not self._owned_id(provider_instance_id):
            raise self._refused(provider_instance_id, "no such machine")
        with self._locked(provider_instance_id):
            record = self._read(provider_instance_id)
            if record is None:
                raise self._refused(provider_instance_id, "it is gone")
            if self._alive(record):
                return  # running already
            if record.get("stopped_at") is None:
                raise self._refused(provider_instance_id, "it exited by itself; we did not stop it")
            folder = record.get("folder")
            if folder is not None and not Path(str(folder)).is_dir():
                raise self._refused(provider_instance_id, f"its folder {folder} is gone")
            self._children.pop(provider_instance_id, None)
            self._power_off(provider_instance_id)  # a straggler of a stop cut short: never two
            self._spawn(record)
            record["stopped_at"] = None
            record["resumes"] = int(record.get("resumes") or 0) + 1
            self._write(provider_instance_id, record)
        log.info(
            "%s: started local machine %s again (pid %d)",
            self.name,
            provider_instance_id,
            record["pid"],
        )

    def _refused(self, label: str, why: str) -> ResumeRefusedError:
        return ResumeRefusedError(
            f"{self.name}: local machine {label} cannot be resumed: {why}", provider=self.name
        )

    def _end(self, record: dict[str, Any]) -> None:
        """End every process of the machine: its group (SIGTERM, SIGKILL after the grace) and
        any that left it but carry its label."""
        label = str(record["label"])
        pgid = int(record["pgid"])
        if self._alive(record):
            self._signal(pgid, signal.SIGTERM)
            deadline = time.monotonic() + self.grace
            while time.monotonic() < deadline and self._alive(record):
                time.sleep(0.05)
            if self._alive(record):
                log.warning("%s: %s ignored SIGTERM; killing it", self.name, label)
                self._signal(pgid, signal.SIGKILL)
                deadline = time.monotonic() + 5.0
                while time.monotonic() < deadline and self._alive(record):
                    time.sleep(0.05)
        self._power_off(label)
        child = self._children.pop(label, None)
        if child is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                child.wait(timeout=1.0)

    def _power_off(self, label: str) -> None:
        """Like a rented machine going away, nothing of it survives: processes that left the
        machine's process group (a worker started in its own session) but still carry its label
        in their environment are stopped too — SIGTERM, then SIGKILL after the grace."""
        left = _labelled_pids(label)
        for pid in left:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + self.grace
        while left and time.monotonic() < deadline:
            time.sleep(0.05)
            left = [p for p in left if _state(p) not in (None, "Z", "X")]
        for pid in left:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)

    @staticmethod
    def _signal(pgid: int, sig: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, sig)


def build(name: str, config: LocalOptions, ctx: ProviderBuild) -> LocalProvider:
    """The local provider's factory (`providers.registry.FACTORIES`): pid files in a folder."""
    if ctx.state_dir is None:
        raise ValueError(f"provider {name!r} (local) needs a state directory for its pid files")
    return LocalProvider(name, config, ctx.installation_id, ctx.state_dir)
