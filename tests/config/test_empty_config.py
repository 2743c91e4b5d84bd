"""A config that declares no queue is refused with a minimal one to start from."""

from __future__ import annotations

import pytest

from autoscaler.config import ConfigError, load_config_text


def refused(text: str) -> ConfigError:
    with pytest.raises(ConfigError) as exc:
        load_config_text(text, "c.yaml", {})
    return exc.value


@pytest.mark.parametrize(
    "text",
    ["", "\n\n", "# nothing here yet\n# still nothing\n", "{}", "queues:\n", "backoff: {}\n"],
    ids=["empty", "blank lines", "only comments", "empty mapping", "null queues", "no queues"],
)
def test_a_config_without_queues_is_refused_with_a_minimal_example(text):
    error = refused(text)
    [refusal] = [r for r in error.refusals if r.path == "queues"]
    assert "no queue" in refusal.cause
    assert "queues:" in refusal.fix
    # the example in the fix is a whole config that validates on its own
    example = refusal.fix.split("\n", 1)[1]
    config = load_config_text(example, "example", {})
    assert config.queues


def test_the_example_is_shown_as_an_indented_block():
    rendered = refused("").render()
    lines = rendered.splitlines()
    queues_line = next(line for line in lines if line.strip() == "queues:")
    assert queues_line.startswith("      ")  # below the refusal, not flush left
