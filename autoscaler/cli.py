"""The `autoscaler` command: database, config validation, providers, vault."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any, NoReturn

import click
from sqlalchemy.exc import IntegrityError

from autoscaler.config import ConfigError, load_config
from autoscaler.config.isolation import check_broker_isolation
from autoscaler.config.loader import known_providers
from autoscaler.config.models import Config, ProviderConfig
from autoscaler.config.summary import describe
from autoscaler.credentials import (
    CredentialError,
    describe_credentials,
    registered_provider_configs,
    validate_provider,
)
from autoscaler.settings import CONTROL_KEYPREFIX, Settings, redact_url
from autoscaler.sim.cli import simulate
from autoscaler.store import migrate, queue_configs
from autoscaler.store import providers as provider_store
from autoscaler.store.db import make_engine, session_factory, transaction
from autoscaler.vault import Vault, VaultError, generate_key


def _settings() -> Settings:
    settings = Settings.from_env()
    if settings.database_url.startswith("sqlite"):
        settings.ensure_home()
    return settings


def _sessions(settings: Settings) -> Any:
    return session_factory(make_engine(settings.database_url))


def _fail(message: str) -> NoReturn:
    click.echo(message, err=True)
    sys.exit(2)


@click.group()
@click.version_option(package_name="gpu-queue-autoscaler")
def main() -> None:
    """Rent GPU machines when job queues fill up; release them when they go quiet."""


# ------------------------------------------------------------------------------------- db


@main.group()
def db() -> None:
    """The state store (PostgreSQL, or SQLite by default)."""


@db.command("upgrade")
@click.option("--revision", default="head", show_default=True)
def db_upgrade(revision: str) -> None:
    """Apply migrations up to REVISION (idempotent)."""
    settings = _settings()
    migrate.upgrade(settings.database_url, revision)
    click.echo(f"database {redact_url(settings.database_url)} is at {revision}")
    if migrate.prepare_embedded_broker(settings.broker_url):
        click.echo(f"embedded broker {redact_url(settings.broker_url)} is ready")


# ------------------------------------------------------------------------------- validate


def _load_checked(
    file: str, registered: Mapping[str, ProviderConfig], settings: Settings
) -> Config:
    """The config in FILE with every check `validate` and `apply` share; exits 2 on a refusal."""
    try:
        config = load_config(file, registered)
        refusals = check_broker_isolation(
            config, settings.broker_url, CONTROL_KEYPREFIX, os.environ
        )
        if refusals:
            raise ConfigError(refusals, file)
    except ConfigError as exc:
        _fail(exc.render())
    return config


@main.command()
@click.argument("file", type=click.Path(dir_okay=False))
def validate(file: str) -> None:
    """Refuse a bad config with path, cause and fix; otherwise print the dry run."""
    settings = _settings()
    try:
        with transaction(_sessions(settings)) as session:
            registered = registered_provider_configs(session)
    except ConfigError as exc:
        _fail(exc.render())
    except Exception as exc:  # the store is unreachable or not migrated
        _fail(
            f"the state store {redact_url(settings.database_url)} cannot be read "
            f"({type(exc).__name__}); run 'autoscaler db upgrade' first"
        )
        return
    config = _load_checked(file, registered, settings)
    click.echo(f"{file}: OK. Dry run (nothing is rented):")
    click.echo(describe(config, known_providers(config, registered), datetime.now(UTC)))


@main.command()
@click.argument("file", type=click.Path(dir_okay=False))
@click.option(
    "--by",
    "changed_by",
    default=lambda: os.environ.get("USER", "unknown"),
    help="Who makes this change (recorded with each new version).",
)
@click.option("--comment", help="Why (recorded with each new version).")
def apply(file: str, changed_by: str, comment: str | None) -> None:
    """Validate FILE and record each queue's effective config as a new version if it changed.

    All queues are recorded in one transaction: a refused config records nothing.
    """
    settings = _settings()
    with transaction(_sessions(settings)) as session:
        config = _load_checked(file, registered_provider_configs(session), settings)
        now = datetime.now(UTC)
        for name, queue in config.queues.items():
            row = queue_configs.record(
                session, name, queue.model_dump(mode="json"), changed_by, now, comment
            )
            state = f"version {row.version}" if row else "unchanged"
            click.echo(f"queue {name}: {state}")


@main.command()
@click.argument("queue")
def history(queue: str) -> None:
    """Every recorded version of QUEUE's config: when, by whom, why."""
    with transaction(_sessions(_settings())) as session:
        rows = queue_configs.history(session, queue)
        if not rows:
            _fail(f"no config recorded for queue {queue!r}; record one with 'autoscaler apply'")
        for row in rows:
            note = f" — {row.comment}" if row.comment else ""
            click.echo(
                f"v{row.version}\t{row.changed_at:%Y-%m-%d %H:%M:%S}Z\t{row.changed_by}{note}"
            )


# ------------------------------------------------------------------------------ providers


@main.group()
def providers() -> None:
    """Register the RunPod / Vast.ai / mock / local accounts queues rent from."""


def _parse_options(pairs: tuple[str, ...], options_json: str | None) -> dict[str, Any]:
    options: dict[str, Any] = {}
    if options_json:
        try:
            loaded = json.loads(options_json)
        except json.JSONDecodeError as exc:
            raise click.BadParameter(
                f'not JSON ({exc.msg}); pass an object like \'{{"countries": ["US"]}}\'',
                param_hint="--options-json",
            ) from None
        if not isinstance(loaded, dict):
            raise click.BadParameter("must be a JSON object", param_hint="--options-json")
        options.update(loaded)
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep:
            raise click.BadParameter(f"{pair!r} is not KEY=VALUE", param_hint="--option")
        try:
            options[key] = json.loads(value)
        except json.JSONDecodeError:
            options[key] = value
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
    encrypted = None
    if api_key_stdin:
        secret = sys.stdin.readline().strip()
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
        with transaction(_sessions(settings)) as session:
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

__all__ = ["CredentialError", "main"]

if __name__ == "__main__":  # pragma: no cover
    main(prog_name=os.path.basename(sys.argv[0]))
