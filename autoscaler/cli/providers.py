"""`autoscaler providers …`: the RunPod / Vast.ai / mock / local / container accounts queues
rent from.

Keys never go on the command line (shell history): an environment variable named at run time,
or standard input, stored encrypted by the vault.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import click
from sqlalchemy.exc import IntegrityError

from autoscaler.access.credentials import (
    MAX_KEY_BYTES,
    OptionsError,
    describe_credentials,
    parse_options_json,
    read_key,
    validate_provider,
)
from autoscaler.cli.common import fail, sessions, settings
from autoscaler.config import ConfigError
from autoscaler.config.provider_options import PROVIDER_KINDS
from autoscaler.store import providers as provider_store
from autoscaler.store.db import transaction
from autoscaler.vault import Vault, VaultError


@click.group()
def providers() -> None:
    """Register the RunPod / Vast.ai / mock / local / container accounts queues rent from."""


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
@click.option("--kind", required=True, type=click.Choice(PROVIDER_KINDS))
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
        fail("give --api-key-env or --api-key-stdin, not both")
    options = _parse_options(option_pairs, options_json)
    if api_key_env:
        options["api_key_env"] = api_key_env
    try:
        validate_provider(name, kind, options)
    except ConfigError as exc:
        fail(exc.render())
    current = settings()
    factory = sessions(current)  # before the key is read: no store, nothing consumed
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
            fail(str(exc))
        if not secret:
            fail(
                "no key on standard input; pipe it in: "
                f"'autoscaler providers add {name} --kind {kind} --api-key-stdin < keyfile'"
            )
        try:
            encrypted = Vault.from_settings(current).encrypt(secret)
        except VaultError as exc:
            fail(str(exc))
    try:
        with transaction(factory) as session:
            provider_store.add_provider(session, name, kind, options, encrypted)
    except IntegrityError:
        fail(
            f"a provider named {name!r} exists already; remove it first "
            f"('autoscaler providers remove {name}') or pick another name"
        )
    click.echo(
        f"provider {name} ({kind}) registered" + (", key stored encrypted" if encrypted else "")
    )


@providers.command("list")
def providers_list() -> None:
    """Registered providers; where each key lives, never the key."""
    with transaction(sessions(settings())) as session:
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
    with transaction(sessions(settings())) as session:
        row = provider_store.get_provider(session, name)
        if row is None:
            known = ", ".join(p.name for p in provider_store.list_providers(session)) or "none"
            fail(f"no provider named {name!r} (registered: {known})")
        live = provider_store.live_instance_count(session, name)
        if live:
            fail(
                f"provider {name!r} still has {live} machine(s) that may be billing; scale its "
                "queues to zero and wait for them to terminate, then remove it"
            )
        provider_store.remove_provider(session, name)
    click.echo(f"provider {name} removed")
