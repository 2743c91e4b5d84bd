"""A finished-job report the API will not take never costs the machine its heartbeat.

A producer chose a task id with a NUL byte; on PostgreSQL every heartbeat carrying it was a 503,
the agent sent the same batch again and again, the machine was judged silent and destroyed. Now
the agent drops a refused batch on *any* answer (4xx or 5xx) and sends the heartbeat without it;
only a connection failure keeps the batch for the next beat. The API is a real HTTP server on
loopback that answers 503 to any heartbeat carrying jobs, the way PostgreSQL made ours answer.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from autoscaler.agent.run import Agent
from autoscaler.agent.server_api import AgentConfig, AgentError
from autoscaler.wire import HeartbeatAnswer


class _Api:
    """Records every heartbeat; 503 to those that carry jobs."""

    def __init__(self) -> None:
        self.beats: list[dict[str, Any]] = []
        api = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["content-length"])))
                api.beats.append(body)
                status = 503 if body.get("jobs") else 200
                answer = b'{"drain": false, "state": "ready"}' if status == 200 else b"{}"
                self.send_response(status)
                self.send_header("content-length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, format: str, *args: Any) -> None:
                return

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@pytest.fixture
def api() -> Iterator[_Api]:
    a = _Api()
    try:
        yield a
    finally:
        a.server.shutdown()
        a.server.server_close()


def _agent(url: str, workdir: Path) -> Agent:
    cfg = AgentConfig(api_url=url, token="t" * 40, launch_id="m1", queue="q1")
    cfg.workdir = workdir
    workdir.mkdir(parents=True, exist_ok=True)
    return Agent(cfg)


def test_a_batch_the_api_cannot_store_is_dropped_and_the_heartbeat_still_goes(api, tmp_path):
    agent = _agent(api.url, tmp_path / "work")
    job = {"id": "j1", "queue": "q1", "started_at": 10.0, "finished_at": 11.0}
    Path(agent.status_file).write_text(json.dumps({"running": 0, "jobs": [job]}))
    assert agent.beat("auto") == HeartbeatAnswer(drain=False, state="ready")
    assert [bool(b.get("jobs")) for b in api.beats] == [True, False]  # refused, then without
    agent.beat("auto")  # the batch is not sent again
    assert [bool(b.get("jobs")) for b in api.beats] == [True, False, False]


def test_a_job_the_api_would_refuse_is_never_sent_and_costs_neither_the_beat_nor_its_batch(
    api, tmp_path
):
    """A task id with a NUL byte fails `wire.JobReport` in the agent itself: it is dropped
    there (marked sent), the heartbeat and the other jobs go."""
    agent = _agent(api.url, tmp_path / "work")
    jobs = [
        {"id": "poison\u0000id", "queue": "q1", "started_at": 10.0, "finished_at": 11.0},
        {"id": "j2", "queue": "q1", "started_at": 10.0, "finished_at": 12.0},
    ]
    Path(agent.status_file).write_text(json.dumps({"running": 0, "jobs": jobs}))
    assert agent.beat("auto") == HeartbeatAnswer(drain=False, state="ready")
    # the fake refuses any batch: j2 went (then was dropped), the poisoned one never did
    assert [[j["id"] for j in b.get("jobs", [])] for b in api.beats] == [["j2"], []]
    agent.beat("auto")
    assert [bool(b.get("jobs")) for b in api.beats] == [True, False, False]


def test_a_connection_failure_keeps_the_batch_for_the_next_beat(tmp_path):
    agent = _agent("http://127.0.0.1:9", tmp_path / "work")  # nothing listens there
    job = {"id": "j1", "queue": "q1", "started_at": 10.0, "finished_at": 11.0}
    Path(agent.status_file).write_text(json.dumps({"running": 0, "jobs": [job]}))
    with pytest.raises(AgentError, match="cannot be reached"):
        agent.beat("auto")
    assert agent.marks == {}  # nothing marked sent: it goes with the next beat
