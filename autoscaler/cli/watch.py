"""How the read-only views print: once, or again every --interval seconds with --watch, as a
table or as JSON (one document per line while watching, so a script can read it as a stream)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from datetime import datetime
from typing import Any

import click
from sqlalchemy.orm import Session, sessionmaker

from autoscaler.cli import common
from autoscaler.store.db import transaction


def _emit(text: str, watching: bool) -> None:
    if watching:
        click.clear()
    click.echo(text)


def run_view(
    produce: Callable[[Session, datetime], str],
    sessions: sessionmaker[Session],
    *,
    watch: bool,
    interval: float,
    iterations: int | None,
    as_json: bool,
) -> None:
    """Print once, or (watch) every `interval` seconds until ^C (or `iterations` times)."""
    done = 0
    try:
        while True:
            with transaction(sessions) as session:
                text = produce(session, common.now())
            _emit(text, watch and not as_json)
            done += 1
            if not watch or (iterations is not None and done >= iterations):
                return
            time.sleep(interval)
    except KeyboardInterrupt:
        return


def dump(doc: Any, watch: bool) -> str:
    """JSON: indented for a person, one line per document while watching."""
    return json.dumps(doc, sort_keys=True) if watch else json.dumps(doc, indent=2, sort_keys=True)


def watch_options(f: Callable[..., Any]) -> Callable[..., Any]:
    """--json, --watch, --interval and the hidden --iterations (tests stop the watch with it)."""
    f = click.option("--json", "as_json", is_flag=True, help="JSON for scripts.")(f)
    f = click.option("--watch", is_flag=True, help="Refresh until ^C.")(f)
    f = click.option(
        "--interval",
        type=click.FloatRange(0.5, 3600),
        default=2.0,
        show_default=True,
        help="Seconds between refreshes with --watch.",
    )(f)
    f = click.option("--iterations", type=click.IntRange(1, 1_000_000), hidden=True)(f)
    return f
