"""The file's own checks need no state store; without one, an undeclared provider is refused
with the fix that applies (declare it, or set up the store and register it)."""

from __future__ import annotations

from pathlib import Path

import pytest

from autoscaler.config import ConfigError, load_config, read_config

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def test_the_files_own_checks_do_not_look_providers_up():
    config = read_config(EXAMPLES / "seed.yaml")  # names gpu-vast, which it does not declare
    assert config.queues["inference"].autoscale is not None


def test_the_files_own_checks_still_refuse_a_bad_file(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text((EXAMPLES / "seed.yaml").read_text().replace('"5m"', '"5 minutes"'))
    with pytest.raises(ConfigError, match="'5 minutes' is not a duration"):
        read_config(bad)
    with pytest.raises(ConfigError, match="cannot be read"):
        read_config(tmp_path / "missing.yaml")


def test_an_undeclared_provider_without_a_store_is_refused_with_both_fixes():
    with pytest.raises(ConfigError) as exc:
        load_config(EXAMPLES / "seed.yaml", {}, store_readable=False)
    [refusal] = exc.value.refusals
    assert refusal.path == "queues.inference.autoscale.provider"
    assert "the registered ones could not be read" in refusal.cause
    assert "declare it under 'providers:'" in refusal.fix
    assert "autoscaler db upgrade" in refusal.fix
    assert "autoscaler providers add gpu-vast" in refusal.fix


def test_with_a_store_the_refusal_lists_what_is_known():
    with pytest.raises(ConfigError) as exc:
        load_config(EXAMPLES / "seed.yaml", {})
    [refusal] = exc.value.refusals
    assert "(known: none yet)" in refusal.cause and "db upgrade" not in refusal.fix
