"""The hook lists each finished job (task id, publish stamp, start, end) in the status file, and
the agent sends each once: what becomes the queue's runtimes and `trace export`."""

from __future__ import annotations

import time

import pytest
from celery import Celery

from autoscaler.agent import hook
from autoscaler.agent.worker_status import JOBS_PER_BEAT, job_reports, read_jobs
from autoscaler.brokers.base import PUBLISHED_AT_HEADER


@pytest.fixture
def status_file(tmp_path, monkeypatch):
    path = tmp_path / "status.json"
    monkeypatch.setenv(hook.STATUS_ENV, str(path))
    hook.install()
    return path


def test_a_finished_task_is_listed_with_its_stamp_and_times(status_file):
    app = Celery("hooktest", set_as_current=False)
    app.conf.task_always_eager = True

    @app.task(name="hooktest.work")
    def work() -> None:
        time.sleep(0.05)

    stamp = time.time() - 5
    work.apply(task_id="job-1", headers={PUBLISHED_AT_HEADER: stamp})
    work.apply(task_id="job-2")
    jobs = {j["id"]: j for _, j in read_jobs(str(status_file))}
    assert set(jobs) >= {"job-1", "job-2"}
    one = jobs["job-1"]
    assert one["published_at"] == pytest.approx(stamp)
    assert one["finished_at"] - one["started_at"] >= 0.05
    assert jobs["job-2"]["published_at"] is None


def test_reports_leave_out_what_was_sent_and_are_bounded():
    jobs = [
        ("s.json.7", {"id": f"t{i}", "queue": "q", "started_at": float(i), "finished_at": i + 1.0})
        for i in range(JOBS_PER_BEAT + 5)
    ]
    first = job_reports(jobs, {})
    assert len(first) == JOBS_PER_BEAT and first[0][2] is not None and first[0][2].id == "t0"
    marks = {"s.json.7": max(m for _, m, _ in first)}
    rest = job_reports(jobs, marks)
    assert [r.id for *_, r in rest if r is not None] == [
        f"t{i}" for i in range(JOBS_PER_BEAT, JOBS_PER_BEAT + 5)
    ]
    marks["s.json.7"] = max(m for _, m, _ in rest)
    assert job_reports(jobs, marks) == []
    # another file's jobs are judged by its own mark
    assert len(job_reports([("s.json.8", jobs[0][1])], marks)) == 1


def test_the_ids_a_worker_holds_are_received_and_not_finished_across_its_processes(tmp_path):
    """A prefork child finishes what the main process received: the agent lists the ids any
    file says are held, less those any file lists finished."""
    from autoscaler.agent.worker_status import read_held

    base = tmp_path / "status.json"
    hook.write_status(str(base), 0, None, tasks=["a", "b", "c"], acks_late=True)
    hook.write_status(
        f"{base}.4242",
        1,
        None,
        jobs=[{"id": "a", "queue": "q", "started_at": 1.0, "finished_at": 2.0}],
        tasks=["b"],
        acks_late=True,
    )
    assert read_held(str(base)) == (["b", "c"], True)
    hook.write_status(f"{base}.4243", 0, None, acks_late=False)  # one child with early acks
    assert read_held(str(base))[1] is False


def test_the_hook_holds_a_received_task_until_it_finishes_and_says_its_acks_mode(status_file):
    """Celery's own signals drive it: received (prefetched) -> held; run -> held while it runs;
    finished -> no longer held; the app's acks mode once the worker is ready."""
    from celery.signals import task_received, worker_ready

    from autoscaler.agent.worker_status import read_held

    app = Celery("hookheld", set_as_current=False)
    app.conf.task_always_eager = True
    app.conf.task_acks_late = True
    seen: list[list[str]] = []

    @app.task(name="hookheld.work")
    def work() -> None:
        seen.append(read_held(str(status_file))[0])

    class Consumer:  # what Celery passes as the sender of worker_ready
        pass

    consumer = Consumer()
    consumer.app = app  # type: ignore[attr-defined]
    worker_ready.send(sender=consumer)
    for tid in ("held-1", "held-2"):
        task_received.send(sender=None, request=type("Req", (), {"id": tid})())
    assert read_held(str(status_file)) == (["held-1", "held-2"], True)
    work.apply(task_id="held-1")
    assert seen == [["held-1", "held-2"]]  # held while it ran
    assert read_held(str(status_file))[0] == ["held-2"]  # finished: no longer held
    work.apply(task_id="held-2")  # leave this process's hook holding nothing
    assert read_held(str(status_file))[0] == []
