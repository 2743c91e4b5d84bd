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


def parse_config_text(text: str, source: str = "config") -> Config:
    """The document's own checks (YAML, schema, at least one queue), without the state store:
    the providers its queues name are not looked up (see `load_config_text`)."""
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
    return config


def load_config_text(
    text: str,
    source: str = "config",
    registered_providers: Mapping[str, ProviderConfig] | None = None,
    *,
    store_readable: bool = True,
) -> Config:
    """Validate a YAML document; providers may be declared in it or registered in the store.

    `store_readable=False`: the registered providers could not be read (the store is not set
    up), so a provider the file does not declare is refused with that fix.
    """
    config = parse_config_text(text, source)
    refusals = check_references(config, registered_providers or {}, store_readable)
    if refusals:
        raise ConfigError(refusals, source)
    return config


def _read(path: str | Path) -> str:
    p = Path(path)
    try:
        return p.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(
            [Refusal(str(p), f"cannot be read ({exc.strerror})", "check the path and permissions")],
            str(p),
        ) from None


def read_config(path: str | Path) -> Config:
    """The file's own checks only (see `parse_config_text`): needs no state store."""
    return parse_config_text(_read(path), str(path))


def load_config(
    path: str | Path,
    registered_providers: Mapping[str, ProviderConfig] | None = None,
    *,
    store_readable: bool = True,
) -> Config:
    return load_config_text(
        _read(path), str(path), registered_providers, store_readable=store_readable
    )


def known_providers(
    config: Config, registered: Mapping[str, ProviderConfig]
) -> dict[str, ProviderConfig]:
    """Providers a queue may name: those in the YAML, then those registered in the store."""
    return {**registered, **config.providers}


def check_references(
    config: Config, registered: Mapping[str, ProviderConfig], store_readable: bool = True
) -> list[Refusal]:
    known = known_providers(config, registered)
    refusals = []
    for name, queue in config.queues.items():
        auto = queue.autoscale
        if auto is None or auto.provider in known:
            continue
        names = ", ".join(sorted(known)) or "none yet"
        add = f"'autoscaler providers add {auto.provider} --kind vast|runpod|mock|local'"
        if store_readable:
            cause = f"unknown provider {auto.provider!r} (known: {names})"
            fix = f"register it with {add}, declare it under 'providers:', or name a known one"
        else:
            declared = ", ".join(sorted(config.providers)) or "none"
            cause = (
                f"unknown provider {auto.provider!r} (declared in this file: {declared}; the "
                "registered ones could not be read)"
            )
            fix = (
                "declare it under 'providers:' in this file, or set up the state store with "
                f"'autoscaler db upgrade' and register it with {add}"
            )
        refusals.append(Refusal(f"queues.{name}.autoscale.provider", cause, fix))
    return refusals
