"""Sharded evaluation with real processes: `celery beat`, two loop workers of one process each
(so the two shards' ticks really run at once), a lifecycle worker, PostgreSQL and the mock
provider.

Four queues, two in each shard, each wanting 2 machines under an account cap of 3: the poll
tick becomes one tick per shard, every queue is evaluated by its own shard, the machines never
number more than the cap at any instant (from the rows' own timestamps), and the cap is filled.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from autoscaler.lifecycle import LIVE_STATES
from autoscaler.policy.shards import shard_of
from tests.control.loopchecks import check_invariants, mock_machines
from tests.control.loopkit import Loop
from tests.control.loopworld import Watched, mock_config, mock_queue

CAP = 3


@pytest.fixture
def make_loop(tmp_path: Path) -> Iterator[Callable[..., Loop]]:
    made: list[Loop] = []

    def make(*args: Any, **kwargs: Any) -> Loop:
        made.append(Loop(tmp_path, *args, **kwargs))
        return made[-1]

    try:
        yield make
    finally:
        for loop in made:
            loop.close()


def _queues(loop: Loop) -> dict[int, list[Watched]]:
    """Two watched queues in each of the two shards (the names are random: draw until so)."""
    out: dict[int, list[Watched]] = {0: [], 1: []}
    while any(len(v) < 2 for v in out.values()):
        w = Watched(loop, "e2e-shard")
        if len(out[shard_of(w.queue, 2)]) < 2:
            out[shard_of(w.queue, 2)].append(w)
    return out


def _most_at_once(rows: list[dict[str, Any]]) -> int:
    """The most rows that may bill at one instant, from created_at and the ending stamps."""
    ends = ("terminated_at", "failed_at", "lost_at")
    spans: list[tuple[datetime, datetime | None]] = [
        (r["created_at"], min((r[k] for k in ends if r[k] is not None), default=None)) for r in rows
    ]
    return max(
        (sum(1 for s, e in spans if s <= start and (e is None or e > start)) for start, _ in spans),
        default=0,
    )


@pytest.mark.timeout(240)
def test_e2e_two_shards_in_two_workers_share_one_account_cap(pg_url, make_loop):
    loop = make_loop(pg_url)
    shards = _queues(loop)
    watched = [w for ws in shards.values() for w in ws]
    queues = {
        w.queue: mock_queue(
            w,
            max_workers=2,
            scale_up=[{"trigger": "queue_depth", "target_per_worker": 1}],
            scale_down=[],
        )
        for w in watched
    }
    loop.setup(mock_config(queues, evaluation={"shards": 2}, limits={"max_machines": CAP}))
    # two loop workers of one process each (the shards' ticks run at once, in two processes)
    # and one for the lifecycle steps and reconcile (whose probe would hold a loop worker)
    w1 = loop.worker("w1", concurrency=1, queues="loop")
    w2 = loop.worker("w2", concurrency=1, queues="loop")
    loop.worker("steps", concurrency=2, queues="lifecycle")
    loop.beat()
    for w in watched:
        w.publish(2, seconds=60.0)

    def live() -> list[dict[str, Any]]:
        return [r for r in loop.instances() if r["state"] in LIVE_STATES]

    loop.wait(lambda: len(live()) >= CAP, 60, f"{CAP} machines under the cap")

    def logs() -> str:
        return w1.text() + w2.text()

    # the poll tick became one tick per shard, and each shard's ran, on either worker
    loop.wait(lambda: all(f"'shard': '{i}/2'" in logs() for i in (0, 1)), 30, "each shard's tick")
    assert "sent 2 shard ticks" in logs()
    # more polls: the cap holds while every queue still wants more
    before = logs().count("'shard': '0/2'")
    loop.wait(lambda: logs().count("'shard': '0/2'") >= before + 4, 60, "4 more polls")
    rows = loop.instances()
    seen = _most_at_once(rows)
    assert seen == CAP, f"{seen} machines at once under a cap of {CAP}\n{loop.dump()}"
    assert len(live()) == CAP
    waits = [
        e
        for e in loop.events()
        if e["kind"] == "wait" and e["action"] == "spend_cap" and e["queue"] in queues
    ]
    assert waits, "the queues left without machines say why (the spend cap)"
    check_invariants(loop, dict.fromkeys(queues, 2), mock_machines(loop))
