"""The hook lists each finished job (task id, publish stamp, start, end) in the status file, and
the agent sends each once: what becomes the queue's runtimes and `trace export`."""

from __future__ import annotations

import time

import pytest
from celery import Celery

from autoscaler.agent import hook
from autoscaler.agent.run import JOBS_PER_BEAT, job_reports, read_jobs
from autoscaler.metrics.base import PUBLISHED_AT_HEADER


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
    assert len(first) == JOBS_PER_BEAT and first[0][2]["id"] == "t0"
    marks = {"s.json.7": max(m for _, m, _ in first)}
    rest = job_reports(jobs, marks)
    assert [r["id"] for *_, r in rest] == [f"t{i}" for i in range(JOBS_PER_BEAT, JOBS_PER_BEAT + 5)]
    marks["s.json.7"] = max(m for _, m, _ in rest)
    assert job_reports(jobs, marks) == []
    # another file's jobs are judged by its own mark
    assert len(job_reports([("s.json.8", jobs[0][1])], marks)) == 1
