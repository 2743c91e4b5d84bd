"""Provider kinds' factories, and a `Provider` built from its config block, its key, this
installation's id and the store.

A provider kind is its options model in `config.provider_options` (registered in
`ProviderConfig`, with its key need, dry-run terms and known price) and its module here with a
`build` factory, registered in FACTORIES: `tests/providers/test_kinds.py` fails when either
part is missing.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from autoscaler.config.provider_options import ProviderConfig
from autoscaler.providers import container, local, mock, runpod, vast
from autoscaler.providers.base import AuthError, Provider, ProviderBuild
from autoscaler.providers.http import RetryPolicy

Factory = Callable[[str, Any, ProviderBuild], Provider]

FACTORIES: Mapping[str, Factory] = {
    "runpod": runpod.build,
    "vast": vast.build,
    "mock": mock.build,
    "local": local.build,
    "container": container.build,
}
"""Each provider kind's factory, by the `kind` of its options model."""


def build_provider(
    name: str,
    config: ProviderConfig,
    *,
    credential: str | None,
    installation_id: str,
    sessions: Any,
    state_dir: Path | None = None,
    timeout: tuple[float, float] = (5.0, 30.0),
    retry: RetryPolicy | None = None,
) -> Provider:
    """The provider for config block `name`.

    `credential` is the decrypted API key (from the vault, or the env var named by
    `api_key_env`); a kind that rents with a key (RunPod, Vast) refuses to start without one.
    `state_dir` is where the local provider keeps its pid files (`Settings.home /
    "local-machines"`); `sessions` is the store's session factory."""
    if config.needs_key and not credential:
        raise AuthError(
            f"provider {name!r} ({config.kind}) has no API key: store one in the vault or set "
            f"the environment variable named by api_key_env",
            provider=name,
        )
    factory = FACTORIES.get(config.kind)
    if factory is None:
        raise ValueError(f"provider {name!r}: unknown kind {config.kind!r}")
    return factory(
        name,
        config,
        ProviderBuild(credential, installation_id, sessions, state_dir, timeout, retry),
    )
