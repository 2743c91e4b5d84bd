"""The dry run warns about a queue that can never rent and says where each provider comes from."""

from __future__ import annotations

import copy
import re
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

from autoscaler.config import ConfigError, load_config, load_config_text
from autoscaler.config.loader import known_providers
from autoscaler.config.provider_options import VastOptions
from autoscaler.config.summary import describe

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
NOW = datetime(2025, 3, 3, 12, 0, tzinfo=UTC)


def test_an_explicitly_empty_queues_block_is_refused():
    # `queues: {}` can never run: refused like a missing block, with the same minimal example
    # (a queue with `enabled: false` is how to keep one declared but off).
    with pytest.raises(ConfigError) as exc:
        load_config_text("queues: {}")
    [refusal] = exc.value.refusals
    assert refusal.path == "queues" and "the 'queues:' block is empty" in refusal.cause


def _config(provider: dict[str, Any], gpu_count: int = 1, cap: float = 0.30) -> str:
    return yaml.safe_dump(
        {
            "providers": {"p": provider},
            "queues": {
                "q": {
                    "autoscale": {
                        "provider": "p",
                        "max_workers": 2,
                        "instance": {
                            "gpu": "RTX 4090",
                            "gpu_count": gpu_count,
                            "max_price_per_hour": cap,
                        },
                    }
                }
            },
        }
    )


@pytest.mark.parametrize(
    ("provider", "gpu_count", "cap", "warned"),
    [
        ({"kind": "mock", "price_per_hour": 0.40}, 1, 0.30, True),
        ({"kind": "mock", "price_per_hour": 0.40}, 2, 0.70, True),  # $0.40/GPU × 2
        ({"kind": "mock", "price_per_hour": 0.40}, 2, 0.80, False),
        ({"kind": "mock", "price_per_hour": 0.30}, 1, 0.30, False),  # exactly at the cap
        ({"kind": "local", "price_per_hour": 1.0}, 1, 0.50, True),
        ({"kind": "local"}, 4, 0.10, False),
        ({"kind": "vast"}, 1, 0.01, False),  # live market: the price is not known in advance
        ({"kind": "runpod"}, 1, 0.01, False),
    ],
)
def test_the_dry_run_warns_when_no_offer_can_ever_meet_the_cap(provider, gpu_count, cap, warned):
    config = load_config_text(_config(provider, gpu_count, cap), "c.yaml", {})
    text = describe(config, known_providers(config, {}), NOW)
    assert ("can never rent" in text) is warned, text
    if warned:
        line = next(line for line in text.splitlines() if "can never rent" in line)
        assert line.startswith("  warning:")
        assert f"${cap:.2f}/h" in line
        assert "max_price_per_hour" in line  # the fix


def test_full_example_has_no_queue_that_can_never_rent():
    config = load_config(EXAMPLES / "full.yaml")
    for name, queue in config.queues.items():
        assert queue.autoscale is not None
        provider = config.providers[queue.autoscale.provider]
        spec = queue.autoscale.instance
        price = getattr(provider, "price_per_hour", None)
        if provider.kind == "mock":
            price = price * spec.gpu_count
        if price is not None:
            assert price <= spec.max_price_per_hour, name
    text = describe(config, known_providers(config, {}), NOW)
    assert "can never rent" not in text


def test_the_dry_run_says_where_each_provider_comes_from():
    doc = yaml.safe_load((EXAMPLES / "full.yaml").read_text())
    doc["queues"]["extra"] = copy.deepcopy(doc["queues"]["render"])
    doc["queues"]["extra"]["autoscale"]["provider"] = "stored"
    registered = {"gpu-vast": VastOptions(kind="vast"), "stored": VastOptions(kind="vast")}
    config = load_config_text(yaml.safe_dump(doc), "full.yaml", registered)
    text = describe(config, known_providers(config, registered), NOW, registered=registered)
    assert (
        "provider gpu-vast: declared in this file (overrides the registered one of the same name)"
        in text
    )
    assert "provider gpu-runpod: declared in this file\n" in text
    assert "provider stored: registered in the state store" in text
    # the file's own declaration is the one described for its queue
    assert "in US/CA/DE" in text
    assert re.search(r"provider desk: declared in this file \(no queue uses it\)", text)
