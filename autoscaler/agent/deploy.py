"""Deploy the queue's Git repository into the agent's work folder, warm when it can.

A machine of a warm pool is stopped with its disk kept and started again later: its agent
starts from scratch in the same work folder (`AUTOSCALER_AGENT_WORKDIR`; on RunPod the volume
mount, since the container disk is erased at a stop). What the folder holds:

    <workdir>/repo            the checkout, its .git inside (the worker may use git there)
    <workdir>/site-packages   the requirements (`pip install --target`, their scripts in bin/):
                              on the work folder's disk, not in the image's venv, so they
                              survive a stop; the worker finds them through PYTHONPATH and PATH
    <workdir>/deploy.json     what is deployed (URL, commit, what was installed), replaced
                              atomically, only ever describing a finished deploy

A start that finds a checkout of the same URL fetches and checks out the ref's commit; when
what decides the install (requirements.txt's bytes, the Python, the commit only if the file
names local files) is what was installed, it installs nothing: the resume costs the
provider's start plus the worker's. Anything inconsistent (no or unreadable state, another
URL, a checkout git cannot use or fetch into) is a fresh clone into a folder of its own,
swapped in once complete, and an install; a failure there is the AgentError a cold machine
gets — never a half-deployed folder taken for a good one.

The checkout may have been written by the worker (the user's task, which may be compromised)
since it was made. Git runs in it with its git dir named explicitly, its config rewritten by
us, hooks and fsmonitor off, so nothing the worker left there runs as the agent or sees the
repository's token; the token only ever reaches git through its environment, never a file.
git and pip are the image's own (tools.py): git found on a fixed PATH of system folders, pip
run as `<the agent's interpreter> -I -m pip`, both with a clean environment — no `git`, `pip`,
`pip/` or `pip.py` in the checkout or a cwd is ever what runs.

`deploy.json` says what the folder holds, and so decides whether a start clones and installs.
It is trusted only when it is a regular file owned by the agent's own uid, with one link,
writable by no group or other (the agent writes it 0600): when the agent runs as root and its
worker as another uid, the worker cannot make one (it can delete it: a cold deploy). An
ownership check rather than an HMAC: a key must live somewhere the worker cannot read or
replace, which is the same ownership check, and it is lost where the disk is (RunPod's
container disk) while the record is on the volume. A worker of the agent's own uid can write
anything the agent can: nothing on disk is trusted against it (the image's default; run the
agent as root with AUTOSCALER_WORKER_USER for the separation).
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import logging
import os
import re
import shutil
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from autoscaler import wire
from autoscaler.agent import tools

log = logging.getLogger("autoscaler.agent")

STATE = "deploy.json"
STATE_VERSION = 1
REPO = "repo"
SITE = "site-packages"
FULL_SHA = re.compile(r"[0-9a-f]{40}|[0-9a-f]{64}")
SAFE_GIT = ("-c", "core.hooksPath=/dev/null", "-c", "core.fsmonitor=false")
"""Before every git command: no hook and no fsmonitor command the worker may have left in the
checkout runs as the agent (the rewritten config has none either; these also cover a clone)."""
REFSPEC = "+refs/heads/*:refs/remotes/origin/*"


class DeployError(Exception):
    """The deploy cannot go on; the message says why (never a token). run.py turns it into an
    AgentError."""


class Unusable(DeployError):
    """The checkout in the work folder cannot be used warm: a fresh clone replaces it."""


def git_auth_env(token: object) -> dict[str, str]:
    """Git's config through the environment (git ≥ 2.31): the token goes in an HTTP header for
    the clone, never into the command line (`ps`), the URL or the clone's .git/config."""
    if not isinstance(token, str) or not token:
        return {}
    basic = base64.b64encode(f"x-access-token:{token}".encode()).decode()
    return {
        "GIT_CONFIG_COUNT": "1",
        "GIT_CONFIG_KEY_0": "http.extraHeader",
        "GIT_CONFIG_VALUE_0": f"Authorization: Basic {basic}",
    }


