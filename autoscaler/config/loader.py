"""Turn YAML text into a validated Config, or a ConfigError listing every refusal."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from autoscaler.config.errors import ConfigError, Refusal, refusals_from_validation
from autoscaler.config.models import Config, ProviderConfig

MINIMAL_EXAMPLE = """\
providers:
  my-gpu: {kind: mock}           # or a provider registered with 'autoscaler providers add'
queues:
  jobs:                          # the name of the queue your workers take jobs from
    autoscale:
      provider: my-gpu
      max_workers: 2
      scale_up: [{trigger: no_workers}]
      scale_down: [{trigger: idle, timeout: 10m}]
      instance: {gpu: "RTX 4090", max_price_per_hour: 0.60}
"""


def _no_queues(empty: bool) -> Refusal:
    why = "the file is empty or only comments" if empty else "there is no 'queues:' block"
    return Refusal(
        "queues",
        f"no queue is configured ({why}), so nothing would ever be scaled",
        "add a 'queues:' block naming at least one queue; a minimal config:\n"
        + MINIMAL_EXAMPLE.rstrip("\n"),
    )


def load_config_text(
    text: str,
    source: str = "config",
    registered_providers: Mapping[str, ProviderConfig] | None = None,
) -> Config:
    """Validate a YAML document; providers may be declared in it or registered in the store."""
    try:
        data: Any = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "(document)"
        raise ConfigError(
            [
                Refusal(
                    where,
                    f"not valid YAML ({getattr(exc, 'problem', exc)})",
                    "fix the indentation or quoting at that position",
                )
            ],
            source,
        ) from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(
            [
                Refusal(
                    "(top level)",
                    "the document is not a mapping",
                    "start with 'queues:' (and optionally 'providers:')",
                )
            ],
            source,
        )
    refusals: list[Refusal] = []
    if data.get("queues") is None:  # absent, or "queues:" with nothing under it
        data = {k: v for k, v in data.items() if k != "queues"}
        missing = [_no_queues(empty=not data)]
    else:
        missing = []  # an explicit "queues: {}" is deliberate: nothing to scale yet
    try:
        config = Config.model_validate(data)
    except ValidationError as exc:
        refusals = refusals_from_validation(exc)
    if refusals or missing:
        raise ConfigError(refusals + missing, source)
    refusals = check_references(config, registered_providers or {})
    if refusals:
        raise ConfigError(refusals, source)
    return config


def load_config(
    path: str | Path, registered_providers: Mapping[str, ProviderConfig] | None = None
) -> Config:
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(
            [Refusal(str(p), f"cannot be read ({exc.strerror})", "check the path and permissions")],
            str(p),
        ) from None
    return load_config_text(text, str(p), registered_providers)


def known_providers(
    config: Config, registered: Mapping[str, ProviderConfig]
) -> dict[str, ProviderConfig]:
    """Providers a queue may name: those in the YAML, then those registered in the store."""
    return {**registered, **config.providers}


def check_references(config: Config, registered: Mapping[str, ProviderConfig]) -> list[Refusal]:
    known = known_providers(config, registered)
    refusals = []
    for name, queue in config.queues.items():
        auto = queue.autoscale
        if auto is None or auto.provider in known:
            continue
        names = ", ".join(sorted(known)) or "none yet"
        refusals.append(
            Refusal(
                f"queues.{name}.autoscale.provider",
                f"unknown provider {auto.provider!r} (known: {names})",
                f"register it with 'autoscaler providers add {auto.provider} --kind vast|runpod"
                "|mock|local', declare it under 'providers:', or name a known one",
            )
        )
    return refusals
