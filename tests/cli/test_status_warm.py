"""Warm pools in `autoscaler status / instances` (PostgreSQL and SQLite, rows the test writes on a
migrated store): each queue's pool (stopped of its size, stopping, resuming, storage $/h, today's
warm hits and misses), each stopped machine's storage $/h, since when and when it will be
destroyed, and the spend rule: a stopped machine bills its storage price only, for its stopped
time (stopping and resuming ones the full price)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest
from click.testing import CliRunner
from sqlalchemy import event

from autoscaler.cli import common, main
from autoscaler.lifecycle import InstanceState as S
from autoscaler.store import machine_views, queue_views, spend
from autoscaler.store.db import make_engine, session_factory, transaction
from autoscaler.store.events import WARM_EVENT
from autoscaler.store.models import ConfigVersion, Instance, ScaleEvent

NOW = datetime(2026, 11, 30, 12, 0, 0, tzinfo=UTC)
H = timedelta(hours=1)
M = timedelta(minutes=1)
PRICE = 0.80
STORAGE = 0.02
KEEP_FOR = 86400.0

# launch id -> (queue, state, storage $/h, booting, stopping, stopped, resuming, terminated)
MACHINES = {
    "stop0001": ("gen", S.STOPPED, STORAGE, 5 * H, 2 * H + M, 2 * H, None, None),
    "stopng02": ("gen", S.STOPPING, STORAGE, 2 * H, M, None, None, None),
    "resum003": ("gen", S.RESUMING, STORAGE, 4 * H, 3 * H + M, 3 * H, M, None),
    "gone0004": ("gen", S.TERMINATED, STORAGE, 10 * H, 9 * H + M, 9 * H, None, H),
    "stop0005": ("nopool", S.STOPPED, None, 3 * H, H + M, H, None, None),
    "live0006": ("gen", S.READY, None, 30 * M, None, None, None, None),
}
# cost so far: the running time at PRICE, the stopped time at the storage price
COST = {
    "stop0001": PRICE * 3 + STORAGE * 2,  # ran 07:00-10:00, stopped since 10:00
    "stopng02": PRICE * 2,  # stopping: the full price
    "resum003": PRICE * 61 / 60 + STORAGE * 179 / 60,  # stopped 09:00-11:59, resuming since
    "gone0004": PRICE * 1 + STORAGE * 8,  # ran 02:00-03:00, stopped until destroyed at 11:00
    "stop0005": 0.50 * 2,  # ran 2 h; its storage price is unknown: 0
    "live0006": PRICE * 0.5,
}
RATE = STORAGE + PRICE + PRICE + 0.0 + PRICE  # stopped, stopping, resuming, unknown, ready
TODAY = sum(COST.values())  # every machine booted today


def _fill(url: str) -> None:
    engine = make_engine(url)
    try:
        with transaction(session_factory(engine)) as s:
            s.add(
                ConfigVersion(
                    version=1,
                    changed_by="alice",
                    changed_at=NOW - 6 * H,
                    document={
                        "queues": {
                            "gen": {
                                "metrics": {"source": "celery"},
                                "autoscale": {
                                    "max_workers": 4,
                                    "warm_pool": {"size": 2, "keep_for": KEEP_FOR},
                                },
                            },
                            "nopool": {"metrics": {"source": "celery"}, "autoscale": {}},
                        }
                    },
                )
            )
            for lid, (q, st, storage, boot, stopping, stopped, resuming, end) in MACHINES.items():
                s.add(
                    Instance(
                        launch_id=lid,
                        queue=q,
                        provider="pods",
                        state=st,
                        gpu="L40S",
                        price_per_hour=0.50 if q == "nopool" else PRICE,
                        storage_price_per_hour=storage,
                        provider_instance_id=f"p-{lid}",
                        created_at=NOW - boot,
                        pending_at=NOW - boot,
                        booting_at=NOW - boot,
                        ready_at=NOW - boot + M,
                        stopping_at=NOW - stopping if stopping else None,
                        stopped_at=NOW - stopped if stopped else None,
                        resuming_at=NOW - resuming if resuming else None,
                        terminating_at=NOW - end if end else None,
                        terminated_at=NOW - end if end else None,
                        resumes=1 if resuming else 0,
                        keep_warm=st in (S.STOPPING, S.STOPPED),
                        running_tasks=0,
                        updated_at=NOW - (end or M),
                    )
                )
            warm = [
                (5 * H, "gen", "hit"),
                (4 * H, "gen", "hit"),
                (2 * H, "gen", "miss"),
                (3 * H, "gen", "stopped"),  # not a hit or a miss
                (13 * H, "gen", "hit"),  # yesterday: not today's
                (30 * M, "nopool", "miss"),
            ]
            for ago, q, action in warm:
                s.add(
                    ScaleEvent(at=NOW - ago, queue=q, kind=WARM_EVENT, action=action, reason="test")
                )
            s.add(  # a hit of another kind is not a warm hit
                ScaleEvent(at=NOW - H, queue="gen", kind="lifecycle", action="hit", reason="x")
            )
    finally:
        engine.dispose()


@pytest.fixture
def cli(db_url, tmp_path, monkeypatch):
    monkeypatch.setattr(common, "now", lambda: NOW)
    env = {"AUTOSCALER_HOME": str(tmp_path / "home"), "AUTOSCALER_DATABASE_URL": db_url}
    runner = CliRunner()

    def run(*args: str):
        return runner.invoke(main, list(args), env=env)

    upgraded = run("db", "upgrade")
    assert upgraded.exit_code == 0, upgraded.output
    _fill(db_url)
    return run


def _row(output: str, first: str) -> list[str]:
    for line in output.splitlines():
        if line.split()[:1] == [first]:
            return line.split()
    raise AssertionError(f"no row {first!r} in:\n{output}")


def test_status_json_shows_each_queues_pool_and_each_stopped_machine(cli):
    out = cli("status", "--json")
    assert out.exit_code == 0, out.output
    doc = json.loads(out.output)
    q = {x["queue"]: x for x in doc["queues"]}
    assert q["gen"]["warm_pool"] == {
        "size": 2,
        "keep_for_seconds": KEEP_FOR,
        "stopped": 1,
        "stopping": 1,
        "resuming": 1,
        "storage_per_hour": STORAGE,
        "hits_today": 2,
        "misses_today": 1,
    }
    # a resuming machine is on its way to serving (booting); stopped ones are not capacity
    assert q["gen"]["workers"] == {"live": 1, "busy": 0, "booting": 1, "draining": 0}
    assert q["gen"]["spend_per_hour"] == pytest.approx(STORAGE + 3 * PRICE)
    assert q["nopool"]["warm_pool"] == {
        "size": 0,
        "keep_for_seconds": None,
        "stopped": 1,
        "stopping": 0,
        "resuming": 0,
        "storage_per_hour": 0.0,
        "hits_today": 0,
        "misses_today": 1,
    }
    assert q["nopool"]["spend_per_hour"] == 0.0
    machines = {m["launch_id"]: m for m in doc["instances"]}
    assert set(machines) == set(MACHINES) - {"gone0004"}
    stopped = machines["stop0001"]
    assert stopped["state"] == "stopped"
    assert stopped["storage_price_per_hour"] == STORAGE
    assert stopped["rate_per_hour"] == STORAGE and stopped["price_per_hour"] == PRICE
    assert stopped["stopped_at"] == (NOW - 2 * H).isoformat()
    assert stopped["destroy_at"] == (NOW - 2 * H + timedelta(seconds=KEEP_FOR)).isoformat()
    assert machines["stop0005"]["destroy_at"] is None  # its queue has no pool
    assert machines["stop0005"]["rate_per_hour"] == 0.0  # storage price unknown: 0
    assert machines["stopng02"]["rate_per_hour"] == PRICE
    assert machines["stopng02"]["stopped_at"] is None
    resuming = machines["resum003"]
    assert resuming["rate_per_hour"] == PRICE and resuming["resumes"] == 1
    assert resuming["stopped_at"] is None and resuming["destroy_at"] is None
    for lid, cost in COST.items():
        if lid in machines:
            assert machines[lid]["cost_so_far"] == pytest.approx(cost), lid
    assert doc["spend"]["rate_per_hour"] == pytest.approx(RATE)
    assert doc["spend"]["today"] == pytest.approx(TODAY)
    assert doc["spend"]["unknown_price"] == 0  # a stopped machine's storage counts 0 if unknown


def test_status_table_has_the_pool_columns_and_lines(cli):
    out = cli("status")
    assert out.exit_code == 0, out.output
    text = out.output
    header = next(line for line in text.splitlines() if line.startswith("QUEUE"))
    assert header.split()[:10] == [
        "QUEUE",
        "PENDING",
        "OLDEST",
        "LIVE",
        "BUSY",
        "BOOTING",
        "DRAINING",
        "STOPPED",
        "HIT/MISS",
        "DESIRED",
    ]
    assert _row(text, "gen")[3:9] == ["1", "0", "1", "0", "1/2", "2/1"]
    assert _row(text, "gen")[-1] == "$2.42/h"  # storage + stopping + resuming + ready
    assert _row(text, "nopool")[3:9] == ["0", "0", "0", "0", "1", "0/1"]
    assert (
        "warm pool: 1 stopped of 2 (1 stopping, 1 resuming), storage $0.020/h, each destroyed "
        "1d00h after its stop; today 2 hit(s), 1 miss(es)" in text
    )
    assert "warm pool: 1 stopped (no pool in the config: destroyed at reconcile)" in text
    # INSTANCE QUEUE PROVIDER GPU STATE WORK AGE $/H COST STORAGE/H STOPPED DESTROY
    stopped = _row(text, "stop0001")
    assert stopped[:5] == ["stop0001", "gen", "pods", "L40S", "stopped"]
    assert stopped[5:] == [
        "warm",
        "pool",
        "5h00m",
        "$0.800",
        "$2.44",
        "$0.020",
        "10:00:00",
        "2026-12-01",
        "10:00",
    ]
    assert _row(text, "stop0005")[-4:] == ["$1.00", "?", "11:00:00", "—"]
    assert _row(text, "resum003")[4:9] == ["resuming", "warm", "pool,", "resumed", "×1"]
    assert _row(text, "live0006")[-3:] == ["—", "—", "—"]
    assert "stopped ones at their storage price" in text
    assert "spend: $2.42/h now" in text


def test_instances_table_and_json_show_stopped_machines(cli):
    out = cli("instances", "--state", "stopped")
    assert out.exit_code == 0, out.output
    assert out.output.splitlines()[0].split()[-3:] == ["STORAGE/H", "STOPPED", "DESTROY"]
    assert {line.split()[0] for line in out.output.splitlines()[1:]} == {"stop0001", "stop0005"}
    every = json.loads(cli("instances", "--all", "--json").output)
    gone = next(m for m in every if m["launch_id"] == "gone0004")
    assert gone["cost_so_far"] == pytest.approx(COST["gone0004"])  # not 9 h at the full price
    assert gone["stopped_at"] == (NOW - 9 * H).isoformat()  # destroyed while stopped
    assert gone["destroy_at"] is None and gone["rate_per_hour"] == PRICE
    # no machine of a pool shown: the seed's columns only
    ready = cli("instances", "--state", "ready")
    assert ready.output.splitlines()[0].split()[-2:] == ["$/H", "COST"]


def test_a_stopped_machine_bills_its_storage_price_only(sessions):
    """Spend now and today: from its stop on, a stopped machine bills its storage price, not
    its price; the day's spend counts its running hours before the stop at the full price."""
    yesterday = NOW - 16 * H  # 20:00 the day before
    with transaction(sessions) as s:
        s.add(
            Instance(
                launch_id="s1",
                queue="q",
                provider="pods",
                state=S.STOPPED,
                price_per_hour=2.0,
                storage_price_per_hour=0.01,
                booting_at=yesterday,
                ready_at=yesterday,
                stopping_at=NOW - 11 * H,
                stopped_at=NOW - 10 * H,  # 02:00 today: ran 6 h, 2 of them today
                created_at=yesterday,
                running_tasks=0,
                updated_at=NOW - 10 * H,
            )
        )
    with transaction(sessions) as s:
        spent = spend.spend(s, NOW)
        (machine,) = machine_views.instances(s, NOW)
    assert spent.rate_per_hour == pytest.approx(0.01)
    assert spent.today == pytest.approx(2 * 2.0 + 10 * 0.01)
    assert machine.cost_so_far == pytest.approx(6 * 2.0 + 10 * 0.01)
    assert machine.billed_seconds == pytest.approx(16 * 3600)
    # resumed: the full price again from its resume on, its stop still at the storage price
    with transaction(sessions) as s:
        row = s.get(Instance, 1)
        assert row is not None
        row.state, row.resuming_at = S.RESUMING, NOW - H
    with transaction(sessions) as s:
        spent = spend.spend(s, NOW)
    assert spent.rate_per_hour == pytest.approx(2.0)
    assert spent.today == pytest.approx(2 * 2.0 + 9 * 0.01 + 1 * 2.0)


