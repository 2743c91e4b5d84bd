"""`autoscaler demo --short`: the real loop (beat, worker, API, SQLite state, embedded broker)
runs a burst on the local provider's agents and ends by itself with exit 0; its summary's
numbers are those of the state store and the jobs' records. Ctrl-C mid-run destroys every
machine, stops every process and removes the folder."""

from __future__ import annotations

import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest

from autoscaler.sim.report import percentile
from tests.control.loopprocs import labelled_processes

DEMO = [sys.executable, "-m", "autoscaler.cli", "demo"]


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("AUTOSCALER_")}


def _t(value: str) -> float:
    at = datetime.fromisoformat(value)
    return (at if at.tzinfo else at.replace(tzinfo=UTC)).timestamp()


def _rows(db: Path) -> list[sqlite3.Row]:
    con = sqlite3.connect(db)
    con.row_factory = sqlite3.Row
    try:
        return con.execute("SELECT * FROM instances ORDER BY id").fetchall()
    finally:
        con.close()


def _installation(db: Path) -> str:
    con = sqlite3.connect(db)
    try:
        return str(con.execute("SELECT installation_id FROM installation").fetchone()[0])
    finally:
        con.close()


def _group_gone(pid: int) -> bool:
    try:
        os.killpg(pid, 0)
    except ProcessLookupError:
        return True
    return False


@pytest.mark.timeout(150)
def test_demo_short_runs_the_real_loop_to_exit_0_and_its_summary_matches_the_store(tmp_path):
    folder = tmp_path / "demo"
    t0 = time.monotonic()
    done = subprocess.run(
        [*DEMO, "--short", "--plain", "--keep", "--folder", str(folder)],
        env=_env(),
        capture_output=True,
        text=True,
        timeout=140,
    )
    took = time.monotonic() - t0
    out = done.stdout
    assert done.returncode == 0, f"{out}\n{done.stderr}"
    print(out)
    print(f"demo --short took {took:.0f} s")

    # the plain view: status lines, decisions with their reasons, the summary
    assert "scale_up/launch" in out and "queue_depth:" in out
    assert "scale_down/drain" in out and "idle: no task for" in out
    assert "drain/drained" in out
    assert "terminate/destroyed" in out or "terminating->terminated" in out
    assert "summary (from the state store" in out

    summary = json.loads((folder / "summary.json").read_text())
    db = folder / "home" / "state.db"
    rows = _rows(db)
    records = [json.loads(x) for x in (folder / "runs.jsonl").read_text().splitlines()]

    # jobs: every one ran exactly once, as the machines recorded it
    starts = [e for e in records if e["phase"] == "start"]
    ends = [e for e in records if e["phase"] == "end"]
    assert summary["published"] == summary["ran"] == 8
    assert sorted(e["job"] for e in ends) == sorted(e["job"] for e in starts)
    assert len({e["job"] for e in ends}) == len(ends) == 8
    assert summary["every_job_once"] is True
    assert re.search(r"jobs: 8 published, 8 run \(each exactly once\)", out)

    # machines: every row terminated; their count and machine-seconds are the store's
    assert rows and all(r["state"] == "terminated" for r in rows), [dict(r) for r in rows]
    seconds = sum(_t(r["terminated_at"]) - _t(r["created_at"]) for r in rows)
    assert summary["machines"] == len(rows)
    assert summary["machine_seconds"] == pytest.approx(seconds, abs=0.01)
    assert f"{summary['machines']} rented" in out
    assert f"{summary['machine_seconds']:.0f} machine-seconds" in out
    assert 1 <= summary["peak"] <= 2  # max_workers of the short demo
    # each job ran on one of the rented machines
    labels = {e["worker"].rsplit("@", 1)[0] for e in starts}
    launches = {r["launch_id"] for r in rows}
    assert all(any(label.endswith(x) for x in launches) for label in labels), labels

    # waits: publish (the summary's trace) to start (the record)
    assert 0 <= summary["wait_p50"] <= summary["wait_p95"] <= summary["wait_max"] < 60
    sent = {p["job"]: p["at"] for p in summary["published_jobs"]}
    waits = sorted(e["at"] - sent[e["job"]] for e in starts)
    assert summary["wait_p50"] == pytest.approx(percentile(waits, 50), abs=1e-6)
    assert summary["wait_p95"] == pytest.approx(percentile(waits, 95), abs=1e-6)
    assert summary["wait_max"] == pytest.approx(waits[-1], abs=1e-6)
    assert f"p50 {summary['wait_p50']:.1f} s, p95 {summary['wait_p95']:.1f} s" in out

    # the runqy-like policy on the same burst
    assert summary["runqy"]["machines"] >= 1 and summary["runqy"]["machine_seconds"] > 0
    assert "runqy-like policy, simulated on this burst" in out

    # nothing left running
    assert not labelled_processes(_installation(db))
    assert not list((folder / "home" / "local-machines").glob("*/*.json"))
    assert took < 120


@pytest.mark.timeout(120)
def test_demo_ctrl_c_destroys_every_machine_and_removes_its_folder(tmp_path):
    folder = tmp_path / "demo"
    log = tmp_path / "demo.log"
    with open(log, "wb") as fh:
        proc = subprocess.Popen(
            [*DEMO, "--short", "--plain", "--folder", str(folder)],
            env=_env(),
            stdout=fh,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    db = folder / "home" / "state.db"
    installation = None
    try:
        deadline = time.monotonic() + 90
        while True:
            assert proc.poll() is None, log.read_text()
            assert time.monotonic() < deadline, log.read_text()
            if db.exists() and "control plane up" in log.read_text():
                try:
                    rows = _rows(db)
                except sqlite3.Error:
                    rows = []
                if any(r["state"] in ("booting", "ready") for r in rows):
                    installation = _installation(db)
                    if labelled_processes(installation):
                        break
            time.sleep(0.2)
        os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C reaches the terminal's process group
        code = proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    text = log.read_text()
    print(text)
    assert code == 130, text
    assert "Traceback" not in text
    assert re.search(r"stopped: [1-9]\d* machine\(s\) destroyed", text), text
    assert installation is not None and not labelled_processes(installation)
    assert not folder.exists()
