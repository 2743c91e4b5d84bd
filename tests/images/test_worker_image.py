"""The worker image end to end, driven by the loop itself: a queue fills, the loop creates a
container of the worker image through the `container` provider (Podman's API, on this
machine), given only what a launch gives a machine (the API's URL, its token, its launch id
and label). The agent in it registers with a real `autoscaler serve`, clones a Git repository
over HTTP, installs its requirements.txt (a wheel shipped in the repository: no index), starts a
Celery worker on Redis with the broker user made for this machine alone, and runs the jobs; the
queue goes quiet, the machine is drained, reports it, and its container is removed.

Checked on the way: every job ran exactly once; everything in the container ran as the image's
non-root user; neither the container's environment nor its filesystem holds any of the control
plane's secrets (the vault key, the database URL, an enrolment key)."""

from __future__ import annotations

import base64
import contextlib
import functools
import hashlib
import http.server
import json
import subprocess
import tarfile
import threading
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import redis
from celery import Celery
from cryptography.fernet import Fernet

from autoscaler.brokers import stamp
from autoscaler.control.steps.credentials import ENV_WORKER_TOKEN, machine_env
from autoscaler.providers.container_spec import LABEL_KEY
from autoscaler.providers.labels import marker_env
from tests.agent.agentkit import TASK_APP, free_port, git_repo
from tests.brokers.helpers import uninstall_stamp
from tests.containers.engine import podman, podman_env, podman_service
from tests.control.loopkit import Loop
from tests.control.loopprocs import WATCH_BROKER, unique
from tests.images.kit import UID, uids

TASKS = (
    TASK_APP
    + """
import e2ehelper  # from the repository's requirements.txt: the worker starts only with it


@app.task(name="imagee2e.job")
def job(seconds):
    assert e2ehelper.MARK == "installed"
    time.sleep(seconds)
"""
)

# pip reads a relative --find-links in a requirements file from the file's own folder
REQUIREMENTS = "--no-index\n--find-links wheels\ne2ehelper==1.0\n"

STARTUP = (
    'exec celery -A tasks worker -Q {queue} -n "$AUTOSCALER_WORKER_NAME" --pool prefork -c 1 '
    "--prefetch-multiplier 1 --without-mingle -l info"
)

IMAGE_ENV = {
    "PATH",
    "HOME",
    "HOSTNAME",
    "TERM",
    "container",
    "PYTHONUNBUFFERED",
    "PIP_DISABLE_PIP_VERSION_CHECK",
    "AUTOSCALER_AGENT_WORKDIR",
}
"""What the image and the engine put in a container's environment, besides the launch's."""


