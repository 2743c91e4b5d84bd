"""`autoscaler validate` looks at the watched Redis: a `metrics:` block whose separator, priority
steps or key prefix differ from the producers' is warned about, with what to set."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from celery import Celery
from click.testing import CliRunner

from autoscaler.brokers.redis.celery_redis import CeleryRedisReader
from autoscaler.brokers.redis.keys import CeleryRedisLayout
from autoscaler.brokers.redis.layout import broker_layout_warnings
from autoscaler.cli import main
from autoscaler.config import load_config_text
from tests.brokers.deploykit import clear_redis
from tests.conftest import REDIS_URL

URL = f"{REDIS_URL}/6"

CONFIG = """
providers:
  sandbox: {{kind: mock, price_per_hour: 0.1}}
queues:
  {queue}:
    metrics: {{source: celery, url: "{url}", global_keyprefix: "{prefix}"{extra}}}
    autoscale:
      provider: sandbox
      max_workers: 2
      scale_up: [{{trigger: no_workers}}]
      instance: {{gpu: "RTX 4090", max_price_per_hour: 0.5}}
"""


@pytest.fixture
def prefix() -> Iterator[str]:
    p = f"lay-{uuid.uuid4().hex[:10]}:"
    yield p
    clear_redis(URL, p)


def produce(prefix: str, queue: str) -> None:
    """Twelve jobs from a producer with its own separator and priority steps."""
    app = Celery("producer", broker=URL, set_as_current=False)
    app.conf.broker_transport_options = {
        "global_keyprefix": prefix,
        "sep": ":p:",
        "priority_steps": [0, 2, 5],
    }
    for pri, n in ((0, 3), (2, 4), (5, 5)):
        for _ in range(n):
            app.send_task("t.x", queue=queue, priority=pri)
    app.send_task("t.x", queue=f"{queue}-v2")  # another queue whose name extends this one
    app.close()


def validate(tmp_path: Path, text: str) -> str:
    path = tmp_path / "c.yaml"
    path.write_text(text)
    result = CliRunner().invoke(
        main,
        ["validate", str(path)],
        env={
            "AUTOSCALER_HOME": str(tmp_path),
            "AUTOSCALER_DATABASE_URL": None,
            "AUTOSCALER_BROKER_URL": "redis://127.0.0.1:6379/15",
        },
    )
    assert result.exit_code == 0, result.output
    return result.output


def test_validate_warns_about_lists_the_block_does_not_read_and_says_what_to_set(prefix, tmp_path):
    queue = f"jobs-{uuid.uuid4().hex[:6]}"
    produce(prefix, queue)
    wrong = CONFIG.format(queue=queue, url=URL, prefix=prefix, extra="")
    # the reader with the block as written counts 3 of the 12
    block = load_config_text(wrong).queues[queue].metrics
    reader = CeleryRedisReader(
        URL,
        layout=CeleryRedisLayout(
            global_keyprefix=block.global_keyprefix,
            sep=block.sep,
            priority_steps=block.priority_steps,
        ),
    )
    assert reader.read([queue])[queue].pending == 3
    reader.close()

    out = validate(tmp_path, wrong)
    assert f"queue {queue} on {URL}:" in out
    assert "holds 9 message(s)" in out and "count 3 of 12" in out
    assert 'metrics.sep: ":p:"' in out and "metrics.priority_steps: [0, 2, 5]" in out
    assert f"{queue}-v2" not in out  # a queue named like a priority list is not one

    right = CONFIG.format(
        queue=queue, url=URL, prefix=prefix, extra=', sep: ":p:", priority_steps: [0, 2, 5]'
    )
    assert "warning" not in validate(tmp_path, right)
    block = load_config_text(right).queues[queue].metrics
    reader = CeleryRedisReader(
        URL,
        layout=CeleryRedisLayout(
            global_keyprefix=block.global_keyprefix,
            sep=block.sep,
            priority_steps=block.priority_steps,
        ),
    )
    assert reader.read([queue])[queue].pending == 12
    reader.close()


def test_a_key_prefix_the_producers_do_not_use_is_warned_about(prefix, tmp_path):
    queue = f"jobs-{uuid.uuid4().hex[:6]}"
    produce(prefix, queue)
    config = load_config_text(
        CONFIG.format(
            queue=queue, url=URL, prefix="other:", extra=', sep: ":p:", priority_steps: [0, 2, 5]'
        )
    )
    lines = broker_layout_warnings(config)
    assert any(f'is metrics.global_keyprefix "{prefix}"?' in line for line in lines), lines


def test_an_unreachable_broker_is_a_note_without_its_password(tmp_path):
    config = load_config_text(
        CONFIG.format(queue="q", url="redis://:Zq9-secret-pw@127.0.0.1:1/0", prefix="", extra="")
    )
    lines = broker_layout_warnings(config, timeout=0.5)
    assert len(lines) == 1 and lines[0].startswith("note: the key layout on redis://")
    assert "Zq9-secret-pw" not in lines[0]
