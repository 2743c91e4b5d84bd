"""`autoscaler vault …`: the key that encrypts provider credentials at rest."""

from __future__ import annotations

import click

from autoscaler.cli.common import fail, sessions, settings
from autoscaler.store import providers as provider_store
from autoscaler.store.db import transaction
from autoscaler.vault import Vault, VaultError, generate_key


@click.group()
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
    current = settings()
    try:
        keys = Vault.from_settings(current)
        with transaction(sessions(current)) as session:
            count = 0
            for row in provider_store.list_providers(session):
                if row.credentials_encrypted is None:
                    continue
                rotated = keys.rotate(
                    row.credentials_encrypted, f"the credentials of provider {row.name!r}"
                )
                provider_store.set_credentials(session, row.name, rotated)
                count += 1
    except VaultError as exc:
        fail(str(exc))
    click.echo(f"{count} credential(s) re-encrypted under the first key")
