"""Sharded evaluation on PostgreSQL (`evaluation.shards`): the loop's own evaluate, in this
process, with the mock provider and given readings.

- a poll tick sends one tick per shard and evaluates nothing itself; each shard evaluates
  exactly its own queues;
- a shard that counted the account's other machines, then waited for the account lock while
  another shard committed launches, counts again and launches only what the cap still allows
  (without the recount it would have launched past the cap);
- shard leases: one holder per shard, and none while an evaluation splitting the queues
  another way is live; SQLite runs one shard.

The pure side (every queue decided once, caps never passed in any commit order, the same plan
as one evaluation without caps) is `tests/policy/test_shards.py`.
"""

from __future__ import annotations

import threading
import time
import uuid
from datetime import timedelta

import pytest
import yaml
from sqlalchemy import text

from autoscaler.config import load_config_text
from autoscaler.control.runtime import Runtime, utc_now
from autoscaler.control.tick.evaluate import TickResult, evaluate
from autoscaler.lifecycle import InstanceState as S
from autoscaler.policy.shards import shard_of
from autoscaler.policy.snapshot import QueueMetrics
from autoscaler.settings import Settings
from autoscaler.store import config_versions, instances, intents, leases, migrate
from autoscaler.store.db import make_engine
from tests.control.outbox import RecordingOutbox


def _names(shards: int, per_shard: int) -> dict[int, list[str]]:
    """Queue names, `per_shard` of them in each shard."""
    out: dict[int, list[str]] = {i: [] for i in range(shards)}
    k = 0
    while any(len(v) < per_shard for v in out.values()):
        name = f"q{k}"
        if len(out[shard_of(name, shards)]) < per_shard:
            out[shard_of(name, shards)].append(name)
        k += 1
    return out


def _runtime(tmp_path, url: str, queues: list[str], shards: int, **limits: float) -> Runtime:
    migrate.upgrade(url)
    env = {"AUTOSCALER_HOME": str(tmp_path), "AUTOSCALER_DATABASE_URL": url}
    rt = Runtime(Settings.from_env(env), env=env)
    doc = {
        "evaluation": {"shards": shards},
        "providers": {"sandbox": {"kind": "mock", "boot_delay": 0}},
        "queues": {
            q: {
                "metrics": {"source": "celery", "url": "redis://127.0.0.1:6379/0"},
                "autoscale": {
                    "provider": "sandbox",
                    "max_workers": 8,
                    "scale_up": [{"trigger": "queue_depth", "target_per_worker": 1}],
                    "instance": {"gpu": "RTX 4090", "max_price_per_hour": 1.0},
                },
            }
            for q in queues
        },
    }
    if limits:
        doc["limits"] = limits
    with rt.transaction() as session:
        config = load_config_text(yaml.safe_dump(doc))
        assert config_versions.record(session, config.model_dump(mode="json"), "t", utc_now())
    return rt


def _readings(pending: dict[str, int]) -> dict[str, QueueMetrics]:
    now = utc_now()
    return {q: QueueMetrics(q, n, 30.0 if n else None, 0, now) for q, n in pending.items()}


def _pending_by_queue(rt: Runtime) -> dict[str, int]:
    with rt.transaction() as session:
        rows = instances.live_rows(session)
    out: dict[str, int] = {}
    for r in rows:
        out[r.queue] = out.get(r.queue, 0) + 1
    return out


def test_a_poll_tick_sends_a_tick_per_shard_and_each_evaluates_its_own_queues(tmp_path, pg_url):
    names = _names(3, 2)
    queues = [q for qs in names.values() for q in qs]
    rt = _runtime(tmp_path, pg_url, queues, 3)
    try:
        sent = RecordingOutbox()
        result = evaluate(rt, sent, trigger="poll")
        assert sent.sent == [("shard", 0), ("shard", 1), ("shard", 2)]
        assert result.evaluated == [] and result.launched == []

        readings = _readings(dict.fromkeys(queues, 2))
        for shard, mine in names.items():
            got = evaluate(rt, RecordingOutbox(), shard=shard, readings=readings)
            assert sorted(got.evaluated) == sorted(mine)
            assert len(got.launched) == 2 * len(mine)
        assert _pending_by_queue(rt) == dict.fromkeys(queues, 2)
        # the slots are claimed: a redelivered shard tick in the same poll evaluates nothing
        again = evaluate(rt, RecordingOutbox(), shard=0, readings=readings)
        assert again.evaluated == [] and again.skipped == "nothing due"
        # a manual evaluation of every queue goes through the shards one after another and,
        # every machine being on its way, launches nothing more (no stacking)
        manual = evaluate(rt, RecordingOutbox(), trigger="manual", readings=readings)
        assert sorted(manual.evaluated) == sorted(queues) and manual.launched == []
    finally:
        rt.close()


WAITING = text("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted")


def _waiting_for_advisory_lock(url: str) -> bool:
    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            return bool(conn.execute(WAITING).scalar())
    finally:
        engine.dispose()