def test_the_views_take_a_fixed_number_of_queries(engine, sessions):
    """Queries do not grow with queues or machines: the pool's numbers come from the rows the
    views read anyway and one grouped count of the warm events."""

    def fill(n: int) -> None:
        with transaction(sessions) as s:
            s.add(
                ConfigVersion(
                    version=n,
                    changed_by="t",
                    changed_at=NOW,
                    document={
                        "queues": {
                            f"q{i}": {"autoscale": {"warm_pool": {"size": 1, "keep_for": 60}}}
                            for i in range(n)
                        }
                    },
                )
            )
            for i in range(n):
                for j, state in enumerate((S.READY, S.STOPPED, S.STOPPING)):
                    s.add(
                        Instance(
                            launch_id=f"{n}-{i}-{j}",
                            queue=f"q{i}",
                            provider="pods",
                            state=state,
                            price_per_hour=1.0,
                            storage_price_per_hour=0.1,
                            booting_at=NOW - H,
                            stopped_at=NOW - M if state == S.STOPPED else None,
                            created_at=NOW - H,
                            running_tasks=0,
                        )
                    )
                s.add(ScaleEvent(at=NOW, queue=f"q{i}", kind=WARM_EVENT, action="hit", reason="t"))

    statements: list[str] = []
    event.listen(engine, "before_cursor_execute", lambda *a: statements.append(a[2]))

    def count() -> tuple[int, list[queue_views.QueueView]]:
        statements.clear()
        with transaction(sessions) as s:
            machines = machine_views.instances(s, NOW)
            found = queue_views.queues(s, NOW, machines=machines)
            spend.spend(s, NOW)
        return len(statements), found

    fill(2)
    small, found = count()
    assert [q.warm_pool.stopped for q in found] == [1, 1]
    fill(20)
    large, found = count()
    assert len(found) == 20 and all(q.warm_pool.hits_today >= 1 for q in found)
    assert sum(q.warm_pool.stopped for q in found) == 22
    assert large == small, (small, large)
