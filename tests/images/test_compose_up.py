"""deploy/compose.yaml brought up for real with podman-compose: the control plane's image in
every service (migrate, the API, beat, two loop workers, two lifecycle workers, Flower) beside
PostgreSQL and Redis. No image registry is reached here, so those two are stand-ins built from
Debian's packages (tests/images/stand-ins/, named by tests/images/compose.stand-ins.yaml);
everything else is the file as users run it, with its secrets file and its `.env`.

A job flows through it: an operator's `celery call autoscaler.scale` goes through the compose
Redis to a worker, which pins the queue at one machine; the loop rents it (the mock provider)
and sees it ready; Flower, behind its login, shows the task succeeded. Every service's health
check passes, and the autoscaler's services run as uid 10001.

podman-compose does not wait for `service_healthy` / `service_completed_successfully`: the
test starts PostgreSQL and Redis first and waits for their health checks, as the conditions
would."""

from __future__ import annotations

import json
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
from cryptography.fernet import Fernet

from tests.containers.engine import REPO, image_exists, podman, run
from tests.images.kit import UID, Images, healthy, status_code, uids, wait

STAND_INS = Path(__file__).parent / "stand-ins"
POSTGRES = "localhost/gpu-queue-autoscaler-stand-in-postgres:15"
REDIS = "localhost/gpu-queue-autoscaler-stand-in-redis:7"
SERVICES = ("api", "beat", "worker_1", "worker_2", "lifecycle_1", "lifecycle_2", "flower")
API = "http://127.0.0.1:8480"
FLOWER = "http://127.0.0.1:5555"


@pytest.fixture(scope="session")
def stand_ins(images: Images) -> None:
    """PostgreSQL and Redis images from Debian's packages, FROM the base images.sh made."""
    for tag, folder in ((POSTGRES, "postgres"), (REDIS, "redis")):
        if not image_exists(tag):
            podman(
                "build",
                "--quiet",
                "--network",
                "host",
                "-t",
                tag,
                str(STAND_INS / folder),
                timeout=900,
            )


@pytest.fixture
def project(tmp_path: Path) -> Iterator[tuple[Path, str, dict[str, str]]]:
    """deploy/ as a user lays it out (compose file, redis.conf, secrets/vault_key, .env) in a
    folder of the test's; the project is taken down with its volumes at the end."""
    folder = tmp_path / "deploy"
    (folder / "secrets").mkdir(parents=True)
    shutil.copy(REPO / "deploy" / "compose.yaml", folder)
    shutil.copytree(REPO / "deploy" / "redis", folder / "redis")
    shutil.copy(Path(__file__).parent / "compose.stand-ins.yaml", folder)
    key = folder / "secrets" / "vault_key"
    key.write_text(Fernet.generate_key().decode())
    key.chmod(0o600)
    env = {
        "POSTGRES_PASSWORD": f"pg-{uuid.uuid4().hex[:12]}",
        "REDIS_PASSWORD": f"rd-{uuid.uuid4().hex[:12]}",
        "FLOWER_BASIC_AUTH": f"operator:fl-{uuid.uuid4().hex[:12]}",
        "AUTOSCALER_PUBLIC_URL": API,
        "AUTOSCALER_IMAGE": "localhost/gpu-queue-autoscaler:dev",
    }
    (folder / ".env").write_text("".join(f"{k}={v}\n" for k, v in env.items()))
    (folder / ".env").chmod(0o600)
    name = f"asgc{uuid.uuid4().hex[:8]}"
    try:
        yield folder, name, env
    finally:
        # what `down -v` does, without its 10 s stop grace for each of the ten containers
        leftovers = podman(
            "ps", "-a", "-q", "--filter", f"label=io.podman.compose.project={name}", check=False
        ).stdout.split()
        if leftovers:
            podman("rm", "--force", "--time", "0", *leftovers, check=False)
        podman("network", "rm", "--force", f"{name}_default", check=False)
        for volume in ("pgdata", "redisdata", "autoscaler-home"):
            podman("volume", "rm", "--force", f"{name}_{volume}", check=False)


def compose(
    folder: Path, name: str, *args: str, check: bool = True
) -> subprocess.CompletedProcess[str]:
    argv = ["podman-compose", "-p", name, "-f", "compose.yaml", "-f", "compose.stand-ins.yaml"]
    return run([*argv, *args], cwd=folder, check=check, timeout=300)


