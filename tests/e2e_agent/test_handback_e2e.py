"""e2e: a machine killed mid-job on Redis: its job comes back by the broker, and runs once more.

The local provider's machines run the real agent and a real Celery worker on a real Redis
queue, under real `celery worker`, `beat` and `autoscaler serve` processes on PostgreSQL. A
long job starts on the first machine; the machine is killed (its whole process group, no
goodbye: what a machine pulled by its host is to the broker). Its provider lists it dead,
reconcile destroys it, and the hand-back (`control.steps.handback`) leaves its job to kombu: on
Redis nothing the broker keeps says which machine held it, so a machine's word restores nothing.
The queue is evaluated at once; a fresh machine's worker brings the job back when its delivery
passes the visibility timeout (40 s here, for a 25 s job) and runs it.

- `acks_late` (with `task_reject_on_worker_lost`): the job runs again, exactly once more, never
  twice at the same time.
- Celery's default early acks (prefork: acknowledged as the job starts): nothing can come
  back; the `lost` event says what the machine's worker claimed and `status` counts the machine.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import redis
from celery import Celery

from tests.agent.agentkit import TASK_APP, free_port, git_repo
from tests.control.loopkit import Loop
from tests.control.loopprocs import REDIS, WATCH_BROKER, kill_local_machines, unique

CONTROL = f"{REDIS}/6"  # this test's own control-plane database

TASKS = (
    TASK_APP
    + """
import sys as _sys

if os.environ.get("HB_ACKS_LATE") == "1":
    app.conf.task_acks_late = True
    app.conf.task_reject_on_worker_lost = True
    app.conf.broker_transport_options = {
        "visibility_timeout": 40,  # longer than the job: a live worker never restores its own
        "unacked_restore_interval": 1,
        "unacked_restore_throttle": 1,
    }


@app.task(name="hb.long", bind=True)
def long(self, path, seconds):
    with open(path, "a") as fh:
        fh.write(json.dumps({"phase": "start", "worker": self.request.hostname,
                             "at": time.time()}) + "\\n")
    time.sleep(seconds)
    with open(path, "a") as fh:
        fh.write(json.dumps({"phase": "end", "worker": self.request.hostname,
                             "at": time.time()}) + "\\n")
"""
)


def startup(queue: str, late: bool) -> str:
    pool = "--pool solo" if late else "--pool prefork -c 1"  # prefork acks as a child accepts
    return (
        f"HB_ACKS_LATE={'1' if late else '0'} exec {sys.executable} -m celery -A tasks worker "
        f'-Q {queue} -n "$AUTOSCALER_WORKER_NAME" {pool} --without-mingle --without-gossip -l info'
    )


def runs(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def _unacked(task_id: str) -> bool:
    """Is the job in kombu's unacked hash of the watched broker (delivered, not acknowledged)?"""
    r = redis.Redis.from_url(WATCH_BROKER)
    try:
        return any(task_id.encode() in v for v in r.hvals("unacked"))
    finally:
        r.close()


def config(repo: str, queue: str, late: bool) -> dict[str, Any]:
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
                    "startup_cmd": startup(queue, late),
                },
                "metrics": {"source": "celery", "url": WATCH_BROKER},
                "autoscale": {
                    "provider": "desk",
                    "max_workers": 1,
                    "scale_up": [
                        {"trigger": "no_workers"},
                        {"trigger": "queue_depth", "target_per_worker": 1},
                    ],
                    "scale_down": [{"trigger": "idle", "timeout": "10m"}],
                    "instance": {"gpu": "RTX 4090", "max_price_per_hour": 1.0},
                },
            }
        },
    }


@pytest.mark.timeout(300)
@pytest.mark.parametrize("acks", ["late", "early"])
def test_a_machine_killed_mid_job_gives_its_job_back_at_once(pg_url, tmp_path, acks):
    late = acks == "late"
    port = free_port()
    queue = unique("handback")
    record = tmp_path / "runs.jsonl"
    repo = git_repo(tmp_path / "repo", {"tasks.py": TASKS, "requirements.txt": "\n"})
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

    def starts() -> list[dict[str, Any]]:
        return [e for e in runs(record) if e["phase"] == "start"]

    def machine_row(launch_id: str) -> dict[str, Any]:
        return next(r for r in loop.instances(queue) if r["launch_id"] == launch_id)

    try:
        loop.setup(config(repo, queue, late))
        loop.serve_api(port)
        loop.worker("w1", concurrency=3)
        loop.beat()
        job_id = unique("job")
        publisher.send_task(
            "hb.long", args=[str(record), 25.0], queue=queue, routing_key=queue, task_id=job_id
        )
        loop.wait(lambda: len(starts()) == 1, 120, "the job started on the first machine")
        (first,) = loop.instances(queue)
        loop.wait(
            lambda: bool(machine_row(first["launch_id"]).get("tasks")), 30, "its heartbeat names it"
        )
        if not late:  # prefork acks once the main process hears its child took the job
            loop.wait(lambda: not _unacked(job_id), 20, "the job acknowledged")
        killed_at = time.time()
        assert kill_local_machines(loop.home, loop.installation_id)
        if late:
            loop.wait(lambda: len(starts()) == 2, 150, "the job started again elsewhere")
            again = starts()[1]
            print(f"\nkilled mid-job -> running elsewhere: {again['at'] - killed_at:.1f}s")
            assert again["worker"] != starts()[0]["worker"]
            loop.wait(lambda: any(e["phase"] == "end" for e in runs(record)), 60, "it ended")
            time.sleep(3)  # nothing may run it a third time
            phases = [(e["phase"], e["worker"]) for e in runs(record)]
            assert phases == [
                ("start", starts()[0]["worker"]),
                ("start", again["worker"]),
                ("end", again["worker"]),
            ], phases
            events = [e for e in loop.events(queue) if e["kind"] == "handback"]
            assert [e["action"] for e in events] == ["left"], events
        else:
            loop.wait(
                lambda: any(
                    e["kind"] == "handback" and e["action"] == "lost" for e in loop.events(queue)
                ),
                120,
                "the job named lost",
            )
            time.sleep(3)
            assert len(starts()) == 1, "an early-acked job cannot come back"
    finally:
        loop.close()
