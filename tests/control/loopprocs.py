"""The processes and Redis keys a loop test starts or creates, and how they are cleaned up.

Apart from `loopkit.Loop` because tests use them alone: the agent, demo and warm-pool tests look
for a machine's processes by label (`labelled_processes`) or kill them (`kill_local_machines`),
and every test names the Redis databases and a unique queue.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path

import redis

from autoscaler.providers.labels import parse_label

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
BIN = Path(sys.executable).parent
CELERY = str(BIN / "celery")
AUTOSCALER = str(BIN / "autoscaler")

REDIS = os.environ.get("TEST_REDIS_URL", "redis://127.0.0.1:6379")
CONTROL_DB = 13
WATCH_DB = 12
CONTROL_BROKER = f"{REDIS}/{CONTROL_DB}"
WATCH_BROKER = f"{REDIS}/{WATCH_DB}"


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


# --------------------------------------------------------------------------- processes


@dataclass
class Proc:
    name: str
    popen: subprocess.Popen[bytes]
    log: Path

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def text(self) -> str:
        try:
            return self.log.read_text(errors="replace")
        except OSError:
            return ""


def killpg(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def stop_group(popen: subprocess.Popen[bytes], grace: float = 10.0) -> None:
    """SIGTERM the process group, SIGKILL it after `grace` s; always reap the leader."""
    if popen.poll() is None:
        killpg(popen.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            popen.wait(timeout=grace)
    # Pool children may outlive a leader that exited: kill whatever is left of the group.
    killpg(popen.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        popen.wait(timeout=5)


def _proc_env(pid: str) -> dict[str, str]:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    out = {}
    for item in raw.split(b"\0"):
        key, sep, value = item.partition(b"=")
        if sep:
            out[key.decode(errors="replace")] = value.decode(errors="replace")
    return out


def _proc_state(pid: str) -> str | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text(errors="replace")
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[-1].split()
    return fields[0] if fields else None


def labelled_processes(installation_id: str) -> dict[int, str]:
    """Living (not zombie) processes whose AUTOSCALER_LABEL is one of this installation's."""
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        label = _proc_env(entry).get("AUTOSCALER_LABEL")
        parsed = parse_label(label)
        if parsed is None or parsed.installation_id != installation_id:
            continue
        if _proc_state(entry) in (None, "Z", "X"):
            continue
        found[int(entry)] = str(label)
    return found


def purge_control_plane(url: str, prefix: str) -> None:
    """One control plane's keys on its Redis database (tasks, bindings, results: all carry its
    prefix, letters, digits and dashes only), nobody else's."""
    r = redis.Redis.from_url(url)
    try:
        keys = list(r.scan_iter(match=f"{prefix}*", count=500))
        if keys:
            r.delete(*keys)
    finally:
        r.close()


def forget_watched(keys: set[str]) -> None:
    """Delete the watched app's keys of this test, and the `unacked` entries of its queues (a
    machine killed with a prefetched job leaves one; kombu would restore it an hour later)."""
    r = redis.Redis.from_url(WATCH_BROKER)
    try:
        r.delete(*keys)
        stale = []
        for tag, raw in r.hgetall("unacked").items():
            with contextlib.suppress(ValueError, TypeError, IndexError):
                if json.loads(raw)[2] in keys:
                    stale.append(tag)
        if stale:
            r.hdel("unacked", *stale)
            r.zrem("unacked_index", *stale)
    finally:
        r.close()


def kill_local_machines(home: Path, installation_id: str | None) -> list[str]:
    """SIGKILL every local machine: groups from the state files, then labelled stragglers."""
    killed = []
    for path in home.glob("local-machines/*/*.json"):
        with contextlib.suppress(OSError, ValueError, KeyError):
            record = json.loads(path.read_text())
            pid = int(record["pid"])
            stat_ok = _proc_state(str(pid)) not in (None, "Z", "X")
            if stat_ok:
                killpg(int(record["pgid"]), signal.SIGKILL)
                killed.append(str(record["label"]))
    if installation_id:
        for pid, label in labelled_processes(installation_id).items():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
            killed.append(label)
    return killed


# --------------------------------------------------------------------------- the watched app
