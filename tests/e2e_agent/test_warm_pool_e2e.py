"""e2e of a warm pool on one machine: the local provider's machines run the agent, which clones a
Git repository (with a requirements.txt of a wheel it ships) and runs a real Celery worker on a
real Redis queue, under real `celery worker`, `beat` and `autoscaler serve` processes.

burst → the machine idles → drained and stopped: its processes gone, its folder (checkout,
installed requirements) kept, its broker user deleted and its token refused → a second burst
resumes the same machine, whose agent skips clone and install → the pool's place expires
(`keep_for`) and the machine is destroyed with its folder. Then a resume that fails (the host
lost the machine's disk) is a warm miss: destroyed, and a fresh machine rented at once, which
runs the jobs. Every job runs exactly once.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import redis
import requests
from celery import Celery

from tests.agent.agentkit import TASK_APP, free_port, git_repo, make_wheel
from tests.control.loopkit import Loop
from tests.control.loopprocs import REDIS, WATCH_BROKER, labelled_processes, unique

CONTROL = f"{REDIS}/7"  # this test's own control-plane database

TASKS = (
    TASK_APP
    + """
import warmdep  # installed from requirements.txt: the worker finds it after a resume too


@app.task(name="warm.job", bind=True)
def job(self, path, job_id, seconds):
    with open(path, "a") as fh:
        fh.write(json.dumps({"job": job_id, "phase": "start", "worker": self.request.hostname,
                             "at": time.time()}) + "\\n")
    time.sleep(seconds)
    with open(path, "a") as fh:
        fh.write(json.dumps({"job": job_id, "phase": "end", "worker": self.request.hostname,
                             "at": time.time()}) + "\\n")
