"""A provider answering every call 429 holds no worker: each call of the provider contract gives
up within the HTTP client's 2 s budget of waiting (none at all for RunPod's 30 s reset, which
it carries on), and nothing is ever created. The fakes answer as the real APIs do: RunPod with
its IETF `RateLimit: limit=60, remaining=0, reset=30` header, Vast with no hint at all.

The waiting is counted from the client's own sleeps (recorded, not slept), so the figures hold
on any machine however loaded."""

from __future__ import annotations

from collections.abc import Callable
from random import Random
from typing import Any

import pytest

from autoscaler.providers.base import RateLimitedError, create_on_first_offer
from autoscaler.providers.http import RetryPolicy
from tests.providers.conftest import make_runpod, make_vast, spec
from tests.providers.test_runpod import PREFS
from tests.providers.test_runpod import launch as runpod_launch
from tests.providers.test_vast import FILTERS
from tests.providers.test_vast import launch as vast_launch

BUDGET = RetryPolicy().rate_limit_budget


def _calls(
    provider: Any, offer: Any, launch: Any, machine_id: str
) -> dict[str, Callable[[], object]]:
    """Every call of the provider contract the control plane makes."""
    return {
        "find_offers": lambda: provider.find_offers(spec()),
        "list_owned": provider.list_owned,
        "find_by_label": lambda: provider.find_by_label(launch.label),
        "get": lambda: provider.get(machine_id),
        "destroy": lambda: provider.destroy(machine_id),
        "create": lambda: provider.create(offer, launch),
        "create_on_first_offer": lambda: create_on_first_offer(provider, [offer], launch),
    }


class _Draw(Random):
    """The backoff's jitter pinned to one end, so both ends of it are tried every run."""

    def __init__(self, draw: float) -> None:
        super().__init__()
        self._draw = draw

    def random(self) -> float:
        return self._draw


@pytest.mark.parametrize("draw", [0.0, 0.999999], ids=["shortest-jitter", "longest-jitter"])
@pytest.mark.parametrize("kind", ["runpod", "vast"])
def test_every_call_answered_429_gives_up_within_the_budget_and_creates_nothing(
    kind, draw, fake_runpod, fake_vast, sqlite_sessions
):
    if kind == "runpod":
        fake: Any = fake_runpod
        provider: Any = make_runpod(fake, gpu_types=PREFS)
        fake.rate_limit_header = "limit=60, remaining=0, reset=30"
        launch = runpod_launch()
        created = lambda: fake.pods  # noqa: E731
        machine_id = "pod1abc"
    else:
        fake = fake_vast
        provider = make_vast(fake, sqlite_sessions, **FILTERS)
        launch = vast_launch()
        created = lambda: fake.instances  # noqa: E731
        machine_id = "1234"
    offer = provider.find_offers(spec())[0]  # before the limit: a real offer to try
    before = dict(created())
    provider._http.retry = RetryPolicy()  # the production budget, not the tests' fast one
    slept: list[float] = []
    provider._http._sleep = slept.append
    provider._http._rng = _Draw(draw)
    fake.rate_limit_next = 10**6  # every call from now on
    for name, call in _calls(provider, offer, launch, machine_id).items():
        slept.clear()
        sent = len(fake.requests)
        with pytest.raises(RateLimitedError) as info:
            call()
        assert sum(slept) <= BUDGET, (name, slept)
        if kind == "runpod":  # a 30 s reset: raised at the first 429, carrying the reset
            assert slept == [] and info.value.retry_after == 30.0, (name, slept)
            assert len(fake.requests) - sent == 1, name
        else:  # no hint: our own jittered backoff (3 tries fit the budget, 4 at the shortest
            # jitter), one request per sleep plus the last, then up
            assert info.value.retry_after is None, name
            assert len(fake.requests) - sent == len(slept) + 1 <= RetryPolicy().attempts, name
    assert dict(created()) == before  # nothing was created, by any call
