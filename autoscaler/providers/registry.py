"""Build a `Provider` from its config block, its key, this installation's id and the store."""

from __future__ import annotations

from pathlib import Path

from sqlalchemy.orm import Session, sessionmaker

from autoscaler.config import models as cfg
from autoscaler.providers.base import AuthError, Provider
from autoscaler.providers.http import RetryPolicy
from autoscaler.providers.local import LocalProvider
from autoscaler.providers.mock import MockProvider
from autoscaler.providers.runpod import RunPodProvider
from autoscaler.providers.vast import VastProvider
from autoscaler.store.avoided_hosts import StoredHostsToAvoid
from autoscaler.store.mock_machines import StoredMockMachines


def build_provider(
    name: str,
    config: cfg.RunPodProvider | cfg.VastProvider | cfg.MockProvider | cfg.LocalProvider,
    *,
    credential: str | None,
    installation_id: str,
    sessions: sessionmaker[Session],
    state_dir: Path | None = None,
    timeout: tuple[float, float] = (5.0, 30.0),
    retry: RetryPolicy | None = None,
) -> Provider:
    """The provider for config block `name`.

    `credential` is the decrypted API key (from the vault, or the env var named by
    `api_key_env`); RunPod and Vast refuse to start without one. `state_dir` is where the local
    provider keeps its pid files (e.g. `Settings.home / "local-machines"`).
    """
    if isinstance(config, cfg.RunPodProvider | cfg.VastProvider) and not credential:
        raise AuthError(
            f"provider {name!r} ({config.kind}) has no API key: store one in the vault or set "
            f"the environment variable named by api_key_env",
            provider=name,
        )
    if isinstance(config, cfg.RunPodProvider):
        assert credential is not None
        return RunPodProvider(
            name, config, credential, installation_id, timeout=timeout, retry=retry
        )
    if isinstance(config, cfg.VastProvider):
        assert credential is not None
        return VastProvider(
            name,
            config,
            credential,
            installation_id,
            StoredHostsToAvoid(sessions),
            timeout=timeout,
            retry=retry,
        )
    if isinstance(config, cfg.MockProvider):
        return MockProvider(name, config, installation_id, StoredMockMachines(sessions))
    if isinstance(config, cfg.LocalProvider):
        if state_dir is None:
            raise ValueError(f"provider {name!r} (local) needs a state directory for its pid files")
        return LocalProvider(name, config, installation_id, state_dir)
    raise ValueError(f"provider {name!r}: unknown kind {getattr(config, 'kind', '?')!r}")