@dataclass
class Deployed:
    """What `prepare` did: the e2e and the first heartbeat measure a warm start by it."""

    repo: Path
    commit: str
    checkout: str  # "kept" (fetched into the checkout found) or "cloned"
    install: str  # "skipped", "installed" or "none" (no requirements.txt)
    site_packages: Path | None
    why: str = ""  # why it was not warm ("" when it was)
    seconds: dict[str, float] = field(default_factory=dict)
    at: dict[str, float] = field(default_factory=dict)
    """Wall-clock times (epoch seconds) its phases ended: `code_fetched` (the checkout at its
    ref) and `requirements_installed` (installed, skipped or none to install)."""

    @property
    def warm(self) -> bool:
        return self.checkout == "kept" and self.install != "installed"

    def summary(self) -> str:
        start = "warm start" if self.warm else "cold start"
        why = f" ({self.why})" if self.why else ""
        times = ", ".join(f"{k} {v:.2f}s" for k, v in self.seconds.items())
        return (
            f"{start}{why}: checkout {self.checkout} at {self.commit[:12]}, "
            f"install {self.install}; {times}"
        )

    def report(self) -> dict[str, Any]:
        return {
            "warm": self.warm,
            "checkout": self.checkout,
            "install": self.install,
            "commit": self.commit,
            "why": self.why,
            "seconds": {k: round(v, 3) for k, v in self.seconds.items()},
        }


class Git:
    """git with the deployment's environment, always hardened (SAFE_GIT); in a checkout, its
    git dir and work tree named explicitly (no discovery: git's ownership check is for
    discovered repositories, and the agent may be root in a folder given to the worker)."""

    def __init__(self, env: Mapping[str, str]) -> None:
        self.env = dict(env)
        try:
            self.exe = tools.find("git")  # the image's, once: never one on a relative PATH
        except tools.ToolMissing as exc:
            raise DeployError(str(exc)) from None

    def __call__(self, *args: str, repo: Path | None = None, cwd: Path | None = None) -> str:
        cmd = [self.exe, *SAFE_GIT]
        if repo is not None:
            cmd += [f"--git-dir={repo / '.git'}", f"--work-tree={repo}"]
        cmd += args
        try:
            done = subprocess.run(
                cmd,
                env=self.env,
                cwd=repo or cwd,
                capture_output=True,
                text=True,
                timeout=600,
                stdin=subprocess.DEVNULL,
            )
        except subprocess.TimeoutExpired:
            raise DeployError(f"git {args[0]} took longer than 600 s") from None
        # git goes on past a damaged object store (a pack it cannot read is skipped) saying
        # "error:": a checkout that needs that is one to clone afresh, not to trust
        errors = [x for x in done.stderr.splitlines() if x.startswith(("error:", "fatal:"))]
        if done.returncode != 0 or errors:
            why = (errors[0] if errors else done.stderr.strip())[:300]
            raise DeployError(f"git {args[0]} failed: {why}")
        return done.stdout.strip()

    def maybe(self, *args: str, repo: Path | None = None, cwd: Path | None = None) -> str | None:
        with contextlib.suppress(DeployError):
            return self(*args, repo=repo, cwd=cwd)
        return None


def _commit_of(git: Git, repo: Path, name: str) -> str | None:
    return git.maybe("rev-parse", "--verify", "--quiet", f"{name}^{{commit}}", repo=repo)


def _resolve(git: Git, repo: Path, ref: str | None) -> tuple[str, str | None]:
    """(commit, branch to check out or None: detached) of the ref, in the order `git checkout
    <ref>` right after a clone finds it: a branch of the remote, a tag, any commit-ish; no ref:
    the remote's default branch."""
    if ref is None:
        head = git.maybe("symbolic-ref", "--quiet", "refs/remotes/origin/HEAD", repo=repo)
        commit = _commit_of(git, repo, head) if head else None
        if not head or not commit:
            raise DeployError("the repository's default branch cannot be found")
        return commit, head.removeprefix("refs/remotes/origin/")
    for name, branch in ((f"refs/remotes/origin/{ref}", ref), (f"refs/tags/{ref}", None)):
        commit = _commit_of(git, repo, name)
        if commit:
            return commit, branch
    commit = _commit_of(git, repo, ref)
    if commit:
        return commit, None
    raise DeployError(f"the ref {ref!r} names no commit of the repository")


def _check_out(git: Git, repo: Path, ref: str | None) -> str:
    """Check out the ref (forced: what the worker changed in tracked files is put back; what it
    added is kept) and return the commit, checked."""
    commit, branch = _resolve(git, repo, ref)
    if branch is not None:
        git("checkout", "--quiet", "--force", "-B", branch, commit, "--", repo=repo)
    else:
        git("checkout", "--quiet", "--force", "--detach", commit, "--", repo=repo)
    head = git("rev-parse", "--verify", "HEAD", repo=repo)
    if head != commit:
        raise DeployError(f"the checkout is at {head[:12]}, not {commit[:12]}")
    return commit


def _is_dir(path: Path) -> bool:
    """A real directory (a symlink left in its place is not one)."""
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode)
    except OSError:
        return False


