"""e2e on one machine: the local provider's machines run the agent (its default command), which
registers with a real `autoscaler serve`, clones a Git repository made by the test (file://)
holding a small Celery app, and starts a real Celery worker on a real Redis queue through its
own per-launch ACL user. An operator drains a machine mid-task: the task finishes (warm
shutdown), the agent reports drained, the machine is destroyed and its ACL user deleted; the
jobs left are run by a replacement; no job is lost or run twice. A hand-made agent (enrolment
key) is counted as capacity and never drained or destroyed.

The control plane runs on its own Redis database (not the one the loop tests share), with real
`celery worker` and `beat` processes (tests/control/loopkit.Loop), each in its own process
group, all stopped in teardown.
"""

from __future__ import annotations

import contextlib
import json
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import redis
from celery import Celery

from autoscaler.brokers import stamp
from autoscaler.sim.trace import load_trace
from tests.agent.agentkit import TASK_APP, AgentProc, free_port, git_repo
from tests.brokers.helpers import uninstall_stamp
from tests.control.loopchecks import local_machines
from tests.control.loopkit import Loop
from tests.control.loopprocs import REDIS, WATCH_BROKER, unique

CONTROL = f"{REDIS}/8"  # this test's own control-plane database

TASKS = (
    TASK_APP
    + """

def record(path, entry):
    with open(path, "a") as fh:
        fh.write(json.dumps(entry) + "\\n")


@app.task(name="e2eagent.job", bind=True)
def job(self, path, job_id, seconds, gate=None):
    record(path, {"job": job_id, "phase": "start", "worker": self.request.hostname,
                  "at": time.time()})
    deadline = time.time() + 120
    while gate and not os.path.exists(gate) and time.time() < deadline:
        time.sleep(0.05)  # held until the test opens the gate: mid-task for as long as it needs
    time.sleep(seconds)
    record(path, {"job": job_id, "phase": "end", "worker": self.request.hostname,
                  "at": time.time()})
"""
)

