"""The `autoscaler` command: database, config validation, providers, vault."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, NoReturn

import click
from alembic.util import CommandError as AlembicCommandError
from sqlalchemy import Engine
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError, IntegrityError, SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

from autoscaler.access.credentials import (
    MAX_KEY_BYTES,
    CredentialError,
    OptionsError,
    describe_credentials,
    parse_options_json,
    read_key,
    registered_provider_configs,
    validate_provider,
)
from autoscaler.boundary import DEBUG_ENV, BoundaryGroup
from autoscaler.config import ConfigError, load_config, read_config
from autoscaler.config.isolation import check_broker_isolation
from autoscaler.config.loader import known_providers
from autoscaler.config.models import Config, ProviderConfig
from autoscaler.config.summary import describe
from autoscaler.digits import ASCII_FORM, ascii_whole
from autoscaler.settings import Settings, redact_url, url_secrets
from autoscaler.sim.cli import simulate
from autoscaler.sim.tune import tune
from autoscaler.store import config_versions, migrate
from autoscaler.store import providers as provider_store
from autoscaler.store.db import make_engine, session_factory, transaction
from autoscaler.vault import Vault, VaultError, generate_key


def _settings() -> Settings:
    """Settings from the environment. Creates nothing: only `db upgrade` creates the store
    (and, for the embedded defaults, the folder its SQLite files live in)."""
    return Settings.from_env()


class StoreUnavailable(Exception):
    """The state store cannot be used: not set up, behind the migrations, or unreachable.
    The message names the store (redacted) and what to run."""


def _driver_cause(exc: SQLAlchemyError, url: str) -> str:
    """The driver's first line (e.g. 'Connection refused'), with the URL's secrets scrubbed."""
    lines = str(getattr(exc, "orig", None) or exc).strip().splitlines()
    text = lines[0] if lines else type(exc).__name__
    for secret in url_secrets(url):
        text = text.replace(secret, "***")
    return text


def _upgrade_cause(exc: Exception, url: str) -> str:
    if isinstance(exc, SQLAlchemyError):
        return _driver_cause(exc, url)
    if isinstance(exc, AlembicCommandError):  # e.g. an unknown --revision
        return " ".join(str(exc).split())[:200]
    return type(exc).__name__  # alembic's own errors may quote the URL: the type only


def _store(settings: Settings) -> Engine:
    """The state store, once it exists at the migrations' head; StoreUnavailable otherwise.

    Creates nothing: a SQLite file must exist already (connecting would create it), and only
    reads are made (Alembic's version, never a table). Only `db upgrade` creates the store.
    """
    url = settings.database_url
    shown = redact_url(url)
    not_set_up = f"the state store {shown} is not set up: run `autoscaler db upgrade` first"
    try:
        parsed = make_url(url)
    except ArgumentError:
        raise StoreUnavailable(
            f"AUTOSCALER_DATABASE_URL ({shown}) is not a database URL; use e.g. "
            "postgresql://user:password@host/autoscaler, or unset it for the embedded SQLite file"
        ) from None
    sqlite = parsed.get_backend_name() == "sqlite"
    if sqlite and not (parsed.database and Path(parsed.database).is_file()):
        raise StoreUnavailable(not_set_up)
    try:
        engine = make_engine(url)
    except (ArgumentError, ImportError, ValueError):  # e.g. amqp://: no such database driver
        raise StoreUnavailable(
            f"AUTOSCALER_DATABASE_URL ({shown}) names no database SQLAlchemy can open; use "
            "postgresql://user:password@host/autoscaler, or unset it for the embedded SQLite file"
        ) from None
    try:
        current, head = migrate.revisions(engine)
    except SQLAlchemyError as exc:
        engine.dispose()
        raise StoreUnavailable(
            f"the state store {shown} cannot be {'read' if sqlite else 'reached'} "
            f"({_driver_cause(exc, url)}); check AUTOSCALER_DATABASE_URL"
            + ("" if sqlite else " and that the database server is running")
        ) from None
    if current != head:
        engine.dispose()
        if current is None:
            raise StoreUnavailable(not_set_up)
        raise StoreUnavailable(
            f"the state store {shown} is at revision {current}, and this version needs {head}: "
            "run `autoscaler db upgrade`"
        )
    return engine


def _sessions(settings: Settings) -> sessionmaker[Session]:
    """Sessions on the state store; exits 2 with the fix if it is not set up or reachable.
    Every command but `db upgrade` and `validate` opens the store through here."""
    try:
        return session_factory(_store(settings))
    except StoreUnavailable as exc:
        _fail(str(exc))


def _fail(message: str) -> NoReturn:
    click.echo(message, err=True)
    sys.exit(2)


@click.group(cls=BoundaryGroup)
@click.version_option(package_name="gpu-queue-autoscaler")
@click.option(
    "--debug",
    is_flag=True,
    help=f"Show the traceback of an unexpected error (also {DEBUG_ENV}=1).",
)
def main(debug: bool) -> None:
    """Rent GPU machines when job queues fill up; release them when they go quiet.

    Exit codes: 0 done, 2 refused (the message says what and how to fix it), 1 an unexpected
    error (a bug: one line; the traceback with --debug).
    """


# ------------------------------------------------------------------------------------- db


@main.group()
def db() -> None:
    """The state store (PostgreSQL, or SQLite by default)."""


@db.command("upgrade")
@click.option("--revision", default="head", show_default=True)
def db_upgrade(revision: str) -> None:
    """Apply migrations up to REVISION (idempotent)."""
    if not revision or len(revision) > 100 or not revision.isprintable() or " " in revision:
        _fail(f"--revision {revision[:40]!r} is not a revision; give 'head' (the default) or an id")
    settings = _settings()
    try:
        migrate.upgrade(settings.database_url, revision)
    except (SQLAlchemyError, AlembicCommandError, ValueError, ImportError, OSError) as exc:
        _fail(
            f"the state store {redact_url(settings.database_url)} cannot be upgraded "
            f"({_upgrade_cause(exc, settings.database_url)}); "
            "check AUTOSCALER_DATABASE_URL (and --revision) and that the database server runs"
        )
    click.echo(f"database {redact_url(settings.database_url)} is at {revision}")
    try:
        prepared = migrate.prepare_embedded_broker(
            settings.broker_url, (settings.control_queue, settings.lifecycle_queue)
        )
    except (SQLAlchemyError, ValueError, ImportError, OSError) as exc:
        _fail(
            f"the embedded broker {redact_url(settings.broker_url)} cannot be prepared "
            f"({type(exc).__name__}); check AUTOSCALER_BROKER_URL"
        )
    if prepared:
        click.echo(f"embedded broker {redact_url(settings.broker_url)} is ready")


# ------------------------------------------------------------------------------- validate


def _load_checked(
    file: str,
    registered: Mapping[str, ProviderConfig],
    settings: Settings,
    *,
    store_readable: bool = True,
) -> Config:
    """The config in FILE with every check `validate` and `apply` share; exits 2 on a refusal."""
    try:
        config = load_config(file, registered, store_readable=store_readable)
        refusals = check_broker_isolation(
            config, settings.broker_url, settings.control_keyprefix, os.environ
        )
        if refusals:
            raise ConfigError(refusals, file)
    except ConfigError as exc:
        _fail(exc.render())
    return config


@main.command()
@click.argument("file", type=click.Path(dir_okay=False))
def validate(file: str) -> None:
    """Refuse a bad config with path, cause and fix; otherwise print the dry run.

    The file's own checks come first and need no state store. The providers its queues name
    are then looked up in the file and in the store; without a store (not set up, or out of
    reach) only the file's own are known, and the dry run says so. Creates nothing.
    """
    settings = _settings()
    try:
        read_config(file)
    except ConfigError as exc:
        _fail(exc.render())
    registered: dict[str, ProviderConfig] | None = None
    unreadable = None
    try:
        engine = _store(settings)
        try:
            with transaction(session_factory(engine)) as session:
                registered = registered_provider_configs(session)
        finally:
            engine.dispose()
    except StoreUnavailable as exc:
        unreadable = str(exc)
    except SQLAlchemyError as exc:
        unreadable = (
            f"the state store {redact_url(settings.database_url)} cannot be read "
            f"({_driver_cause(exc, settings.database_url)})"
        )
    except ConfigError as exc:  # a registered provider no longer valid
        _fail(exc.render())
    config = _load_checked(file, registered or {}, settings, store_readable=registered is not None)
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
    from autoscaler.metrics.layout import broker_layout_warnings  # reads the watched brokers

    for line in broker_layout_warnings(config):
        click.echo(line)
    from autoscaler.access.broker_users import machine_access  # asks the watched Redis versions

    for line in machine_access(config):
        click.echo(line)


@main.command()
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
    settings = _settings()
    with transaction(_sessions(settings)) as session:
        config = _load_checked(file, registered_provider_configs(session), settings)
        row = config_versions.record(
            session, config.model_dump(mode="json"), changed_by, datetime.now(UTC), comment
        )
        if row is None:
            click.echo(f"{file}: unchanged (the loop keeps running the newest version)")
            return
        click.echo(
            f"{file}: recorded as version {row.version} ({len(config.queues)} queue(s)); "
            "the loop picks it up within one tick"
        )


@main.command()
@click.option("--queue", help="Only the versions that changed this queue.")
def history(queue: str | None) -> None:
    """Every recorded config version: when, by whom, why, and which queues it changed."""
    with transaction(_sessions(_settings())) as session:
        rows = config_versions.history(session)
        if not rows:
            _fail("no config recorded yet; record one with 'autoscaler apply FILE'")
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
            _fail(f"no recorded version changed queue {queue!r}")


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


# ---------------------------------------------------------------------------- the loop


@main.command()
@click.argument("queue")
@click.argument("workers", required=False)
@click.option("--for", "for_", help="How long the target holds (default 1h), e.g. 30m, 2h.")
@click.option("--auto", "auto", is_flag=True, help="Drop the manual target: triggers decide.")
@click.option("--by", default=lambda: os.environ.get("USER", "operator"), help="Who asks.")
def scale(queue: str, workers: str | None, for_: str | None, auto: bool, by: str) -> None:
    """Pin QUEUE at WORKERS machines (within max_workers) for a while; 0 releases them all.

    Busy workers are never stopped: they are drained once their task ends. The next tick acts
    on it (the same as `celery -A autoscaler call autoscaler.scale --args '["QUEUE", N]'`).
    """
    from autoscaler.control.manual import ManualError, set_target
    from autoscaler.control.runtime import Runtime

    if auto == (workers is not None):
        _fail("give WORKERS (a whole number, 0 releases every machine) or --auto, not both")
    count: int | None = None
    if workers is not None:
        count = ascii_whole(workers)
        if count is None:
            _fail(f"WORKERS must be a whole number ≥ 0 in {ASCII_FORM}, not {workers!r}")
    settings = _settings()
    _sessions(settings)  # refuses a store that was never migrated
    rt = Runtime(settings)
    try:
        click.echo(set_target(rt, queue, count, for_, by=by))
    except ManualError as exc:
        _fail(str(exc))
    finally:
        rt.close()


@main.command()
@click.argument("launch_id")
@click.option("--by", default=lambda: os.environ.get("USER", "operator"), help="Who asks.")
def drain(launch_id: str, by: str) -> None:
    """Drain one machine: it takes no new job, finishes its task, then is destroyed.

    A machine not ready yet (pending, creating, booting) is cancelled: never rented, or
    destroyed as soon as it exists. Only a machine already gone is refused."""
    from autoscaler.control.drain import run_drain
    from autoscaler.control.manual import ManualError, request_drain
    from autoscaler.control.runtime import Runtime
    from autoscaler.control.tasks import send_step

    settings = _settings()
    _sessions(settings)
    rt = Runtime(settings)
    try:
        click.echo(request_drain(rt, launch_id, by))
        click.echo(run_drain(rt, launch_id, f"{by} asked to drain it", enqueue=send_step))
    except ManualError as exc:
        _fail(str(exc))
    finally:
        rt.close()


# ------------------------------------------------------------------------------ providers


@main.group()
def providers() -> None:
    """Register the RunPod / Vast.ai / mock / local accounts queues rent from."""


def _parse_options(pairs: tuple[str, ...], options_json: str | None) -> dict[str, Any]:
    options: dict[str, Any] = {}
    if options_json:
        try:
            loaded = parse_options_json(options_json)
        except json.JSONDecodeError as exc:
            raise click.BadParameter(
                f'not JSON ({exc.msg}); pass an object like \'{{"countries": ["US"]}}\'',
                param_hint="--options-json",
            ) from None
        except OptionsError as exc:
            raise click.BadParameter(str(exc), param_hint="--options-json") from None
        if not isinstance(loaded, dict):
            raise click.BadParameter("must be a JSON object", param_hint="--options-json")
        options.update(loaded)
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep:
            raise click.BadParameter(f"{pair!r} is not KEY=VALUE", param_hint="--option")
        try:
            options[key] = parse_options_json(value)
        except json.JSONDecodeError:
            options[key] = value
        except OptionsError as exc:
            raise click.BadParameter(f"{key[:40]!r}: {exc}", param_hint="--option") from None
    return options


@providers.command("add")
@click.argument("name")
@click.option("--kind", required=True, type=click.Choice(["runpod", "vast", "mock", "local"]))
@click.option("--api-key-env", help="Read the key from this environment variable at run time.")
@click.option(
    "--api-key-stdin", is_flag=True, help="Read the key from standard input and store it encrypted."
)
@click.option(
    "--option",
    "option_pairs",
    multiple=True,
    metavar="KEY=VALUE",
    help="A provider option (JSON values allowed), e.g. countries='[\"US\"]'.",
)
@click.option("--options-json", help="All options as one JSON object.")
def providers_add(
    name: str,
    kind: str,
    api_key_env: str | None,
    api_key_stdin: bool,
    option_pairs: tuple[str, ...],
    options_json: str | None,
) -> None:
    """Register provider NAME. Keys never go on the command line (shell history)."""
    if api_key_env and api_key_stdin:
        _fail("give --api-key-env or --api-key-stdin, not both")
    options = _parse_options(option_pairs, options_json)
    if api_key_env:
        options["api_key_env"] = api_key_env
    try:
        validate_provider(name, kind, options)
    except ConfigError as exc:
        _fail(exc.render())
    settings = _settings()
    sessions = _sessions(settings)  # before the key is read: no store, nothing consumed
    encrypted = None
    if api_key_stdin:
        stdin = getattr(sys.stdin, "buffer", None)
        try:
            raw = (
                stdin.readline(MAX_KEY_BYTES + 1)
                if stdin is not None
                else sys.stdin.readline(MAX_KEY_BYTES + 1).encode("utf-8", "surrogateescape")
            )
            secret = read_key(raw)
        except OptionsError as exc:
            _fail(str(exc))
        if not secret:
            _fail(
                "no key on standard input; pipe it in: "
                f"'autoscaler providers add {name} --kind {kind} --api-key-stdin < keyfile'"
            )
        try:
            encrypted = Vault.from_settings(settings).encrypt(secret)
        except VaultError as exc:
            _fail(str(exc))
    try:
        with transaction(sessions) as session:
            provider_store.add_provider(session, name, kind, options, encrypted)
    except IntegrityError:
        _fail(
            f"a provider named {name!r} exists already; remove it first "
            f"('autoscaler providers remove {name}') or pick another name"
        )
    click.echo(
        f"provider {name} ({kind}) registered" + (", key stored encrypted" if encrypted else "")
    )


@providers.command("list")
def providers_list() -> None:
    """Registered providers; where each key lives, never the key."""
    with transaction(_sessions(_settings())) as session:
        rows = provider_store.list_providers(session)
        if not rows:
            click.echo("no provider registered; add one with 'autoscaler providers add'")
        for row in rows:
            opts = {k: v for k, v in (row.options or {}).items() if k != "api_key_env"}
            click.echo(
                f"{row.name}\t{row.kind}\tcredentials: {describe_credentials(row)}\t"
                f"options: {json.dumps(opts, sort_keys=True)}"
            )


@providers.command("remove")
@click.argument("name")
def providers_remove(name: str) -> None:
    """Forget provider NAME; refused while it has machines that may be billing."""
    with transaction(_sessions(_settings())) as session:
        row = provider_store.get_provider(session, name)
        if row is None:
            known = ", ".join(p.name for p in provider_store.list_providers(session)) or "none"
            _fail(f"no provider named {name!r} (registered: {known})")
        live = provider_store.live_instance_count(session, name)
        if live:
            _fail(
                f"provider {name!r} still has {live} machine(s) that may be billing; scale its "
                "queues to zero and wait for them to terminate, then remove it"
            )
        provider_store.remove_provider(session, row)
    click.echo(f"provider {name} removed")


# ---------------------------------------------------------------------------------- vault


@main.group()
def vault() -> None:
    """The key that encrypts provider credentials at rest."""


@vault.command("generate-key")
def vault_generate_key() -> None:
    """Print a new key (keep it secret; put it in AUTOSCALER_VAULT_KEY or a key file)."""
    click.echo(generate_key())


@vault.command("rotate")
def vault_rotate() -> None:
    """Re-encrypt every stored credential under the first configured key.

    Set AUTOSCALER_VAULT_KEY="NEW,OLD", run this, then set it to "NEW". All rows are rotated in
    one transaction: if any cannot be read, nothing changes.
    """
    settings = _settings()
    try:
        keys = Vault.from_settings(settings)
        with transaction(_sessions(settings)) as session:
            count = 0
            for row in provider_store.list_providers(session):
                if row.credentials_encrypted is None:
                    continue
                row.credentials_encrypted = keys.rotate(
                    row.credentials_encrypted, f"the credentials of provider {row.name!r}"
                )
                count += 1
    except VaultError as exc:
        _fail(str(exc))
    click.echo(f"{count} credential(s) re-encrypted under the first key")


main.add_command(simulate)
main.add_command(tune)


def _add_api_commands() -> None:
    from autoscaler.agent.cli import agent
    from autoscaler.api.cli import keys, serve
    from autoscaler.demo.cli import demo

    main.add_command(keys)
    main.add_command(serve)
    main.add_command(agent)
    main.add_command(demo)


_add_api_commands()


def _add_status_commands() -> None:
    from autoscaler.cli_status import COMMANDS
    from autoscaler.cli_trace import trace

    for command in (*COMMANDS, trace):
        main.add_command(command)


_add_status_commands()

__all__ = ["CredentialError", "main"]

if __name__ == "__main__":  # pragma: no cover
    main(prog_name=os.path.basename(sys.argv[0]))
