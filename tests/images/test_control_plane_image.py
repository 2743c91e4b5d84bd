"""The control plane's image, run for real: `db upgrade`, `serve`, a Celery worker and beat each
start from it against PostgreSQL and Redis on loopback, as the compose file and the systemd
units start them; together they run the loop (a queue with `min_workers: 1` on the mock
provider gets its machine); every container's health check passes; nothing runs as root."""

from __future__ import annotations

import json
import uuid

from autoscaler.store import migrate
from tests.agent.agentkit import free_port
from tests.containers.engine import podman
from tests.control.loopkit import Loop
from tests.control.loopprocs import unique
from tests.images.kit import UID, Images, healthy, status_code, uids, wait


def run_role(
    images: Images,
    containers: list[str],
    env: dict[str, str],
    *argv: str,
    health: list[str] | None = None,
) -> str:
    """A detached container of the control plane's image running one role, on the host's
    network (PostgreSQL and Redis answer on loopback); its name."""
    name = f"asg-test-cp-{uuid.uuid4().hex[:10]}"
    flags = ["--detach", "--name", name, "--network", "host"]
    for key, value in env.items():
        flags += ["--env", f"{key}={value}"]
    if health is not None:  # the compose file's override for the API: its /healthz
        flags += ["--health-cmd", json.dumps(health)]
    podman("run", *flags, images.control, *argv)
    containers.append(name)
    return name


def logs(*names: str) -> str:
    return "\n".join(
        f"--- {n}\n" + podman("logs", "--tail", "40", n, check=False).stderr[-3000:] for n in names
    )


def test_every_role_starts_from_the_image_runs_the_loop_and_is_healthy_as_non_root(
    pg_url, tmp_path, images, containers
):
    loop = Loop(tmp_path, pg_url)  # the control queue and key prefix of this test alone
    port = free_port()
    env = {k: v for k, v in loop.env.items() if k.startswith("AUTOSCALER_")}
    env.update(
        AUTOSCALER_HOME="/var/lib/autoscaler",
        AUTOSCALER_API_BIND=f"127.0.0.1:{port}",
        AUTOSCALER_API_URL=f"http://127.0.0.1:{port}",
    )
    image = json.loads(podman("image", "inspect", images.control).stdout)[0]
    assert image["Config"]["User"] == f"{UID}:{UID}"
    assert image["Healthcheck"]["Test"][-1] == "store"  # kept: built in Docker's format
    try:
        # 1. `autoscaler db upgrade` (the compose file's `migrate` service): to the head
        done = podman(
            "run",
            "--rm",
            "--network",
            "host",
            *[f"--env={k}={v}" for k, v in env.items()],
            images.control,
            "autoscaler",
            "db",
            "upgrade",
            timeout=120,
        )
        engine = loop.engine
        current, head = migrate.revisions(engine)
        assert current == head is not None, done.stdout + done.stderr
        queue = unique("cp-image")
        loop.setup(
            {
                "poll_interval": 2,
                "boot_timeout": 30,
                "providers": {"sandbox": {"kind": "mock", "boot_delay": 1}},
                "queues": {
                    queue: {
                        "metrics": {"source": "redis-list", "url": "redis://127.0.0.1:6379/12"},
                        "autoscale": {
                            "provider": "sandbox",
                            "min_workers": 1,
                            "max_workers": 1,
                            "instance": {"gpu": "RTX 4090", "max_price_per_hour": 1.0},
                        },
                    }
                },
            }
        )

        # 2. each long-running role, as deploy/compose.yaml starts it
        control, lifecycle = loop.control_queue, f"{loop.control_queue}.lifecycle"
        api = run_role(
            images,
            containers,
            env,
            "autoscaler",
            "serve",
            health=["python", "-m", "autoscaler.ops.healthcheck", "api"],
        )
        worker = run_role(
            images,
            containers,
            env,
            "celery",
            "-A",
            "autoscaler",
            "worker",
            "-Q",
            f"{control},{lifecycle}",
            "-l",
            "info",
            "--concurrency",
            "2",
            "-n",
            f"image-{uuid.uuid4().hex[:6]}@%h",
        )
        beat = run_role(images, containers, env, "celery", "-A", "autoscaler", "beat", "-l", "info")
        names = (api, worker, beat)

        wait(
            "the API's /healthz",
            lambda: status_code(f"http://127.0.0.1:{port}/healthz") == 200,
            60,
            lambda: logs(api),
        )
        wait("the worker ready", lambda: " ready." in logs(worker), 60, lambda: logs(worker))

        # 3. the loop runs in the containers: beat ticks, the worker launches the queue's one
        # machine on the mock provider and sees it ready
        ready = wait(
            "the queue's machine ready",
            lambda: [r for r in loop.instances(queue) if r["state"] == "ready"],
            90,
            lambda: logs(*names),
        )
        assert len(ready) == 1, loop.instances(queue)

        # 4. every role's health check passes, and nothing in them runs as root
        for name in names:
            assert wait(f"{name} healthy", lambda n=name: healthy(n), 60, lambda n=name: logs(n))
            assert uids(name) == {UID}, (name, podman("top", name, "huser", "args").stdout)
    finally:
        loop.close()
