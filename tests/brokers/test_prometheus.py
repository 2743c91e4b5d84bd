"""Prometheus instant queries against a loopback HTTP server that answers like Prometheus."""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from werkzeug.serving import make_server
from werkzeug.wrappers import Request, Response

from autoscaler.brokers.base import SourceError
from autoscaler.brokers.prometheus import PrometheusReader, PromSample, with_external
from autoscaler.brokers.registry import build_prometheus
from autoscaler.config.triggers import MetricTrigger
from autoscaler.policy.snapshot import QueueMetrics
from tests.brokers.conftest import SECRET


class FakePrometheus:
    def __init__(self) -> None:
        self.answer: Any = {"status": "success", "data": {"resultType": "vector", "result": []}}
        self.status = 200
        self.delay = 0.0
        self.seen: list[dict[str, str]] = []

    def vector(self, *values: str) -> None:
        self.status = 200
        self.answer = {
            "status": "success",
            "data": {
                "resultType": "vector",
                "result": [
                    {"metric": {"pod": str(i)}, "value": [time.time(), v]}
                    for i, v in enumerate(values)
                ],
            },
        }

    @Request.application
    def __call__(self, request: Request) -> Response:
        self.seen.append(
            dict(request.args)
            | {"path": request.path, "auth": request.headers.get("Authorization", "")}
        )
        time.sleep(self.delay)
        return Response(
            json.dumps(self.answer), status=self.status, content_type="application/json"
        )


@pytest.fixture
def prom() -> Iterator[tuple[FakePrometheus, str]]:
    fake = FakePrometheus()
    server = make_server("127.0.0.1", 0, fake, threaded=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield fake, f"http://127.0.0.1:{server.server_port}"
    server.shutdown()


def test_values_scalar_vector_sum_and_no_value(prom):
    fake, url = prom
    reader = PrometheusReader(url, timeout=2)
    fake.vector("3", "4.5")
    assert reader.query("sum by (pod) (waiting)") == 7.5
    assert fake.seen[-1]["query"] == "sum by (pod) (waiting)" and fake.seen[-1]["timeout"] == "2s"
    fake.answer = {"status": "success", "data": {"resultType": "scalar", "result": [1, "12"]}}
    assert reader.query("scalar(x)") == 12.0
    for empty in ((), ("NaN",)):
        fake.vector(*empty)
        with pytest.raises(SourceError, match="no value"):
            reader.query("absent")


def test_slow_or_failing_prometheus_gives_the_last_value_for_a_bounded_time(prom, caplog):
    caplog.set_level(logging.DEBUG)
    fake, url = prom
    host = url.split("://")[1]
    now = [datetime.now(UTC)]
    reader = PrometheusReader(
        f"http://admin:{SECRET}@{host}", timeout=0.3, max_age=60, clock=lambda: now[0]
    )
    fake.vector("9")
    first = reader.read(["q"])["q"]
    assert (first.value, first.stale) == (9.0, False)
    assert fake.seen[-1]["auth"].startswith("Basic ")
    fake.delay = 1.0  # slower than the timeout
    now[0] += timedelta(seconds=10)
    t = time.monotonic()
    slow = reader.read(["q"])["q"]
    assert time.monotonic() - t < 0.9  # the timeout bounds the tick, not the slow server
    assert (slow.value, slow.stale, slow.read_at) == (9.0, True, first.read_at)
    fake.delay, fake.status = 0.0, 503
    fake.answer = {"status": "error", "error": "query processing would load too many samples"}
    now[0] += timedelta(seconds=10)
    failing = reader.read(["q"])["q"]
    assert failing.stale and failing.value == 9.0 and "503" in (failing.error or "")
    now[0] += timedelta(seconds=60)  # past max_age: no value at all, still no exception
    gone = reader.read(["q"])["q"]
    assert (gone.value, gone.stale) == (None, True)
    for text in (
        str(slow.error),
        str(failing.error),
        str(gone.error),
        caplog.text,
        reader.source_id,
    ):
        assert SECRET not in text


def test_refused_connection_and_config_factory(prom):
    fake, url = prom
    trig = MetricTrigger(trigger="metric", query="up", url_env="PROM_URL", threshold=1, timeout=1.5)
    reader = build_prometheus(trig, env={"PROM_URL": url})
    fake.vector("1")
    assert reader.query(trig.query) == 1.0 and fake.seen[-1]["timeout"] == "1.5s"
    dead = PrometheusReader(f"http://u:{SECRET}@127.0.0.1:1", timeout=0.5)
    got = dead.read(["up"])["up"]
    assert got.stale and got.value is None and SECRET not in (got.error or "")


def test_external_values_join_the_queue_reading_and_degraded_ones_are_named():
    now = datetime.now(UTC)
    m = QueueMetrics("q", 3, None, 0, now)
    fresh = with_external(
        m,
        [
            PromSample("waiting", 12.0, now),
            PromSample("absent", None, now, stale=True, error="no value"),
        ],
    )
    assert fresh.external == (("waiting", 12.0),)
    # a missing value: the queue's own numbers stay usable, scale-down is what stops
    assert not fresh.stale and fresh.external_degraded == ("absent",)
    assert fresh.error == "no value"
    last_known = with_external(m, [PromSample("waiting", 9.0, now, stale=True, error="down")])
    assert last_known.external == (("waiting", 9.0),)
    assert last_known.external_degraded == ("waiting",) and not last_known.stale
    ok = with_external(m, [PromSample("waiting", 2.0, now)])
    assert (ok.external, ok.external_degraded, ok.stale, ok.error) == (
        (("waiting", 2.0),),
        (),
        False,
        None,
    )