def test_the_compose_file_comes_up_and_a_job_flows_through_it(images, stand_ins, project):
    folder, name, env = project
    c = {
        s: f"{name}_{s}" if "_" in s else f"{name}_{s}_1"
        for s in (*SERVICES, "migrate", "postgres", "redis")
    }

    def dump() -> str:
        out = [
            podman(
                "ps",
                "-a",
                "--filter",
                f"label=io.podman.compose.project={name}",
                "--format",
                "{{.Names}} {{.Status}}",
                check=False,
            ).stdout
        ]
        for container in c.values():
            out.append(
                f"--- {container}\n"
                + podman("logs", "--tail", "20", container, check=False).stderr[-2000:]
            )
        return "\n".join(out)

    # 1. the stores first (what `condition: service_healthy` asks), then the rest
    compose(folder, name, "up", "-d", "postgres", "redis")
    wait(
        "PostgreSQL and Redis healthy",
        lambda: healthy(c["postgres"]) and healthy(c["redis"]),
        90,
        dump,
    )
    compose(folder, name, "up", "-d")
    wait(
        "the migration done",
        lambda: (
            podman(
                "inspect",
                "--format",
                "{{.State.Status}} {{.State.ExitCode}}",
                c["migrate"],
                check=False,
            ).stdout.split()
            == ["exited", "0"]
        ),
        120,
        dump,
    )
    wait(
        "the API answering on its published port",
        lambda: status_code(f"{API}/healthz") == 200,
        90,
        dump,
    )

    def exec_(service: str, *argv: str) -> str:
        return podman("exec", c[service], *argv, timeout=120).stdout

    # 2. an operator's config: a queue on the mock provider, watched on the compose Redis
    queue = f"compose-{uuid.uuid4().hex[:6]}"
    config = {
        "poll_interval": 2,
        "boot_timeout": 60,
        "providers": {"sandbox": {"kind": "mock", "boot_delay": 1}},
        "queues": {
            queue: {
                "metrics": {
                    "source": "redis-list",
                    "url": f"redis://:{env['REDIS_PASSWORD']}@redis:6379/0",
                },
                "autoscale": {
                    "provider": "sandbox",
                    "max_workers": 2,
                    "instance": {"gpu": "RTX 4090", "max_price_per_hour": 1.0},
                },
            }
        },
    }
    path = folder / "config.yaml"
    path.write_text(json.dumps(config))
    podman("cp", str(path), f"{c['api']}:/tmp/config.yaml")
    exec_("api", "autoscaler", "apply", "/tmp/config.yaml", "--by", "compose-test")

    # 3. the job: `celery call` through the compose Redis to a worker, then the loop
    task_id = (
        exec_(
            "worker_1",
            "celery",
            "-A",
            "autoscaler",
            "call",
            "autoscaler.scale",
            "--args",
            json.dumps([queue, 1]),
        )
        .strip()
        .splitlines()[-1]
    )

    def ready() -> list[Any]:
        rows = json.loads(exec_("api", "autoscaler", "instances", "--queue", queue, "--json"))
        return [r for r in rows if r["state"] == "ready"]

    assert len(wait("the pinned machine ready", ready, 120, dump)) == 1

    user, _, password = env["FLOWER_BASIC_AUTH"].partition(":")
    assert status_code(f"{FLOWER}/api/task/info/{task_id}") == 401  # its login, or nothing
    info = wait(
        "Flower showing the task",
        lambda: _task(f"{FLOWER}/api/task/info/{task_id}", (user, password)),
        60,
        dump,
    )
    assert info["name"] == "autoscaler.scale" and info["state"] == "SUCCESS", info

    # 4. every service healthy; the autoscaler's own as uid 10001
    for service in (*SERVICES, "postgres", "redis"):
        assert wait(f"{service} healthy", lambda s=service: healthy(c[s]), 60, dump)
    for service in SERVICES:
        assert uids(c[service]) == {UID}, service


def _task(url: str, auth: tuple[str, str]) -> dict[str, Any] | None:
    try:
        answer = requests.get(url, auth=auth, timeout=2)
    except requests.RequestException:
        return None
    if answer.status_code != 200:
        return None
    data: dict[str, Any] = answer.json()
    return data if data.get("state") == "SUCCESS" else None
