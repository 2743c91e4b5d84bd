"""Registered providers as typed configs, and their API keys resolved from env or the vault."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from pydantic import ValidationError
from sqlalchemy.orm import Session

from autoscaler.config.errors import ConfigError, refusals_from_validation
from autoscaler.config.models import Config, ProviderConfig
from autoscaler.store.models import Provider
from autoscaler.store.providers import list_providers
from autoscaler.vault import Vault

NEEDS_KEY = ("runpod", "vast")


class CredentialError(Exception):
    """A provider's key cannot be had; the message names the provider and the fix."""


def validate_provider(name: str, kind: str, options: Mapping[str, Any]) -> ProviderConfig:
    """The same validation a `providers:` block in the YAML gets, with the same refusals."""
    try:
        config = Config.model_validate({"providers": {name: {**options, "kind": kind}}})
    except ValidationError as exc:
        raise ConfigError(refusals_from_validation(exc), f"provider {name!r}") from None
    return config.providers[name]


def registered_provider_configs(session: Session) -> dict[str, ProviderConfig]:
    return {
        row.name: validate_provider(row.name, row.kind, row.options)
        for row in list_providers(session)
    }


def resolve_api_key(
    name: str,
    config: ProviderConfig,
    encrypted: bytes | None,
    vault: Callable[[], Vault],
    env: Mapping[str, str],
) -> str | None:
    """The provider's key: decrypted from the store, else read from the named env variable."""
    if encrypted is not None:
        return vault().decrypt(encrypted, f"the credentials of provider {name!r}")
    if config.api_key_env:
        value = env.get(config.api_key_env)
        if not value:
            raise CredentialError(
                f"provider {name!r} reads its API key from ${config.api_key_env}, which is not "
                f"set; export it, or store the key with 'autoscaler providers add {name} "
                f"--kind {config.kind} --api-key-stdin'"
            )
        return value
    if config.kind in NEEDS_KEY:
        raise CredentialError(
            f"provider {name!r} ({config.kind}) has no API key; store one with "
            f"'autoscaler providers add {name} --kind {config.kind} --api-key-stdin' or set "
            "api_key_env"
        )
    return None


def describe_credentials(row: Provider) -> str:
    """What `providers list` shows: where the key lives, never the key."""
    if row.credentials_encrypted is not None:
        return "stored encrypted"
    env = (row.options or {}).get("api_key_env")
    return f"from ${env}" if env else "none"
