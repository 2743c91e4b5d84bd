"""`autoscaler validate`, `apply` and `history`: a config checked, recorded, and its versions.

`apply` checks and records through `autoscaler.control.apply`, the path the admin API and the
dashboard take too, so that a config one of them refuses the others refuse as well.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

import click
from sqlalchemy.exc import SQLAlchemyError

from autoscaler.access.credentials import registered_provider_configs
from autoscaler.cli.common import StoreUnavailable, driver_cause, fail, sessions, settings, store
from autoscaler.config import ConfigError, load_config, read_config
from autoscaler.config.loader import known_providers
from autoscaler.config.models import Config
from autoscaler.config.provider_options import ProviderConfig
from autoscaler.config.summary import describe
from autoscaler.control.apply import record, runnable
from autoscaler.settings import Settings, redact_url
from autoscaler.store import config_versions
from autoscaler.store.db import session_factory, transaction


def _load_checked(
    file: str,
    registered: Mapping[str, ProviderConfig],
    current: Settings,
    *,
    store_readable: bool = True,
) -> Config:
    """The config in FILE with every check `validate` and `apply` share; exits 2 on a refusal."""
    try:
        config = load_config(file, registered, store_readable=store_readable)
        return runnable(config, file, current, os.environ)
    except ConfigError as exc:
        fail(exc.render())


def _registered(current: Settings) -> tuple[dict[str, ProviderConfig] | None, str | None]:
    """The providers registered in the store, or None and why the store could not be read."""
    try:
        engine = store(current)
        try:
            with transaction(session_factory(engine)) as session:
                return registered_provider_configs(session), None
        finally:
            engine.dispose()
    except StoreUnavailable as exc:
        return None, str(exc)
    except SQLAlchemyError as exc:
        return None, (
            f"the state store {redact_url(current.database_url)} cannot be read "
            f"({driver_cause(exc, current.database_url)})"
        )
    except ConfigError as exc:  # a registered provider no longer valid
        fail(exc.render())


@click.command()
@click.argument("file", type=click.Path(dir_okay=False))
def validate(file: str) -> None:
    """Refuse a bad config with path, cause and fix; otherwise print the dry run.

    The file's own checks come first and need no state store. The providers its queues name
    are then looked up in the file and in the store; without a store (not set up, or out of
    reach) only the file's own are known, and the dry run says so. Creates nothing.
    """
    current = settings()
    try:
        read_config(file)
    except ConfigError as exc:
        fail(exc.render())
    registered, unreadable = _registered(current)
    config = _load_checked(file, registered or {}, current, store_readable=registered is not None)
    click.echo(f"{file}: OK. Dry run (nothing is rented):")
    if unreadable is not None:
        click.echo(
            f"note: registered providers could not be read ({unreadable}); only the providers "
            "declared in this file were checked"
        )
    click.echo(
        describe(
            config,
            known_providers(config, registered or {}),
            datetime.now(UTC),
            registered=registered,
        )
    )
    from autoscaler.brokers.redis.layout import broker_layout_warnings  # reads the watched brokers

    for line in broker_layout_warnings(config):
        click.echo(line)
    from autoscaler.brokers.users import machine_access  # asks the watched Redis versions

    for line in machine_access(config):
        click.echo(line)


@click.command()
@click.argument("file", type=click.Path(dir_okay=False))
@click.option(
    "--by",
    "changed_by",
    default=lambda: os.environ.get("USER", "unknown"),
    help="Who makes this change (recorded with the new version).",
)
@click.option("--comment", help="Why (recorded with the new version).")
def apply(file: str, changed_by: str, comment: str | None) -> None:
    """Validate FILE and record the whole config as a new version if it changed.

    The control loop runs the newest version and picks it up within one tick. A refused
    config records nothing.
    """
    current = settings()
    with transaction(sessions(current)) as session:
        config = _load_checked(file, registered_provider_configs(session), current)
        row = record(session, config, changed_by, datetime.now(UTC), comment)
        if row is None:
            click.echo(f"{file}: unchanged (the loop keeps running the newest version)")
            return
        click.echo(
            f"{file}: recorded as version {row.version} ({len(config.queues)} queue(s)); "
            "the loop picks it up within one tick"
        )


@click.command()
@click.option("--queue", help="Only the versions that changed this queue.")
def history(queue: str | None) -> None:
    """Every recorded config version: when, by whom, why, and which queues it changed."""
    with transaction(sessions(settings())) as session:
        rows = config_versions.history(session)
        if not rows:
            fail("no config recorded yet; record one with 'autoscaler apply FILE'")
        previous: dict[str, Any] = {}
        shown = 0
        for row in rows:
            changed = _changed_parts(previous, row.document)
            previous = row.document
            if queue is not None and f"queues.{queue}" not in changed:
                continue
            shown += 1
            note = f" — {row.comment}" if row.comment else ""
            what = ", ".join(changed) or "no change"
            click.echo(
                f"v{row.version}\t{row.changed_at:%Y-%m-%d %H:%M:%S}Z\t{row.changed_by}\t"
                f"{what}{note}"
            )
        if queue is not None and not shown:
            fail(f"no recorded version changed queue {queue!r}")


def _changed_parts(before: Mapping[str, Any], after: Mapping[str, Any]) -> list[str]:
    """Top-level keys (and queues one by one) that differ between two documents."""
    out = []
    for key in sorted(set(before) | set(after)):
        if key == "queues":
            old, new = before.get("queues") or {}, after.get("queues") or {}
            out += [f"queues.{q}" for q in sorted(set(old) | set(new)) if old.get(q) != new.get(q)]
        elif before.get(key) != after.get(key):
            out.append(key)
    return out