@pytest.mark.parametrize("cap", ["max_machines", "max_price_per_hour"])
def test_a_shard_counts_again_what_another_committed_while_it_decided(tmp_path, pg_url, cap):
    """Shard 0 wants 5 machines under a cap of 4; while it waits for the account lock, a
    writer holding that lock commits 3 launch intents of a shard-1 queue. Shard 0 then counts
    them and launches 1: the account holds 4, not 3 + 5."""
    names = _names(2, 1)
    mine, theirs = names[0][0], names[1][0]
    rt = _runtime(tmp_path, pg_url, [mine, theirs], 2, **{cap: 4})
    result: list[TickResult] = []
    try:
        with rt.transaction() as session:
            leases.lock_account(session)  # as a shard that is committing
            version = config_versions.current_version(session)
            worker = threading.Thread(
                target=lambda: result.append(
                    evaluate(rt, RecordingOutbox(), shard=0, readings=_readings({mine: 5}))
                )
            )
            worker.start()
            deadline = time.monotonic() + 30
            while not _waiting_for_advisory_lock(pg_url):
                assert worker.is_alive() and time.monotonic() < deadline
                time.sleep(0.02)
            intents.add_intents(
                session,
                [
                    intents.Intent(uuid.uuid4().hex, theirs, "sandbox", "other shard")
                    for _ in range(3)
                ],
                utc_now(),
                version,
            )
        worker.join(30)
        assert not worker.is_alive()
        (got,) = result
        assert sorted(got.evaluated) == [mine]
        assert len(got.launched) == 1
        assert _pending_by_queue(rt) == {theirs: 3, mine: 1}
    finally:
        rt.close()


def test_a_shard_that_rents_nothing_does_not_wait_for_the_account_lock(tmp_path, pg_url):
    """Drains and idle ticks cannot pass a cap: a shard whose plan launches nothing commits
    while another shard holds the account lock."""
    names = _names(2, 1)
    mine = names[0][0]
    rt = _runtime(tmp_path, pg_url, [mine, names[1][0]], 2, max_machines=4)
    result: list[TickResult] = []
    try:
        with rt.transaction() as session:
            leases.lock_account(session)  # held to the end of this block
            worker = threading.Thread(
                target=lambda: result.append(
                    evaluate(rt, RecordingOutbox(), shard=0, readings=_readings({mine: 0}))
                )
            )
            worker.start()
            worker.join(30)
            assert not worker.is_alive(), "a shard renting nothing waited for the account lock"
        (got,) = result
        assert got.evaluated == [mine] and got.launched == []
    finally:
        rt.close()


def test_shard_leases_exclude_the_same_shard_and_any_other_split(tmp_path, pg_url):
    migrate.upgrade(pg_url)
    env = {"AUTOSCALER_HOME": str(tmp_path), "AUTOSCALER_DATABASE_URL": pg_url}
    rt = Runtime(Settings.from_env(env), env=env)
    now = utc_now()
    later = now + timedelta(seconds=31)
    try:
        with rt.transaction() as s:
            assert leases.evaluation_shards(s, 4) == 4
            assert leases.acquire_evaluation(s, 0, 2, "a", 30, now)
            assert leases.acquire_evaluation(s, 1, 2, "b", 30, now)
            assert not leases.acquire_evaluation(s, 0, 2, "c", 30, now)  # shard 0 is a's
            assert not leases.acquire_evaluation(s, 0, 1, "d", 30, now)  # unsharded overlaps
            assert not leases.acquire_evaluation(s, 2, 4, "e", 30, now)  # another split too
            assert leases.acquire_evaluation(s, 0, 2, "a", 30, now)  # a renews its own
        with rt.transaction() as s:
            leases.release(s, leases.evaluation_lease(0, 2), "a")
            assert not leases.acquire_evaluation(s, 0, 1, "d", 30, now)  # b still runs
            leases.release(s, leases.evaluation_lease(1, 2), "b")
            assert leases.acquire_evaluation(s, 0, 1, "d", 30, now)
            assert not leases.acquire_evaluation(s, 1, 2, "b", 30, now)  # now d's split blocks
            # an expired lease blocks nothing: d crashed
            assert leases.acquire_evaluation(s, 1, 2, "b", 30, later)
            # and d, waking after its lease was given up, cannot renew past b's other split
            assert not leases.acquire_evaluation(s, 0, 1, "d", 30, later, renew=True)
    finally:
        rt.close()


def test_sqlite_runs_one_shard(tmp_path, sqlite_url):
    names = _names(2, 2)
    queues = [q for qs in names.values() for q in qs]
    rt = _runtime(tmp_path, sqlite_url, queues, 2)
    try:
        sent = RecordingOutbox()
        got = evaluate(rt, sent, readings=_readings(dict.fromkeys(queues, 1)))
        # no shard ticks: the one evaluation did every queue
        assert [step for step, _ in sent.sent] == ["launch"] * 4
        assert sorted(got.evaluated) == sorted(queues) and len(got.launched) == 4
        with rt.transaction() as s:
            assert leases.evaluation_shards(s, 2) == 1
            assert {r.state for r in instances.live_rows(s)} == {S.PENDING}
    finally:
        rt.close()
