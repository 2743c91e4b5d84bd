"""The programs the agent runs for a deploy (git, pip), the image's own.

The work folder — the checkout, and whatever the worker (the user's task, which may be
compromised) left there — is the worker's. Nothing in it, nor in the agent's working folder, may
be what the agent runs: a `git` or `pip` on a relative PATH entry, a `pip/` package or `pip.py`
that `python -m pip` finds in its cwd, a PYTHONPATH. So:

- git is found once, on a fixed PATH of system folders (`TRUSTED_PATH`), never the agent's own
  PATH; pip is `<the agent's interpreter, absolute> -I -m pip` (isolated: no cwd, PYTHONPATH
  or user site on its path, whatever cwd the install needs for the paths in requirements.txt);
- both get a clean environment: PATH fixed, HOME the agent's account's, the locale, and the
  network settings the machine was given (proxies, CA bundles, pip's own `PIP_*`) — nothing
  else of the agent's environment, and git reads no user's config (only the system's).
"""

from __future__ import annotations

import os
import pwd
import shutil
import sys
from collections.abc import Mapping

TRUSTED_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
"""Where the agent looks for git: system folders only (root's in any image)."""

PASSED = (
    "LANG",
    "LC_ALL",
    "LC_CTYPE",
    "TZ",
    "TMPDIR",
    "http_proxy",
    "https_proxy",
    "no_proxy",
    "all_proxy",
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "NO_PROXY",
    "ALL_PROXY",
    "SSL_CERT_FILE",
    "SSL_CERT_DIR",
    "REQUESTS_CA_BUNDLE",
    "CURL_CA_BUNDLE",
    "GIT_SSL_CAINFO",
    "SSH_AUTH_SOCK",
)
"""What the tools get of the agent's environment (the launch's, not the worker's): the locale
and the machine's network settings."""


class ToolMissing(Exception):
    """A tool the deploy needs is not in the image's system folders."""


def find(name: str) -> str:
    """`name`'s absolute path on TRUSTED_PATH (never the agent's PATH, never a relative one)."""
    found = shutil.which(name, path=TRUSTED_PATH)
    if found is None or not os.path.isabs(found):
        raise ToolMissing(f"{name} is not installed in {TRUSTED_PATH}")
    return found


def python() -> str:
    """The agent's own interpreter, absolute: what pip runs with (`python -I -m pip`)."""
    return os.path.abspath(sys.executable)


def home() -> str:
    """The agent's account's home folder (passwd), else $HOME, else /."""
    try:
        return pwd.getpwuid(os.geteuid()).pw_dir or "/"
    except KeyError:
        return os.environ.get("HOME") or "/"


def base_env(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """What every tool gets: PATH fixed, HOME the agent's, the locale and network settings."""
    e = os.environ if env is None else env
    return {"PATH": TRUSTED_PATH, "HOME": home()} | {k: e[k] for k in PASSED if k in e}


def git_env(extra: Mapping[str, str], env: Mapping[str, str] | None = None) -> dict[str, str]:
    """git's environment: `base_env`, no prompt, no user's config (`~/.gitconfig` may be in a
    home the worker writes: a URL rewrite there would send the token elsewhere), then `extra`
    (the token's header, `deploy.git_auth_env`)."""
    fixed = {"GIT_TERMINAL_PROMPT": "0", "GIT_CONFIG_GLOBAL": os.devnull}
    return base_env(env) | fixed | dict(extra)


def pip_env(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """pip's environment: `base_env` with the interpreter's own scripts first on PATH (build
    backends), and pip's settings (`PIP_*`: index, find-links, certificates)."""
    e = os.environ if env is None else env
    out = base_env(e)
    out["PATH"] = os.pathsep.join([os.path.dirname(python()), TRUSTED_PATH])
    out.update({k: v for k, v in e.items() if k.startswith("PIP_")})
    return out