def _remove(path: Path) -> None:
    """Whatever is at `path`, gone (rmtree never follows a link out of the folder)."""
    if _is_dir(path):
        shutil.rmtree(path)
    else:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)


def _config_text(url: str, object_format: str | None) -> str:
    """A checkout's .git/config as a clone writes it, and nothing else."""
    if any(ord(c) < 0x20 or c == "\x7f" for c in url):
        raise DeployError("the deployment's git_url holds a control character")
    quoted = url.replace("\\", "\\\\").replace('"', '\\"')
    version = 1 if object_format == "sha256" else 0
    ext = f"[extensions]\n\tobjectformat = {object_format}\n" if version else ""
    return (
        f"[core]\n\trepositoryformatversion = {version}\n\tfilemode = true\n\tbare = false\n"
        f"\tlogallrefupdates = true\n{ext}"
        f'[remote "origin"]\n\turl = "{quoted}"\n\tfetch = {REFSPEC}\n'
    )


def _reset_git_dir(git: Git, repo: Path, url: str) -> None:
    """Make the checkout's git dir what a clone of `url` made, whatever the worker did to it:
    its config rewritten (no include, hook path, filter, helper, proxy, URL rewrite or command
    of anyone's), no alternates, no link to another git dir."""
    gitdir = repo / ".git"
    if not _is_dir(repo) or not _is_dir(gitdir) or not (gitdir / "HEAD").is_file():
        raise Unusable(f"no checkout in {repo}")
    if (gitdir / "commondir").exists() or (gitdir / "commondir").is_symlink():
        raise Unusable("the checkout's git dir points to another one")
    config = gitdir / "config"
    fmt = None
    if config.is_file() and not config.is_symlink():
        # read as a plain file: no include is followed, nothing of it is run
        fmt = git.maybe(
            "config", "--file", str(config), "--get", "extensions.objectformat", cwd=repo
        )
    _write_atomic(config, _config_text(url, fmt if fmt in ("sha1", "sha256") else None))
    _remove(gitdir / "objects" / "info" / "alternates")


def _fetch(git: Git, repo: Path, ref: str | None) -> str:
    """Fetch into the checkout and check out the ref's commit. A ref that is a full commit id
    the checkout holds needs no fetch (a commit never changes: a resume with the Git host down
    still starts it); a branch or a tag is always fetched, never started stale."""
    if ref is not None and FULL_SHA.fullmatch(ref) and _commit_of(git, repo, ref) == ref:
        return _check_out(git, repo, ref)
    git("fetch", "--quiet", "--force", "--prune", "--tags", "--", "origin", repo=repo)
    if ref is None:
        git("remote", "set-head", "origin", "--auto", repo=repo)
    elif not any(
        _commit_of(git, repo, n) for n in (f"refs/remotes/origin/{ref}", f"refs/tags/{ref}", ref)
    ):
        # a commit on no branch or tag (e.g. a pull request's): asked for by name
        git("fetch", "--quiet", "--", "origin", ref, repo=repo)
    return _check_out(git, repo, ref)


def _clone(git: Git, url: str, ref: str | None, workdir: Path) -> str:
    """A fresh clone next to the checkout, swapped in only once complete (a failed clone leaves
    the folder as it was)."""
    repo, new, old = workdir / REPO, workdir / f"{REPO}.new", workdir / f"{REPO}.old"
    _remove(new)
    try:
        # `--` ends the options: what follows is the URL and the folder
        git("clone", "--quiet", "--no-checkout", "--", url, str(new), cwd=workdir)
        commit = _check_out(git, new, ref)
    except DeployError:
        _remove(new)
        raise
    _remove(old)
    if os.path.lexists(repo):
        os.rename(repo, old)
    os.rename(new, repo)
    _remove(old)
    return commit


# --- the install -------------------------------------------------------------------------

LOCAL_OPTIONS = ("-r", "--requirement", "-c", "--constraint", "-e", "--editable")
ARCHIVES = (".whl", ".zip", ".tar.gz", ".tgz", ".tar.bz2", ".tar")
DIRECT = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*\s*(?:\[[^\]]*\])?\s*@\s*(\S+)")


