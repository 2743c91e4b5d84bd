"""A rented machine streaming remote-control replies cannot freeze the loop.

Found by playing a rented machine against a live control plane: it streamed replies (309 in
30 s) into the loop's reply list, kombu restarted its collection timeout on every one, both pool
processes sat in `reconcile` for 37-43 s and no queue was evaluated for about 30 s. Now every
collection has an overall deadline and a message cap (`brokers.remote_control`), and the
lifecycle steps run on a queue (and here a worker) of their own, beside the loop's.

Real processes: `celery -A autoscaler worker -Q <loop queue>`, another `-Q <lifecycle queue>`,
beat, PostgreSQL; the machine is a kombu listener and producer holding the broker user a launch
would make for the queue (its own ACL user on the watched Redis 7).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from autoscaler.brokers.users import BrokerPlan, create_user, delete_user
from tests.control.loopkit import Loop
from tests.control.loopprocs import REDIS, WATCH_BROKER, WATCH_DB
from tests.control.loopworld import Watched, mock_config
from tests.control.loopworld import mock_queue as queue_of
from tests.security.flood import ReplyFlood

FLOOD_SECONDS = 20.0
POLL = 2


@pytest.fixture
def loop(tmp_path: Path, pg_url: str) -> Iterator[Loop]:
    made = Loop(tmp_path, pg_url, extra_env={"AUTOSCALER_API_URL": "http://127.0.0.1:9"})
    try:
        yield made
    finally:
        made.close()


@pytest.fixture
def machine_user(loop: Loop) -> Iterator[tuple[str, str, Watched]]:
    """The watched queue, and a broker user made for it as a launch makes one."""
    watched = Watched(loop, "flood")
    name = f"asg-flood{uuid.uuid4().hex[:8]}-m1"
    plan = BrokerPlan(
        url=WATCH_BROKER, queue=watched.queue, db=WATCH_DB, keyprefix="", sep="\x06\x16"
    )
    create_user(plan, name, "pw-" + name)
    try:
        yield name, f"redis://{name}:pw-{name}@{REDIS.split('://', 1)[1]}/{WATCH_DB}", watched
    finally:
        delete_user(WATCH_BROKER, name)
        watched.close()


def _evaluations(loop: Loop, queue: str) -> set[object]:
    rows = loop.sql("SELECT evaluated_at FROM queue_status WHERE queue = :q", q=queue)
    return {r[0] for r in rows}


@pytest.mark.timeout(240)
def test_a_reply_flood_from_a_machine_leaves_every_tick_on_time(loop, machine_user):
    user, url, watched = machine_user
    config = mock_config(
        {watched.queue: queue_of(watched, max_workers=1, scale_up=[], scale_down=[])},
        poll_interval=POLL,
    )
    loop.setup(config)
    loop.worker("lifecycle", concurrency=2, queues="lifecycle")
    loop.worker("evaluate", concurrency=1, queues="loop")
    loop.beat()
    loop.wait(lambda: _evaluations(loop, watched.queue), 60, "a first evaluation")

    # one reply every 50 ms for 30 s per broadcast heard: kombu's collection never ended
    flood = ReplyFlood(
        url,
        queues=(watched.queue,),
        ghosts=7,
        hostname=f"{user}@evil",
        replies_per_request=600,
        every=0.05,
    )
    seen: set[object] = set()
    ghosts: set[str] = set()
    with flood:
        loop.wait(lambda: flood.heard > 0 or flood.errors, 60, "the flood to hear reconcile")
        started = time.monotonic()
        while time.monotonic() - started < FLOOD_SECONDS:
            seen |= _evaluations(loop, watched.queue)
            sql = "SELECT worker FROM worker_sightings WHERE worker LIKE 'ghost-%'"
            ghosts |= {r[0] for r in loop.sql(sql)}
            time.sleep(0.25)
        assert flood.running, flood.errors
        sent = flood.sent
    assert not flood.errors, flood.errors
    assert sent > 100  # the flood was on throughout
    # a poll every 2 s: about ten evaluations in the window; a frozen loop made none for 30 s
    assert len(seen) >= FLOOD_SECONDS / POLL / 3, (len(seen), loop.dump())
    # its replies carried reconcile's ticket: heard and recorded as sightings, yet its ghosts
    # are nobody's capacity (hand_made: auto, and machines get broker users of their own here)
    assert ghosts, loop.dump()
    samples = loop.sql("SELECT workers FROM queue_samples WHERE queue = :q", q=watched.queue)
    assert samples and {r[0] for r in samples} == {0}
