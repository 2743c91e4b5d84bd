"""What RunPod and Vast.ai share: a keyed HTTP API client, and the label lookup after a create
whose outcome is unknown (one implementation for both, `base.find_after_ambiguous_create`)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager
from typing import TypedDict, Unpack

from autoscaler.providers.base import Provider, ProviderMachine, find_after_ambiguous_create
from autoscaler.providers.http import HttpClient, RetryPolicy


class ApiOptions(TypedDict, total=False):
    """How a keyed API provider talks to its API (tests shorten the waits)."""

    timeout: tuple[float, float]
    retry: RetryPolicy | None
    lookup_attempts: int
    lookup_delay: float
    sleep: Callable[[float], None]


class ApiProvider(Provider):
    display = ""
    """The provider's name in messages (e.g. "RunPod")."""

    def __init__(
        self,
        name: str,
        base_url: str,
        api_key: str,
        installation_id: str,
        **options: Unpack[ApiOptions],
    ) -> None:
        super().__init__(name, installation_id)
        self.lookup_attempts = max(1, options.get("lookup_attempts", 3))
        self.lookup_delay = options.get("lookup_delay", 2.0)
        self._sleep = options.get("sleep", time.sleep)
        self._http = HttpClient(
            name,
            base_url,
            api_key,
            timeout=options.get("timeout", (5.0, 30.0)),
            retry=options.get("retry"),
            sleep=self._sleep,
            label=f"{self.display} ({name})",
        )

    def redacting(self, secrets: Iterable[str]) -> AbstractContextManager[None]:
        return self._http.redacting(secrets)

    def _recover(self, label: str, why: str) -> ProviderMachine:
        """The create may have happened: find the machine by its label, or say it is unknown."""
        return find_after_ambiguous_create(
            self,
            label,
            why,
            attempts=self.lookup_attempts,
            delay=self.lookup_delay,
            sleep=self._sleep,
        )