def tiny_wheel(folder: Path) -> None:
    """A pure-Python wheel, e2ehelper 1.0, written by hand (no build backend, no index)."""
    files = {
        "e2ehelper/__init__.py": b'MARK = "installed"\n',
        "e2ehelper-1.0.dist-info/METADATA": (
            b"Metadata-Version: 2.1\nName: e2ehelper\nVersion: 1.0\n"
        ),
        "e2ehelper-1.0.dist-info/WHEEL": (
            b"Wheel-Version: 1.0\nGenerator: tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        ),
    }
    record = []
    for name, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{name},sha256={digest},{len(data)}")
    record.append("e2ehelper-1.0.dist-info/RECORD,,")
    files["e2ehelper-1.0.dist-info/RECORD"] = ("\n".join(record) + "\n").encode()
    folder.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(folder / "e2ehelper-1.0-py3-none-any.whl", "w") as whl:
        for name, data in files.items():
            whl.writestr(name, data)


@contextlib.contextmanager
def served_over_http(repo_url: str, folder: Path) -> Iterator[str]:
    """The repository as a bare clone served by Git's "dumb" HTTP protocol on loopback (what a
    machine on the host's network clones); yields its http:// URL."""
    bare = folder / "repo.git"
    subprocess.run(["git", "clone", "-q", "--bare", repo_url, str(bare)], check=True)
    subprocess.run(["git", "-C", str(bare), "update-server-info"], check=True)
    handler = functools.partial(_Quiet, directory=str(folder))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/repo.git"
    finally:
        server.shutdown()
        server.server_close()


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


def our_containers(installation: str) -> list[dict[str, Any]]:
    out = podman("ps", "-a", "--filter", f"label={LABEL_KEY}", "--format", "json").stdout
    return [
        c
        for c in json.loads(out or "[]")
        if str((c.get("Labels") or {}).get(LABEL_KEY, "")).startswith(f"asg-{installation}-")
    ]


def filesystem_holds(container: str, secrets: list[str]) -> list[tuple[str, str]]:
    """(path, which secret) for every file of the container's filesystem holding a secret."""
    wanted = [s.encode() for s in secrets]
    found = []
    proc = subprocess.Popen(
        ["podman", "export", container], stdout=subprocess.PIPE, env=podman_env()
    )
    assert proc.stdout is not None
    with tarfile.open(fileobj=proc.stdout, mode="r|") as tar:
        for member in tar:
            if not member.isfile():
                continue
            handle = tar.extractfile(member)
            data = handle.read() if handle is not None else b""
            found += [(member.name, s.decode()) for s in wanted if s in data]
    assert proc.wait(120) == 0
    return found


def test_the_loop_runs_jobs_on_containers_of_the_worker_image_and_removes_them(
    pg_url, tmp_path, images
):
    port = free_port()
    queue = unique("image-e2e")
    vault_key = Fernet.generate_key().decode()
    source = git_repo(tmp_path / "src", {"tasks.py": TASKS, "requirements.txt": REQUIREMENTS})
    tiny_wheel(tmp_path / "src" / "wheels")
    _commit(tmp_path / "src", "the requirements' wheel")
    loop = Loop(
        tmp_path,
        pg_url,
        extra_env={
            "AUTOSCALER_API_URL": f"http://127.0.0.1:{port}",
            "AUTOSCALER_VAULT_KEY": vault_key,
        },
    )
    loop.watch_keys.update(
        {queue, f"_kombu.binding.{queue}", f"_kombu.binding_permanent.{queue}"}
        | {f"{queue}\x06\x16{p}" for p in (3, 6, 9)}
    )
    publisher = Celery("pub", broker=WATCH_BROKER, set_as_current=False)
    launches: set[str] = set()
    with podman_service() as engine_url, served_over_http(source, tmp_path / "www") as git_url:
        try:
            loop.setup(
                {
                    "poll_interval": 2,
                    "boot_timeout": 120,
                    "heartbeat_timeout": 60,
                    "providers": {
                        "rack": {
                            "kind": "container",
                            "url": engine_url,
                            "gpus": 0,  # no GPU on this machine: CPU-only containers
                            "max_machines": 2,
                            "network": "host",
                            "unsafe_host_network": True,  # the worker reaches loopback services
                        }
                    },
                    "queues": {
                        queue: {
                            "deployment": {
                                "git_url": git_url,
                                "git_ref": "main",
                                "startup_cmd": STARTUP.format(queue=queue),
                            },
                            "metrics": {"source": "celery", "url": WATCH_BROKER},
                            "autoscale": {
                                "provider": "rack",
                                "max_workers": 1,
                                "scale_up": [{"trigger": "queue_depth", "target_per_worker": 2}],
                                "scale_down": [{"trigger": "idle", "timeout": "3s"}],
                                "instance": {
                                    "gpu": "RTX 4090",
                                    "max_price_per_hour": 1.0,
                                    "image": images.worker,
                                },
                            },
                        }
                    },
                }
            )
            enrolment = loop.cli(
                "keys", "create-enrolment", "--name", "desk-1", "--queue", queue
            ).stdout.split()[-1]
            loop.serve_api(port)
            loop.worker("w1", concurrency=3)
            loop.beat()

            jobs = 3
            stamp.install(publisher)
            try:
                sent = [
                    publisher.send_task(
                        "imagee2e.job", args=[3.0], queue=queue, routing_key=queue
                    ).id
                    for _ in range(jobs)
                ]
            finally:
                uninstall_stamp()

            # 1. the loop makes a container of the worker image; its worker comes up
            def ready_row() -> dict[str, Any] | None:
                return next((r for r in loop.instances(queue) if r["state"] == "ready"), None)

            row = loop.wait(ready_row, 150, "a container's worker ready")
            launches.add(row["launch_id"])
            (container,) = [
                c
                for c in our_containers(loop.installation_id)
                if c["Labels"][LABEL_KEY].endswith(row["launch_id"])
            ]
            name = container["Names"][0]
            assert name == f"asg-{loop.installation_id}-{row['launch_id']}"
            assert row["broker_user"] == name  # its own Redis user, for its queue alone

            # 2. it runs as the image's user, with the launch's environment only, and nothing
            # of the control plane's secrets anywhere in it
            loop.wait(
                lambda: "celery" in podman("top", name, "args").stdout, 60, "its worker running"
            )
            assert uids(name) == {UID}, podman("top", name, "huser", "args").stdout
            (inspected,) = json.loads(podman("container", "inspect", name).stdout)
            assert inspected["Config"]["User"] == f"{UID}:{UID}"
            env = dict(e.split("=", 1) for e in inspected["Config"]["Env"])
            launch_env = {
                **machine_env(queue, None, f"http://127.0.0.1:{port}", "token"),
                **marker_env(loop.installation_id, row["launch_id"]),
                "AUTOSCALER_GIT_URL": git_url,
                "AUTOSCALER_GIT_REF": "main",
                "AUTOSCALER_STARTUP_CMD": STARTUP.format(queue=queue),
            }
            assert set(env) - IMAGE_ENV == set(launch_env), sorted(env)
            assert {k: env[k] for k in launch_env if k != ENV_WORKER_TOKEN} == {
                k: v for k, v in launch_env.items() if k != ENV_WORKER_TOKEN
            }
            assert env[ENV_WORKER_TOKEN]
            secrets = [vault_key, str(loop.database_url), enrolment]
            assert not [k for k, v in env.items() if any(s in v for s in secrets)]
            assert filesystem_holds(name, secrets) == []

            # 3. every job runs exactly once, reported by its agent
            def recorded() -> list[Any]:
                return loop.sql("SELECT task_id, worker FROM job_records WHERE queue = :q", q=queue)

            loop.wait(lambda: len(recorded()) >= jobs, 120, "every job run")
            records = recorded()
            assert sorted(r[0] for r in records) == sorted(sent), records
            # one machine ran them all: while jobs waited it was never drained as idle
            assert all(r[1].endswith(row["launch_id"]) for r in records), (records, loop.dump())

            # 4. the queue is quiet: the machine is drained, says so, and its container goes
            loop.wait(
                lambda: all(r["state"] == "terminated" for r in loop.instances(queue)),
                90,
                "the machine released",
            )
            ended = next(r for r in loop.instances(queue) if r["launch_id"] == row["launch_id"])
            assert ended["drained_at"] is not None, ended  # the agent reported its drain
            loop.wait(lambda: not our_containers(loop.installation_id), 30, "no container left")
            assert ended["broker_user"] is None
            r = redis.Redis.from_url(WATCH_BROKER, decode_responses=True)
            try:
                assert name not in r.execute_command("ACL", "USERS")
            finally:
                r.close()
        finally:
            loop.close()
            publisher.close()
            with contextlib.suppress(Exception):
                launches |= {r["launch_id"] for r in loop.instances(queue)}
            for c in our_containers(loop.installation_id) if loop._installation else []:
                podman("rm", "--force", "--time", "0", c["Id"], check=False)
            r = redis.Redis.from_url(WATCH_BROKER)
            for launch in launches:
                r.execute_command("ACL", "DELUSER", f"asg-{loop.installation_id}-{launch}")
            r.close()


def _commit(path: Path, message: str) -> None:
    env = {
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@example.invalid",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@example.invalid",
        "PATH": "/usr/bin:/bin",
    }
    subprocess.run(["git", "add", "."], cwd=path, env=env, check=True)
    subprocess.run(["git", "commit", "-q", "-m", message], cwd=path, env=env, check=True)
