"""`autoscaler trace export`: the jobs the agents reported become a trace `simulate` and `tune`
read back; arrivals are the producers' stamps (start times where unstamped, and it says so);
nothing recorded is a refusal that says where jobs come from."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from click.testing import CliRunner

from autoscaler.cli import main
from autoscaler.sim.trace import load_trace
from autoscaler.store import job_records
from autoscaler.store.db import make_engine, session_factory, transaction

NOW = datetime.now(UTC).replace(microsecond=0)


def _job(
    task: str, arrived: float | None, started: float, runtime: float, queue: str = "inference"
):
    start = NOW - timedelta(hours=2) + timedelta(seconds=started)
    return {
        "queue": queue,
        "task_id": task,
        "worker": "w@h",
        "arrived_at": None if arrived is None else start - timedelta(seconds=started - arrived),
        "started_at": start,
        "finished_at": start + timedelta(seconds=runtime),
        "runtime_s": runtime,
    }


def test_export_writes_the_recorded_jobs_as_a_trace(db_url, tmp_path):
    env = {"AUTOSCALER_HOME": str(tmp_path), "AUTOSCALER_DATABASE_URL": db_url}
    runner = CliRunner()
    assert runner.invoke(main, ["db", "upgrade"], env=env).exit_code == 0
    engine = make_engine(db_url)
    try:
        with transaction(session_factory(engine)) as session:
            job_records.record(
                session,
                [
                    _job("a", 0.0, 40.0, 60.0),  # waited 40 s
                    _job("b", 30.0, 45.0, 10.0),
                    _job("c", None, 100.0, 5.0),  # unstamped: arrives when it started
                    _job("old", 0.0, -86400.0 * 3, 5.0),  # before --since
                    _job("x", 0.0, 10.0, 5.0, queue="other"),
                ],
                NOW,
            )
    finally:
        engine.dispose()
    out = tmp_path / "trace.csv"
    res = runner.invoke(
        main, ["trace", "export", "--queue", "inference", "--since", "1d", "-o", str(out)], env=env
    )
    assert res.exit_code == 0, res.output
    jobs = load_trace(out)
    assert [(j.arrival_s, j.runtime_s, j.queue) for j in jobs] == [
        (0.0, 60.0, "inference"),
        (30.0, 10.0, "inference"),
        (100.0, 5.0, "inference"),
    ]
    assert "3 job(s) of 'inference'" in res.stderr
    assert "1 without a publish stamp" in res.stderr

    # the trace replays: the simulator takes it as it is
    sim = runner.invoke(
        main,
        ["simulate", "--trace", str(out), "--config", "examples/seed.yaml", "--json"],
        env=env,
    )
    assert sim.exit_code == 0, sim.output
    assert '"jobs": 3' in sim.output

    none = runner.invoke(main, ["trace", "export", "--queue", "nope"], env=env)
    assert none.exit_code == 2
    assert "no jobs of queue 'nope'" in none.output and "hook.install()" in none.output


def test_an_export_larger_than_a_trace_may_hold_keeps_the_first_jobs_and_says_so(
    db_url, tmp_path, monkeypatch
):
    import autoscaler.cli.trace as cli_trace

    monkeypatch.setattr(cli_trace, "MAX_JOBS", 2)  # the cap, made small enough to reach
    env = {"AUTOSCALER_HOME": str(tmp_path), "AUTOSCALER_DATABASE_URL": db_url}
    runner = CliRunner()
    assert runner.invoke(main, ["db", "upgrade"], env=env).exit_code == 0
    engine = make_engine(db_url)
    try:
        with transaction(session_factory(engine)) as session:
            job_records.record(
                session, [_job(f"t{i}", float(i), float(i), 1.0) for i in range(3)], NOW
            )
    finally:
        engine.dispose()
    out = tmp_path / "trace.csv"
    res = runner.invoke(main, ["trace", "export", "--queue", "inference", "-o", str(out)], env=env)
    assert res.exit_code == 0, res.output
    assert [j.arrival_s for j in load_trace(out)] == [0.0, 1.0]
    assert "more than 2 jobs" in res.stderr and "shorter --since" in res.stderr