def names_local_files(text: str) -> bool:
    """Whether a requirements file installs anything from the checkout (another requirements
    file, a path, a wheel, `-e .`, `--find-links ./dir`): then what it installs can change with
    the commit although its own bytes do not. Whatever looks like a path counts."""
    joined = re.sub(r"\\\r?\n", " ", text)
    for raw in joined.splitlines():
        line = re.sub(r"(^|\s)#.*", "", raw).strip()
        if not line:
            continue
        if line.startswith("-"):
            name, _, value = line.replace("=", " ", 1).partition(" ")
            if not name.startswith("--") and len(name) > 2:  # `-rbase.txt`
                name, value = name[:2], name[2:]
            value = value.strip()
            if name in LOCAL_OPTIONS:
                return True
            if name in ("-f", "--find-links") and not value.startswith(("http://", "https://")):
                return True
            continue
        spec = line.split(";", 1)[0].strip()  # no environment marker
        direct = DIRECT.match(spec)  # `name @ url`
        target = direct.group(1) if direct else spec.split()[0]
        if "://" in target:
            if target.split("://", 1)[0].endswith("file"):  # file://, git+file://
                return True
            continue
        if direct or target.startswith((".", "/", "~", "file:")) or "/" in target:
            return True
        if "\\" in target or target.lower().endswith(ARCHIVES):
            return True
    return False


def _python() -> str:
    """The interpreter the install is for (an image with another Python gets another)."""
    return f"{sys.executable} {sys.version.split()[0]} {sys.implementation.cache_tag}"


def install_key(repo: Path, commit: str) -> dict[str, Any] | None:
    """What decides what `pip install -r requirements.txt` puts in site-packages; None without
    a requirements file."""
    req = repo / "requirements.txt"
    if not req.is_file():
        return None
    data = req.read_bytes()
    local = names_local_files(data.decode("utf-8", errors="replace"))
    return {
        "python": _python(),
        "requirements_sha256": hashlib.sha256(data).hexdigest(),
        "commit": commit if local else None,
    }


PIP_QUIET = ("--quiet", "--no-input", "--disable-pip-version-check", "--no-warn-script-location")


