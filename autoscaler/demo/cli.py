"""`autoscaler demo`: added to the main command in autoscaler/cli.py."""

from __future__ import annotations

import json
import logging
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import click

from autoscaler.boundary import Refused


@click.command("demo")
@click.option("--short", is_flag=True, help="A smaller burst (8 short jobs, 2 machines): ~1 min.")
@click.option("--keep", is_flag=True, help="Keep the demo's folder (logs, store) afterwards.")
@click.option(
    "--folder",
    type=click.Path(file_okay=False),
    help="Where everything lives (must not exist, or be empty; default: a new temp folder).",
)
@click.option(
    "--plain/--live",
    default=None,
    help="Plain lines or the refreshing table (default: the table on a terminal).",
)
def demo(short: bool, keep: bool, folder: str | None, plain: bool | None) -> None:
    """Run the real loop on this computer against a burst of jobs, and watch it.

    Celery beat and worker, the server API, SQLite state and the embedded broker watch a demo
    queue; a burst of jobs arrives; the local provider starts worker agents that deploy the
    demo's task app from Git and run the jobs; once the queue is empty the machines go idle
    and are drained and destroyed. Ends with a summary (jobs, waits, machine-seconds, what a
    runqy-like policy would have rented). Ctrl-C at any point destroys every machine it
    started. Needs nothing but this project and `git`."""
    from autoscaler.demo.run import FULL, SHORT, Demo, DemoError
    from autoscaler.demo.view import View

    if folder is not None:
        root = Path(folder)
        if root.exists() and any(root.iterdir()):
            raise Refused(
                f"--folder {folder}: not empty; name a new or empty folder (the demo removes "
                "it at the end unless --keep)"
            )
        root.mkdir(parents=True, exist_ok=True)
    else:
        root = Path(tempfile.mkdtemp(prefix="autoscaler-demo-"))
    # the local provider's own notes (a machine killed after its grace) are not the demo's
    logging.getLogger("autoscaler.providers.local").setLevel(logging.ERROR)
    view = View(live=None if plain is None else not plain)
    run = Demo(root, SHORT if short else FULL, view)
    interrupted = False
    failed: str | None = None
    summary = None

    def on_term(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, on_term)
    # Ctrl-C stops the demo even where the shell started it with SIGINT ignored (a background
    # job of a script): its promise is to destroy what it started
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        run.prepare()
        run.start_control_plane()
        run.burst()
        run.watch()
        summary = run.summary()
        published = [{"job": p.job, "seconds": p.seconds, "at": p.at} for p in run.published]
        (root / "summary.json").write_text(
            json.dumps({**summary.as_json(), "published_jobs": published}, indent=2) + "\n"
        )
    except KeyboardInterrupt:
        interrupted = True
    except DemoError as exc:
        failed = str(exc)
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # cleanup is not interrupted
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        view.close()
        if interrupted:
            click.echo("interrupted: destroying every machine the demo started…", err=True)
        t = time.monotonic()
        destroyed = run.stop()
        if interrupted or failed:
            click.echo(
                f"stopped: {destroyed} machine(s) destroyed, every process of the demo stopped "
                f"({time.monotonic() - t:.1f} s)",
                err=True,
            )
        if keep:
            click.echo(f"kept: {root} (logs/, home/state.db, runs.jsonl)")
        else:
            shutil.rmtree(root, ignore_errors=True)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, previous)
    if interrupted:
        sys.exit(130)
    if failed is not None:
        click.echo(f"demo failed: {failed}", err=True)
        sys.exit(1)
    assert summary is not None
    click.echo("")
    click.echo("summary (from the state store and the jobs' records)")
    for line in summary.lines():
        click.echo(f"  {line}")
    if not summary.every_job_once:
        click.echo("demo failed: not every job ran exactly once", err=True)
        sys.exit(1)
