"""The agent's token out of reach of the worker it runs.

The user's task may be compromised; it runs as the agent's uid in the worker image, where the
agent is PID 1. It could read the token from `/proc/<agent>/environ` and fetch the deployment
(the private repository's token) itself. So, before anything else, the agent:

1. moves its token out of its environment: `os.environ` cannot erase what the kernel shows in
   `/proc/<pid>/environ` (the block the process was started with), so the agent starts itself
   again (`execve`, same PID) without the variables, handing them over through a pipe that
   nothing else can read, and reads them back from it — nothing is written to disk. The new
   process imports nothing it did not bring: its interpreter runs isolated (`python -I`: no
   cwd or script folder, PYTHONPATH or any PYTHON* variable, user site on its path; -P is
   implied from 3.11), from `/` (a folder the worker cannot write) — a package the worker left
   in the folder the agent was started from (`autoscaler/__init__.py`) or on a PYTHONPATH is
   never imported by the process that holds the token;
2. marks itself non-dumpable (`prctl(PR_SET_DUMPABLE, 0)`): its `/proc/<pid>/` files (environ,
   mem, fd) become root's, and no process of its uid can ptrace it;
3. runs the worker as another uid when it runs as root and `AUTOSCALER_WORKER_USER` names one.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import pwd
import sys
from collections.abc import Mapping, Sequence

from autoscaler.digits import ascii_whole

SECRET_ENV = ("AUTOSCALER_WORKER_TOKEN", "AUTOSCALER_ENROLMENT_KEY")
HANDOVER_FD = "AUTOSCALER_SECRETS_FD"
"""The variable naming the pipe the secrets come back through after the re-exec."""
PR_SET_DUMPABLE = 4


def hide_secrets(argv: Sequence[str]) -> None:
    """If a secret is in this process's environment, start again without it (never returns
    then). The new process finds the secrets with `take_secrets`."""
    found = {k: os.environ[k] for k in SECRET_ENV if os.environ.get(k)}
    if not found:
        return
    read, write = os.pipe()
    data = json.dumps(found).encode()
    if len(data) > 60_000:  # a pipe's buffer: never block on our own write
        raise ValueError("the agent's secrets are too long to hand over")
    os.write(write, data)
    os.close(write)
    os.set_inheritable(read, True)
    # the environment stays (the worker's is made from it: its PYTHONPATH too); the new
    # interpreter reads none of its PYTHON* variables
    env = {k: v for k, v in os.environ.items() if k not in SECRET_ENV}
    env[HANDOVER_FD] = str(read)
    python = os.path.abspath(sys.executable)  # before the cwd changes
    flags = ["-I"]  # which ignores PYTHONUNBUFFERED: kept as a flag when it was asked for
    if os.environ.get("PYTHONUNBUFFERED"):
        flags.append("-u")
    sys.stdout.flush()
    sys.stderr.flush()
    os.chdir("/")
    os.execve(python, [python, *flags, "-m", "autoscaler.cli", *argv], env)


def take_secrets() -> dict[str, str]:
    """The secrets handed over by `hide_secrets` (empty when there were none), read once; then
    this process is made non-dumpable."""
    fd = ascii_whole(os.environ.pop(HANDOVER_FD, ""))
    secrets: dict[str, str] = {}
    if fd is not None:
        chunks = []
        with contextlib.suppress(OSError):
            while chunk := os.read(fd, 65536):
                chunks.append(chunk)
        with contextlib.suppress(OSError):
            os.close(fd)
        with contextlib.suppress(ValueError):
            loaded = json.loads(b"".join(chunks) or b"{}")
            if isinstance(loaded, dict):
                secrets = {str(k): str(v) for k, v in loaded.items() if k in SECRET_ENV}
    not_dumpable()
    return secrets


def not_dumpable() -> bool:
    """prctl(PR_SET_DUMPABLE, 0) on Linux; False where it cannot be done."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return bool(libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) == 0)
    except (OSError, AttributeError):
        return False


def worker_user(env: Mapping[str, str]) -> pwd.struct_passwd | None:
    """The account the worker runs as: AUTOSCALER_WORKER_USER when the agent runs as root."""
    name = env.get("AUTOSCALER_WORKER_USER", "").strip()
    if not name or os.geteuid() != 0:
        return None
    try:
        return pwd.getpwnam(name)
    except KeyError:
        raise ValueError(f"AUTOSCALER_WORKER_USER names no user here: {name!r}") from None