"""
)

STARTUP = (
    f"exec {sys.executable} -m celery -A tasks worker -Q {{queue}} "
    '-n "$AUTOSCALER_WORKER_NAME" --pool solo --without-mingle --without-gossip -l info'
)


def runs(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def acl_users() -> set[str]:
    r = redis.Redis.from_url(WATCH_BROKER, decode_responses=True)
    try:
        return set(r.execute_command("ACL", "USERS"))
    finally:
        r.close()


def config(repo: str, queue: str, keep_for: str = "1h") -> dict[str, Any]:
    return {
        "poll_interval": 2,
        "boot_timeout": 90,
        "heartbeat_timeout": 60,
        "providers": {"desk": {"kind": "local"}},
        "queues": {
            queue: {
                "deployment": {
                    "git_url": repo,
                    "git_ref": "main",
                    "startup_cmd": STARTUP.format(queue=queue),
                },
                "metrics": {"source": "celery", "url": WATCH_BROKER},
                "autoscale": {
                    "provider": "desk",
                    "max_workers": 1,
                    "scale_up": [{"trigger": "queue_depth", "target_per_worker": 4}],
                    "scale_down": [{"trigger": "idle", "timeout": "3s"}],
                    "instance": {"gpu": "RTX 4090", "max_price_per_hour": 1.0},
                    "warm_pool": {"size": 1, "keep_for": keep_for, "resume_timeout": "60s"},
                },
            }
        },
    }


@pytest.mark.timeout(300)
def test_a_warm_pool_stops_idle_machines_resumes_them_and_destroys_them_when_due(pg_url, tmp_path):
    port = free_port()
    queue = unique("warm")
    record = tmp_path / "runs.jsonl"
    (tmp_path / "wheels").mkdir()
    wheel = make_wheel(tmp_path / "wheels", "warmdep", "1.0")  # no package index needed
    repo = git_repo(
        tmp_path / "repo",
        {"tasks.py": TASKS, "requirements.txt": f"warmdep @ {wheel.as_uri()}\n"},
    )
    loop = Loop(
        tmp_path,
        pg_url,
        broker_url=CONTROL,
        result_backend=CONTROL,
        extra_env={"AUTOSCALER_API_URL": f"http://127.0.0.1:{port}"},
    )
    loop.watch_keys.update(
        {queue, f"_kombu.binding.{queue}", f"_kombu.binding_permanent.{queue}"}
        | {f"{queue}\x06\x16{p}" for p in (3, 6, 9)}
    )
    publisher = Celery("pub", broker=WATCH_BROKER, set_as_current=False)
    launches: set[str] = set()

    def publish(prefix: str, n: int) -> list[str]:
        ids = [f"{prefix}-{i}" for i in range(n)]
        for j in ids:
            publisher.send_task(
                "warm.job", args=[str(record), j, 0.5], queue=queue, routing_key=queue
            )
        return ids

    def row(launch_id: str) -> dict[str, Any]:
        return next(r for r in loop.instances(queue) if r["launch_id"] == launch_id)

    def done(ids: list[str]) -> bool:
        ended = {e["job"] for e in runs(record) if e["phase"] == "end"}
        return set(ids) <= ended

    try:
        loop.setup(config(repo, queue))
        loop.serve_api(port)
        loop.worker("w1", concurrency=3)
        loop.beat()

        # 1. a burst: a fresh machine clones, installs and runs the jobs
        first = publish("a", 3)
        loop.wait(lambda: done(first), 120, "the first burst done")
        (machine,) = loop.instances(queue)
        launch_id = machine["launch_id"]
        launches.add(launch_id)
        label = f"asg-{loop.installation_id}-{launch_id}"
        folder = loop.home / "local-machines" / "desk" / label
        assert (folder / "repo" / "tasks.py").is_file() and (folder / "deploy.json").is_file()

        # 2. idle: drained, then stopped for the pool — processes gone, folder kept, no live
        # credential (its broker user deleted, its token refused)
        loop.wait(lambda: row(launch_id)["state"] == "stopped", 60, "the idle machine stopped")
        stopped = row(launch_id)
        assert label not in labelled_processes(loop.installation_id).values()
        assert (folder / "repo" / "tasks.py").is_file(), "the stop kept the machine's disk"
        assert stopped["broker_user"] is None and label not in acl_users()
        token = json.loads((loop.home / "local-machines" / "desk" / f"{label}.json").read_text())[
            "env"
        ]["AUTOSCALER_WORKER_TOKEN"]
        beat = requests.post(
            f"http://127.0.0.1:{port}/v1/worker/{launch_id}/heartbeat",
            json={"state": "idle"},
            headers={"Authorization": f"Bearer {token}"},
            timeout=10,
        )
        assert beat.status_code == 401, "a stopped machine's token opens nothing"
        deploy_before = json.loads((folder / "deploy.json").read_text())

        # 3. a second burst resumes the same machine: no new rental, clone and install skipped
        second = publish("b", 3)
        loop.wait(lambda: done(second), 90, "the second burst done")
        rows = loop.instances(queue)
        assert [r["launch_id"] for r in rows] == [launch_id], "resumed, not rented"
        resumed = row(launch_id)
        assert resumed["resumes"] == 1 and resumed["resuming_at"] is not None
        workers = {e["worker"] for e in runs(record) if e["job"] in second}
        assert workers == {e["worker"] for e in runs(record) if e["job"] in first}
        assert json.loads((folder / "deploy.json").read_text()) == deploy_before
        agent_log = (loop.home / "local-machines" / "desk" / f"{label}.log").read_text()
        reports = [
            json.loads(x.split("deploy report ", 1)[1])
            for x in agent_log.splitlines()
            if "deploy report {" in x
        ]
        assert [r["warm"] for r in reports] == [False, True], reports  # clone+install skipped
        actions = Counter(e["action"] for e in loop.events(queue) if e["kind"] == "warm_pool")
        assert actions["stop"] >= 1 and actions["resume"] == 1 and actions["hit"] == 1, actions

        # 4. stopped again; its place expires: destroyed with its folder
        loop.wait(lambda: row(launch_id)["state"] == "stopped", 60, "stopped a second time")
        loop.apply(config(repo, queue, keep_for="2s"))
        loop.wait(lambda: row(launch_id)["state"] == "terminated", 60, "destroyed by keep_for")
        assert not folder.exists()

        # 5. a warm miss: the next stopped machine loses its disk at the host (its record stays:
        # the provider still lists it stopped); the resume is refused, the machine destroyed,
        # and a fresh one rented at once runs the jobs
        loop.apply(config(repo, queue))
        third = publish("c", 2)
        loop.wait(lambda: done(third), 120, "the third burst done (a fresh machine)")
        fresh = [r for r in loop.instances(queue) if r["state"] not in ("terminated",)]
        assert len(fresh) == 1 and fresh[0]["launch_id"] != launch_id
        lost_id = fresh[0]["launch_id"]
        launches.add(lost_id)
        loop.wait(lambda: row(lost_id)["state"] == "stopped", 60, "the fresh machine stopped")
        lost_label = f"asg-{loop.installation_id}-{lost_id}"
        shutil.rmtree(loop.home / "local-machines" / "desk" / lost_label)
        fourth = publish("d", 2)
        loop.wait(lambda: done(fourth), 150, "the fourth burst done after a warm miss")
        assert row(lost_id)["state"] in ("terminating", "terminated"), row(lost_id)
        misses = [
            e
            for e in loop.events(queue)
            if e["kind"] == "warm_pool" and e["action"] == "miss" and e["launch_id"] == lost_id
        ]
        assert len(misses) == 1, loop.events(queue)
        launches |= {r["launch_id"] for r in loop.instances(queue)}
        assert len(launches) == 3, launches  # two rentals and the replacement: nothing more

        # every job ran exactly once
        got = runs(record)
        jobs = first + second + third + fourth
        starts = Counter(e["job"] for e in got if e["phase"] == "start")
        assert starts == Counter(jobs), got
        print(
            f"warm pool e2e: {len(jobs)} jobs once each; resumed {launch_id} once, "
            f"1 keep_for expiry, 1 warm miss"
        )
    finally:
        loop.close()
        publisher.close()
        with contextlib.suppress(Exception):
            launches |= {r["launch_id"] for r in loop.instances(queue)}
        r = redis.Redis.from_url(WATCH_BROKER)
        for launch in launches:
            r.execute_command("ACL", "DELUSER", f"asg-{loop.installation_id}-{launch}")
        r.close()
