"""Turn YAML text into a validated Config, or a ConfigError listing every refusal."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from autoscaler.config.durations import format_duration
from autoscaler.config.errors import ConfigError, Refusal, refusals_from_validation
from autoscaler.config.gpus import WHERE, lookup, suggest
from autoscaler.config.models import Config
from autoscaler.config.provider_options import (
    PROVIDER_KINDS,
    PROVIDER_MODELS,
    ProviderConfig,
    RunPodOptions,
)
from autoscaler.config.safe_yaml import YamlRefusal, load_yaml
from autoscaler.textfile import TextFileError, read_text

MAX_CONFIG_BYTES = 1024 * 1024
"""A config file is read up to 1 MiB; the largest real one is a few KiB."""

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


def _no_queues(empty: bool, block: bool = False) -> Refusal:
    why = "the file is empty or only comments" if empty else "there is no 'queues:' block"
    if block:
        why = "the 'queues:' block is empty"
    return Refusal(
        "queues",
        f"no queue is configured ({why}), so nothing would ever be scaled",
        "add a 'queues:' block naming at least one queue; a minimal config:\n"
        + MINIMAL_EXAMPLE.rstrip("\n"),
    )


def parse_yaml_document(text: str, source: str = "config") -> Any:
    """The YAML of a config with the limits of `safe_yaml` (depth, aliases, numbers, duplicate
    keys); ConfigError with the position otherwise."""
    try:
        return load_yaml(text)
    except YamlRefusal as exc:
        raise ConfigError([Refusal(exc.where, exc.cause, exc.fix)], source) from None
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


def parse_config_text(text: str, source: str = "config", *, runnable: bool = False) -> Config:
    """The document's own checks (YAML, schema, at least one queue), without the state store:
    the providers its queues name are not looked up (see `load_config_text`).

    `runnable=True` (what every file a user gives gets: `load_config`, `read_config`) also
    refuses a config that could never run (`check_runnable`); programs building edge-case
    configs on purpose (the policy's property tests) leave it off."""
    data = parse_yaml_document(text, source)
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
    queues = data.get("queues")
    if queues is None:  # absent, or "queues:" with nothing under it
        data = {k: v for k, v in data.items() if k != "queues"}
        missing = [_no_queues(empty=not data)]
    elif queues == {}:  # written on purpose, and still nothing would ever run
        missing = [_no_queues(empty=False, block=True)]
    else:
        missing = []
    try:
        config = Config.model_validate(data)
    except ValidationError as exc:
        refusals = refusals_from_validation(exc)
    except (RecursionError, MemoryError, OverflowError) as exc:  # the YAML limits keep these out
        refusals = [
            Refusal("(document)", f"too large to validate ({type(exc).__name__})", "simplify it")
        ]
    if refusals or missing:
        raise ConfigError(refusals + missing, source)
    refusals = check_runnable(config) if runnable else []
    if refusals:
        raise ConfigError(refusals, source)
    return config


def check_runnable(config: Config) -> list[Refusal]:
    """A valid config that could still never run: no machine allowed, or deadlines shorter
    than the poll that checks them."""
    refusals = []
    enabled = {
        name: q.autoscale
        for name, q in config.queues.items()
        if q.autoscale is not None and q.autoscale.enabled
    }
    limits = config.limits
    if enabled and limits.max_machines == 0:
        refusals.append(
            Refusal(
                "limits.max_machines",
                "0 machines are allowed across the account, so no enabled queue can ever rent",
                "raise limits.max_machines, remove it (no cap), or set 'enabled: false' on "
                "every queue",
            )
        )
    if enabled and limits.max_price_per_hour == 0:
        refusals.append(
            Refusal(
                "limits.max_price_per_hour",
                "$0/h is allowed across the account, so no enabled queue can ever rent",
                "raise limits.max_price_per_hour, remove it (no cap), or set 'enabled: false' "
                "on every queue",
            )
        )
    poll = config.poll_interval
    for what, value in (
        ("heartbeat_timeout", config.heartbeat_timeout),
        ("boot_timeout", config.boot_timeout),
    ):
        if value < poll:
            refusals.append(
                Refusal(
                    what,
                    f"{format_duration(value)} is shorter than poll_interval "
                    f"({format_duration(poll)}), so it would expire between two checks",
                    f"make {what} at least {format_duration(poll)}, or poll more often",
                )
            )
    for name, auto in enabled.items():
        assert auto is not None
        where = f"queues.{name}.autoscale"
        settings = config.queue_settings(name)
        qpoll, boot = settings.poll_interval, settings.boot_timeout
        if auto.poll_interval is not None and config.heartbeat_timeout < qpoll:
            refusals.append(
                Refusal(
                    f"{where}.poll_interval",
                    f"{format_duration(qpoll)} is longer than heartbeat_timeout "
                    f"({format_duration(config.heartbeat_timeout)}): a live worker would be "
                    "declared silent between two checks",
                    f"poll at most every {format_duration(config.heartbeat_timeout)}, or raise "
                    "heartbeat_timeout",
                )
            )
        if boot < qpoll and (auto.poll_interval is not None or auto.boot_timeout is not None):
            field = "boot_timeout" if auto.boot_timeout is not None else "poll_interval"
            refusals.append(
                Refusal(
                    f"{where}.{field}",
                    f"the boot timeout ({format_duration(boot)}) is shorter than the queue's "
                    f"poll interval ({format_duration(qpoll)}), so a booting machine would be "
                    "given up between two checks",
                    f"make boot_timeout at least {format_duration(qpoll)}, or poll more often",
                )
            )
        pool = auto.warm_pool
        if pool.size > 0 and pool.resume_timeout < qpoll:
            refusals.append(
                Refusal(
                    f"{where}.warm_pool.resume_timeout",
                    f"{format_duration(pool.resume_timeout)} is shorter than the queue's poll "
                    f"interval ({format_duration(qpoll)}), so a resumed machine would be given up "
                    "between two checks",
                    f"make resume_timeout at least {format_duration(qpoll)}, or poll more often",
                )
            )
    return refusals


def load_config_text(
    text: str,
    source: str = "config",
    registered_providers: Mapping[str, ProviderConfig] | None = None,
    *,
    store_readable: bool = True,
    runnable: bool = False,
) -> Config:
    """Validate a YAML document; providers may be declared in it or registered in the store.

    `store_readable=False`: the registered providers could not be read (the store is not set
    up), so a provider the file does not declare is refused with that fix. `runnable`: see
    `parse_config_text`.
    """
    config = parse_config_text(text, source, runnable=runnable)
    registered = registered_providers or {}
    refusals = check_references(config, registered, store_readable)
    refusals += check_warm_pools(config, registered)
    refusals += check_interruptible(config, registered)
    refusals += check_gpu_names(config, registered)
    if refusals:
        raise ConfigError(refusals, source)
    return config


def _read(path: str | Path) -> str:
    """The file's text: a regular file of at most MAX_CONFIG_BYTES, UTF-8."""
    try:
        return read_text(path, limit=MAX_CONFIG_BYTES, what="a config file")
    except TextFileError as exc:
        raise ConfigError([Refusal(exc.path, exc.cause, exc.fix)], str(path)) from None


def read_config_text(path: str | Path) -> str:
    """The text of a config file, with the limits every reader of a config shares."""
    return _read(path)


def read_config(path: str | Path) -> Config:
    """The file's own checks only (see `parse_config_text`): needs no state store."""
    return parse_config_text(_read(path), str(path), runnable=True)


def load_config(
    path: str | Path,
    registered_providers: Mapping[str, ProviderConfig] | None = None,
    *,
    store_readable: bool = True,
) -> Config:
    return load_config_text(
        _read(path), str(path), registered_providers, store_readable=store_readable, runnable=True
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
        for missing in auto.providers if auto is not None else ():
            if missing not in known:
                refusals.append(_unknown_provider(config, known, name, missing, store_readable))
    return refusals


def _unknown_provider(
    config: Config,
    known: Mapping[str, ProviderConfig],
    name: str,
    missing: str,
    store_readable: bool,
) -> Refusal:
    names = ", ".join(sorted(known)) or "none yet"
    add = f"'autoscaler providers add {missing} --kind {'|'.join(PROVIDER_KINDS)}'"
    if store_readable:
        cause = f"unknown provider {missing!r} (known: {names})"
        fix = f"register it with {add}, declare it under 'providers:', or name a known one"
    else:
        declared = ", ".join(sorted(config.providers)) or "none"
        cause = (
            f"unknown provider {missing!r} (declared in this file: {declared}; the "
            "registered ones could not be read)"
        )
        fix = (
            "declare it under 'providers:' in this file, or set up the state store with "
            f"'autoscaler db upgrade' and register it with {add}"
        )
    return Refusal(f"queues.{name}.autoscale.provider", cause, fix)


def check_interruptible(config: Config, registered: Mapping[str, ProviderConfig]) -> list[Refusal]:
    """Interruptible machines are Vast's bid instances: a queue asking for them must list a
    provider of a kind that rents at a bid (`can_bid`; its other providers rent on demand)."""
    known = known_providers(config, registered)
    refusals = []
    for name, queue in config.queues.items():
        auto = queue.autoscale
        if auto is None or auto.instance.interruptible is None:
            continue
        listed = [known[p] for p in auto.providers if p in known]
        kinds = {p.kind for p in listed}
        if listed and not any(p.can_bid for p in listed):
            refusals.append(
                Refusal(
                    f"queues.{name}.autoscale.instance.interruptible",
                    f"interruptible machines are Vast's bid instances, and this queue rents from "
                    f"{', '.join(auto.providers)} ({', '.join(sorted(kinds))})",
                    "add a Vast provider to autoscale.provider, or remove interruptible",
                )
            )
    return refusals


def _stoppable_kinds() -> str:
    return ", ".join(
        kind for kind, m in zip(PROVIDER_KINDS, PROVIDER_MODELS, strict=True) if m.can_stop
    )


def check_warm_pools(config: Config, registered: Mapping[str, ProviderConfig]) -> list[Refusal]:
    """A warm pool its provider cannot keep: its kind cannot stop a machine, or (RunPod) a
    stopped pod would keep no disk for the agent's work folder. Judged on the provider a queue
    really uses (the file's, else the store's); an unknown one is `check_references`' refusal."""
    known = known_providers(config, registered)
    refusals = []
    for name, queue in config.queues.items():
        auto = queue.autoscale
        if auto is None or auto.warm_pool.size == 0:
            continue
        for p in auto.providers:  # a pool keeps machines of each provider it rents from
            if p in known:
                refusals += _warm_pool_refusals(config, known, name, auto.warm_pool.size, p)
    return refusals


def _warm_pool_refusals(
    config: Config, known: Mapping[str, ProviderConfig], name: str, size: int, p: str
) -> list[Refusal]:
    provider = known[p]
    where = f"queues.{name}.autoscale.warm_pool.size"
    if not provider.can_stop:
        able = sorted(n for n, other in known.items() if other.can_stop)
        which = f"; known ones that can: {', '.join(able)}" if able else ""
        return [
            Refusal(
                where,
                f"a warm pool of {size} needs machines that can be stopped "
                f"with their disk kept, and provider {p!r} is of kind "
                f"{provider.kind!r}, which cannot stop one",
                "set warm_pool.size to 0 (or remove warm_pool), or use a provider of a kind "
                f"that can stop ({_stoppable_kinds()}){which}",
            )
        ]
    if isinstance(provider, RunPodOptions) and provider.volume_gb == 0:
        fix = (
            f"set providers.{p}.volume_gb to the GB that folder needs (e.g. 20)"
            if p in config.providers
            else f"give {p} a volume of the GB that folder needs (e.g. 20): declare it under "
            "'providers:' with volume_gb (the file's declaration overrides the registered "
            f"one), or 'autoscaler providers remove {p}' and add it again with "
            "'--option volume_gb=20'"
        )
        return [
            Refusal(
                where,
                f"RunPod provider {p!r} gives its pods no volume disk (volume_gb: 0): the "
                "container disk is erased at stop, and the agent's work folder (checkout, "
                "virtualenv, downloaded files) needs a volume to survive it",
                f"{fix}; or set warm_pool.size to 0",
            )
        ]
    return []


TABLE_KINDS = ("runpod", "vast")
"""Provider kinds that rent a GPU by its name in `config.gpus`' table. The others take any name:
mock machines are simulated, local and container ones are the team's own hardware."""


def check_gpu_names(config: Config, registered: Mapping[str, ProviderConfig]) -> list[Refusal]:
    """Every GPU a queue asks of a RunPod or Vast provider, and every entry of a RunPod
    provider's `gpu_types`, is a name of the GPU table (or a provider's spelling of one)."""
    known = known_providers(config, registered)
    refusals = []
    for name, queue in config.queues.items():
        auto = queue.autoscale
        if auto is None:
            continue
        renting = [p for p in auto.providers if p in known and known[p].kind in TABLE_KINDS]
        if renting:
            whose = ", ".join(f"{p!r} ({known[p].kind})" for p in renting)
            where = f"queues.{name}.autoscale.instance.gpu"
            refusals += [_unknown_gpu(where, g, whose) for g in _unknown(auto.instance.gpus)]
    for name, provider in config.providers.items():
        if isinstance(provider, RunPodOptions):
            where, whose = f"providers.{name}.gpu_types", f"RunPod provider {name!r}"
            refusals += [_unknown_gpu(where, g, whose) for g in _unknown(provider.gpu_types)]
            refusals += [_not_on_runpod(where, g) for g in _vast_only(provider.gpu_types)]
    return refusals


def _vast_only(names: tuple[str, ...]) -> list[str]:
    return [n for n in names if (gpu := lookup(n)) is not None and gpu.runpod is None]


def _not_on_runpod(where: str, gpu: str) -> Refusal:
    return Refusal(
        where,
        f"RunPod does not offer {gpu!r}: {WHERE} lists it for Vast alone",
        "remove it from gpu_types, or name a GPU of RunPod's (its GPU id or the table's name)",
    )


def _unknown(names: tuple[str, ...]) -> list[str]:
    return [n for n in names if lookup(n) is None]


def _unknown_gpu(where: str, gpu: str, whose: str) -> Refusal:
    close = suggest(gpu)
    hint = f"did you mean {' or '.join(repr(c) for c in close)}? " if close else ""
    return Refusal(
        where,
        f"unknown GPU {gpu!r} (asked of {whose}): it is not in {WHERE}",
        f"{hint}write a GPU of that table by its name, RunPod's GPU id or Vast's gpu_name (any "
        "case; spaces, '_' and '-' are ignored); a GPU a provider added since goes in the table "
        "first",
    )