STARTUP = (
    f"exec {sys.executable} -m celery -A tasks worker -Q {{queue}} "
    '-n "$AUTOSCALER_WORKER_NAME" --pool prefork -c 1 --prefetch-multiplier 1 --without-mingle '
    "-l info"
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


@pytest.mark.timeout(150)
def test_e2e_agent_deploys_from_git_runs_jobs_once_drains_mid_task_and_leaves_nothing(
    pg_url, tmp_path
):
    port = free_port()
    queue = unique("e2e-agent")
    record = tmp_path / "runs.jsonl"
    repo = git_repo(tmp_path / "repo", {"tasks.py": TASKS})
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
    hand: AgentProc | None = None
    publisher = Celery("pub", broker=WATCH_BROKER, set_as_current=False)
    launches: set[str] = set()
    try:
        config = {
            "poll_interval": 2,
            "boot_timeout": 60,
            "heartbeat_timeout": 60,
            "providers": {"desk": {"kind": "local"}},  # its default command: the agent
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
                        "max_workers": 2,
                        "scale_up": [{"trigger": "queue_depth", "target_per_worker": 2}],
                        "scale_down": [{"trigger": "idle", "timeout": "3s"}],
                        "instance": {"gpu": "RTX 4090", "max_price_per_hour": 1.0},
                    },
                }
            },
        }
        loop.setup(config)
        enrolment = loop.cli(
            "keys", "create-enrolment", "--name", "desk-7", "--queue", queue
        ).stdout.split()[-1]
        loop.serve_api(port)
        loop.worker("w1", concurrency=3)
        loop.beat()

        jobs = [f"job-{i}" for i in range(4)]
        gate = tmp_path / "gate"  # every job runs until the test opens it
        stamp.install(publisher)  # the producer stamps its publish time: the jobs' arrivals
        try:
            for j in jobs:
                publisher.send_task(
                    "e2eagent.job",
                    args=[str(record), j, 4.0, str(gate)],
                    queue=queue,
                    routing_key=queue,
                )
        finally:
            uninstall_stamp()

        # 1. a machine boots the agent, which clones the repo and runs a job with its own user
        first = loop.wait(
            lambda: next(
                (e for e in runs(record) if e["worker"].startswith(f"asg-{loop.installation_id}")),
                None,
            ),
            60,
            "a job started on a rented machine",
        )
        rows = loop.instances(queue)
        launches |= {r["launch_id"] for r in rows}
        label = first["worker"].rsplit("@", 1)[0]
        busy = next(r for r in rows if label.endswith(r["launch_id"]))
        assert busy["broker_user"] == f"asg-{loop.installation_id}-{busy['launch_id']}"
        assert busy["broker_user"] in acl_users()
        assert busy["agent_registered_at"] is not None
        # ready at its agent's first heartbeat, sent before its worker started: a machine
        # running a job is never shown booting
        assert busy["state"] == "ready" and busy["ready_at"] is not None, busy

        # 2. the operator drains it mid-task (its job is held by the gate): the task
        # finishes once the gate opens, then the machine goes
        loop.cli("drain", busy["launch_id"], "--by", "e2e")
        loop.wait(
            lambda: _row(loop, queue, busy["launch_id"])["state"] == "draining",
            30,
            "the machine draining",
        )
        gate.touch()
        loop.wait(
            lambda: _row(loop, queue, busy["launch_id"])["state"] == "terminated",
            60,
            "the drained machine destroyed",
        )
        ended = _row(loop, queue, busy["launch_id"])
        mine = [e for e in runs(record) if e["worker"].rsplit("@", 1)[0] == label]
        end = next(e for e in mine if e["phase"] == "end" and e["job"] == first["job"])
        asked = next(
            e
            for e in loop.events(queue)
            if e["kind"] == "manual"
            and e["action"] == "drain"
            and e["launch_id"] == busy["launch_id"]
        )
        assert asked["at"].timestamp() < end["at"], "the drain came while its task ran"
        assert all(e["at"] <= ended["terminating_at"].timestamp() + 0.5 for e in mine)
        assert ended["broker_user"] is None and busy["broker_user"] not in acl_users()

        # 3. a hand-made machine joins: counted, never drained or destroyed
        hand = AgentProc(
            {
                "AUTOSCALER_API_URL": f"http://127.0.0.1:{port}",
                "AUTOSCALER_ENROLMENT_KEY": enrolment,
                "AUTOSCALER_BROKER_URL": WATCH_BROKER,  # its owner's broker URL, not ours
                "AUTOSCALER_HEARTBEAT_INTERVAL": "1",
                "AUTOSCALER_AGENT_WORKDIR": str(tmp_path / "hand"),
            },
            tmp_path / "hand.log",
            "--queue",
            queue,
            "--name",
            "desk-7",
        )

        loop.wait(
            lambda: loop.sql("SELECT worker FROM worker_sightings WHERE worker = 'agent@desk-7'"),
            30,
            "the hand-made machine counted through its heartbeats",
        )
        loop.wait(lambda: "worker started" in hand.text(), 30, "the hand-made worker running")

        # 4. every job runs exactly once; every rented machine is released
        loop.wait(
            lambda: sum(1 for e in runs(record) if e["phase"] == "end") >= len(jobs),
            90,
            "every job done",
        )
        loop.wait(
            lambda: all(r["state"] == "terminated" for r in loop.instances(queue)),
            60,
            "every rented machine released",
        )
        launches |= {r["launch_id"] for r in loop.instances(queue)}
        got = runs(record)
        starts = Counter(e["job"] for e in got if e["phase"] == "start")
        ends = Counter(e["job"] for e in got if e["phase"] == "end")
        assert starts == Counter(jobs) == ends, (got, loop.dump())

        # 5. every job finished was reported once by its agent, with the producer's stamp as
        # its arrival; `trace export` makes a trace of them that the simulator reads back
        def recorded() -> list[Any]:
            return loop.sql(
                "SELECT task_id, worker, arrived_at, started_at, runtime_s FROM job_records "
                "WHERE queue = :q",
                q=queue,
            )

        loop.wait(lambda: len(recorded()) >= len(jobs), 30, "every job reported")
        records = recorded()
        assert len(records) == len(jobs) == len({r[0] for r in records}), records
        assert all(r[4] >= 4.0 and r[2] is not None and r[2] <= r[3] for r in records), records
        assert all(r[1] == "agent@desk-7" or any(x in r[1] for x in launches) for r in records)
        exported = tmp_path / "trace.csv"
        loop.cli("trace", "export", "--queue", queue, "--since", "1h", "-o", str(exported))
        replay = load_trace(exported)
        assert len(replay) == len(jobs) and all(j.runtime_s >= 4.0 for j in replay)
        assert replay[0].arrival_s == 0.0 and all(j.queue == queue for j in replay)
        assert hand.popen.poll() is None, hand.text()  # never told to stop
        events = loop.events(queue)
        assert not any(
            e["launch_id"] is None and "desk-7" in e["reason"]
            for e in events
            if e["kind"] in ("drain", "terminate")
        )
        assert not any("desk-7" in (r["worker_name"] or "") for r in loop.instances())
        assert not {f"asg-{loop.installation_id}-{x}" for x in launches} & acl_users()
        loop.wait(lambda: not local_machines(loop, "desk"), 15, "no local machine left")
        print(
            f"agent e2e: {len(launches)} machine(s), {len(jobs)} jobs once each, "
            f"drained mid-task {first['job']}"
        )
    finally:
        if hand is not None:
            hand.stop()
        loop.close()
        publisher.close()
        with contextlib.suppress(Exception):
            launches |= {r["launch_id"] for r in loop.instances(queue)}
        r = redis.Redis.from_url(WATCH_BROKER)
        for launch in launches:
            r.execute_command("ACL", "DELUSER", f"asg-{loop.installation_id}-{launch}")
        r.close()


def _row(loop: Loop, queue: str, launch_id: str) -> dict[str, Any]:
    return next(r for r in loop.instances(queue) if r["launch_id"] == launch_id)