def _install(repo: Path, workdir: Path) -> None:
    """pip install -r requirements.txt into a new folder; the old one stays until it is done.
    The agent's interpreter isolated (`-I`: no cwd, PYTHONPATH or user site on its path), so a
    `pip/` or `pip.py` of the checkout, its cwd, is never the pip that runs."""
    new = workdir / f"{SITE}.new"
    _remove(new)
    new.mkdir()
    argv = [tools.python(), "-I", "-m", "pip", "install", *PIP_QUIET, "--target", str(new)]
    try:
        done = subprocess.run(
            [*argv, "-r", "requirements.txt"],
            cwd=repo,  # paths in the file are the checkout's
            env=tools.pip_env(),
            capture_output=True,
            text=True,
            timeout=1800,
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired:
        done = None
    if done is None or done.returncode != 0:
        _remove(new)
        why = done.stderr[-300:] if done is not None else "it took longer than 1800 s"
        raise DeployError(f"pip install -r requirements.txt failed: {why}")


def _swap_in(workdir: Path) -> None:
    site, new, old = workdir / SITE, workdir / f"{SITE}.new", workdir / f"{SITE}.old"
    _remove(old)
    if os.path.lexists(site):
        os.rename(site, old)
    os.rename(new, site)
    _remove(old)


# --- the state ---------------------------------------------------------------------------


def _write_atomic(path: Path, text: str) -> None:
    """A new file under a random name (never through a link planted in the folder), synced,
    then renamed over `path`."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    with contextlib.suppress(OSError):
        dir_fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)


STATE_MAX = 1 << 20


def untrusted(st: os.stat_result) -> str | None:
    """Why a state file's stat cannot be the agent's own record (None: it can). The agent
    writes it 0600 as itself; only a file of its own uid that no group or other may write, with
    no other name (a hard link), is one it wrote."""
    if not stat.S_ISREG(st.st_mode):
        return "not a regular file"
    if st.st_uid != os.geteuid():
        return f"owned by uid {st.st_uid}, not the agent's ({os.geteuid()})"
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"writable by group or others (mode {stat.S_IMODE(st.st_mode):04o})"
    if st.st_nlink != 1:
        return f"{st.st_nlink} links to it"
    return None


def load_state(workdir: Path) -> tuple[dict[str, Any] | None, str]:
    """The last finished deploy's record and, when there is none to use, why. One the agent
    did not write (see `untrusted`) is ignored, said in the log: a cold deploy follows."""
    path = workdir / STATE
    try:
        # never through a link; non-blocking: a FIFO left there does not hang the agent
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return None, "no deploy record in the work folder"
    except OSError as exc:  # a link: ELOOP
        return _distrusted(path, f"it cannot be opened: {exc.strerror or type(exc).__name__}")
    with os.fdopen(fd, "rb") as fh:
        bad = untrusted(os.fstat(fh.fileno()))  # the file opened, not a name raced
        if bad is not None:
            return _distrusted(path, bad)
        try:
            raw = fh.read(STATE_MAX + 1)
            data = json.loads(raw) if len(raw) <= STATE_MAX else None
        except (OSError, ValueError):
            data = None
    if (
        not isinstance(data, dict)
        or data.get("version") != STATE_VERSION
        or not isinstance(data.get("url"), str)
        or not isinstance(data.get("commit"), str)
        or not (data.get("install") is None or isinstance(data.get("install"), dict))
    ):
        return None, "no deploy record in the work folder"
    return data, ""


def _distrusted(path: Path, bad: str) -> tuple[None, str]:
    log.warning("deploy: %s is not trusted (%s): ignored, a cold deploy follows", path, bad)
    return None, f"the deploy record is not trusted: {bad}"


def _forget_state(workdir: Path) -> None:
    """Before site-packages changes: no record may describe a folder half replaced."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(workdir / STATE)


# --- the deploy --------------------------------------------------------------------------


def usable_workdir(path: Path) -> Path:
    """`path`, made, when the agent can write there; else a new temp folder (a cold start each
    time, said in the log) rather than an agent that exits at every start of its machine (a
    volume mounted for another account, a read-only disk)."""
    path = path.absolute()
    try:
        path.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(dir=path, prefix=".probe.")
        os.close(fd)
        os.unlink(probe)
        return path
    except OSError as exc:
        fallback = Path(tempfile.mkdtemp(prefix="asg-agent-"))
        log.warning(
            "the work folder %s cannot be written (%s): using %s, where nothing survives a "
            "stop of the machine",
            path,
            exc.strerror or type(exc).__name__,
            fallback,
        )
        return fallback


def prepare(dep: wire.DeploymentAnswer, workdir: Path) -> Deployed:
    """The checkout of the deployment's ref and its installed requirements, warm when the work
    folder holds them already (see the module's docstring)."""
    try:
        return _prepare(dep, workdir)
    except OSError as exc:  # a folder or file of the work folder: said, not a traceback
        raise DeployError(f"the work folder cannot be used: {exc}") from None


def _prepare(dep: wire.DeploymentAnswer, workdir: Path) -> Deployed:
    url = dep.git_url
    if not url:
        raise DeployError("the deployment has no git_url")
    ref = dep.git_ref or None
    for name, value in (("git_url", url), ("git_ref", ref)):
        # git would read a value starting with '-' as an option (`--orphan=…`, `--upload-pack=…`)
        if value is not None and value.startswith("-"):
            raise DeployError(f"the deployment's {name} starts with '-': refused (not an option)")
    workdir = workdir.absolute()  # the worker's cwd is the checkout: no relative path works
    workdir.mkdir(parents=True, exist_ok=True)
    git = Git(tools.git_env(git_auth_env(dep.git_token)))
    repo = workdir / REPO
    seconds: dict[str, float] = {}
    at: dict[str, float] = {}

    started = time.monotonic()
    state, why = load_state(workdir)
    checkout, commit = "kept", ""
    if state is not None and state["url"] != url:
        why, state = "the checkout is of another repository", None
    if state is not None:
        try:
            _reset_git_dir(git, repo, url)
            commit = _fetch(git, repo, ref)
        except (DeployError, OSError) as exc:
            why = f"checkout not usable: {exc}"
    if why:
        checkout = "cloned"
        log.info("deploy: fresh clone (%s)", why)
        commit = _clone(git, url, ref, workdir)
    seconds["git"] = time.monotonic() - started
    at["code_fetched"] = time.time()

    started = time.monotonic()
    key = install_key(repo, commit)
    site = workdir / SITE
    if key is None:
        install = "none"
        if os.path.lexists(site):
            _forget_state(workdir)
            _remove(site)
    elif state is not None and state.get("install") == key and _is_dir(site):
        install = "skipped"
    else:
        install = "installed"
        why = why or "the requirements changed"
        _install(repo, workdir)
        _forget_state(workdir)
        _swap_in(workdir)
    seconds["install"] = time.monotonic() - started
    at["requirements_installed"] = time.time()
    record = {"version": STATE_VERSION, "url": url, "commit": commit, "install": key}
    _write_atomic(workdir / STATE, json.dumps(record, indent=1) + "\n")
    return Deployed(
        repo=repo,
        commit=commit,
        checkout=checkout,
        install=install,
        site_packages=site if key is not None else None,
        why=why,
        seconds=seconds,
        at=at,
    )
