"""What one control-plane process keeps between tasks: connections and caches, never state.

Everything that must outlive a task (readings, sightings, machines, backoffs) is in the store;
this only avoids reconnecting and re-parsing on every tick. The config is reloaded when its
version (or the registered providers) change, which a tick checks with one cheap query.
"""

from __future__ import annotations

import gc
import logging
import os
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime

from pydantic import ValidationError

from autoscaler.access.credentials import registered_provider_configs, resolve_api_key
from autoscaler.brokers.base import source_url
from autoscaler.brokers.fallback import FallbackReader
from autoscaler.brokers.prometheus import PrometheusReader
from autoscaler.brokers.registry import (
    ReadGroup,
    build_prometheus,
    build_source,
    group_queues,
    transport_options,
)
from autoscaler.brokers.workers import CeleryWorkerProbe
from autoscaler.config.errors import ConfigError
from autoscaler.config.loader import known_providers
from autoscaler.config.metrics_sources import MetricsSource
from autoscaler.config.models import Config, Queue
from autoscaler.config.provider_options import ProviderConfig
from autoscaler.config.triggers import MetricTrigger
from autoscaler.providers.base import Provider
from autoscaler.providers.registry import build_provider
from autoscaler.settings import Settings
from autoscaler.store import config_versions, installation
from autoscaler.store import providers as provider_rows
from autoscaler.store.db import Session, make_engine, session_factory
from autoscaler.store.head_sightings import StoredSightings
from autoscaler.store.metric_readings import StoredReadings
from autoscaler.urls import transport
from autoscaler.vault import Vault

log = logging.getLogger("autoscaler.control")


@contextmanager
def collector_paused() -> Iterator[None]:
    """Python's cycle collector off for one evaluation, back on after it.

    A tick over 10,000 queues allocates millions of short-lived objects (rows, readings, plans)
    and each pass of the collector walks every live object, the loaded config's included: it
    ran ~5,000 times a tick and took 1.2-1.9 s of a 5-6 s tick (`benchmarks/tick.py`). Almost
    all of the tick's garbage is freed by reference counting as it goes; the few cycles it makes
    wait for the collector's next pass after the tick. Nested or with the collector already
    off, it changes nothing."""
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def utc_now() -> datetime:
    return datetime.now(UTC)


@dataclass(frozen=True)
class Loaded:
    """One version of the config as the loop runs it: providers registered in the store and
    declared in the document merged (the document's declaration wins on a name clash)."""

    version: int
    config: Config

    @property
    def autoscaled(self) -> dict[str, Queue]:
        return {
            name: q
            for name, q in self.config.queues.items()
            if q.autoscale is not None and q.autoscale.enabled
        }

    def poll_interval(self, queue: str) -> float:
        return self.config.queue_settings(queue).poll_interval


def effective_config(
    document: Mapping[str, object], registered: Mapping[str, ProviderConfig]
) -> Config:
    config = Config.model_validate(document)
    return config.model_copy(update={"providers": known_providers(config, registered)})


class Runtime:
    """Engine, sessions, the loaded config, built providers, metric sources and worker probes."""

    def __init__(self, settings: Settings | None = None, env: Mapping[str, str] | None = None):
        self.settings = settings or Settings.from_env()
        self.env = os.environ if env is None else env
        self.engine = make_engine(self.settings.database_url)
        self.sessions = session_factory(self.engine)
        self._lock = threading.RLock()
        self._key: tuple[object, ...] | None = None
        self._loaded: Loaded | None = None
        self._providers: dict[tuple[str, ProviderConfig], Provider] = {}
        self._versions: dict[int, Loaded | None] = {}
        self._sources: dict[MetricsSource, FallbackReader] = {}
        self._probes: dict[MetricsSource, CeleryWorkerProbe | None] = {}
        self._prometheus: dict[tuple[object, str | None], PrometheusReader] = {}
        self._installation: str | None = None
        self.no_config_logged = False

    @contextmanager
    def transaction(self) -> Iterator[Session]:
        with self.sessions() as session, session.begin():
            yield session

    # ------------------------------------------------------------------ config

    def load(self, session: Session) -> Loaded | None:
        """The newest config version (cached until it or the registered providers change)."""
        version = config_versions.current_version(session)
        if version is None:
            return None
        key = (version, *provider_rows.stamp(session))
        with self._lock:
            if self._loaded is not None and key == self._key:
                return self._loaded
            loaded = self._newest_valid(session)
            self._reset()
            self._key, self._loaded = key, loaded
            if loaded is not None:
                log.info(
                    "running config version %d (%d queue(s))",
                    loaded.version,
                    len(loaded.config.queues),
                )
            return loaded

    def _newest_valid(self, session: Session) -> Loaded | None:
        """The newest version that still validates (a version stored by an older release may
        break a newer rule: the loop keeps running the last good one and says so, loudly)."""
        try:
            registered = registered_provider_configs(session)
        except ConfigError as exc:
            log.error("a registered provider no longer validates: %s", exc)
            registered = {}
        for row in reversed(config_versions.history(session)):
            try:
                return Loaded(row.version, effective_config(row.document, registered))
            except (ValidationError, ConfigError) as exc:
                log.error(
                    "config version %d no longer validates (%d problem(s)); it is not run: "
                    "fix the file and apply it again ('autoscaler validate' shows why)",
                    row.version,
                    len(exc.errors()) if isinstance(exc, ValidationError) else len(exc.refusals),
                )
        return None

    def load_version(self, session: Session, version: int | None) -> Loaded | None:
        """The config as of stored `version` (None: the newest), as the loop ran it: what a
        launch rents, and where a drain or terminate finds its queue and provider. None when
        that version is gone or no longer validates."""
        newest = self.load(session)
        if version is None or (newest is not None and newest.version == version):
            return newest
        with self._lock:
            if version in self._versions:
                return self._versions[version]
        row = config_versions.get(session, version)
        loaded: Loaded | None = None
        if row is not None:
            try:
                registered = registered_provider_configs(session)
                loaded = Loaded(row.version, effective_config(row.document, registered))
            except (ValidationError, ConfigError) as exc:
                log.error("config version %d no longer validates: %s", version, str(exc)[:300])
        with self._lock:
            if len(self._versions) >= 32:  # a few versions are ever in flight at once
                self._versions.clear()
            self._versions[version] = loaded
        return loaded

    def load_for(self, session: Session, version: int | None) -> Loaded | None:
        """The config a machine was rented under (`Instance.config_version`), else the newest:
        what drain and terminate read its queue and provider from."""
        return self.load_version(session, version) or self.load(session)

    def installation_id(self, session: Session) -> str:
        if self._installation is None:
            self._installation = installation.installation_id(session)
        return self._installation

    def _reset(self) -> None:
        for src in self._sources.values():
            _close(src)
        for probe in self._probes.values():
            if probe is not None:
                _close(probe)
        for reader in self._prometheus.values():
            _close(reader)
        self._providers.clear()
        self._versions.clear()
        self._sources.clear()
        self._probes.clear()
        self._prometheus.clear()

    # ------------------------------------------------------------------ providers

    def provider(self, name: str, loaded: Loaded | None = None) -> Provider:
        """The provider `name` of `loaded` (default: the newest config), with its key from the
        vault or the env. Raises CredentialError / AuthError / KeyError naming the fix."""
        with self._lock:
            loaded = loaded or self._loaded
            if loaded is None or name not in loaded.config.providers:
                raise KeyError(f"provider {name!r} is neither registered nor in the config")
            config = loaded.config.providers[name]
            built = self._providers.get((name, config))
            if built is not None:
                return built
            with self.transaction() as session:
                row = provider_rows.get_provider(session, name)
                encrypted = row.credentials_encrypted if row is not None else None
                install = self.installation_id(session)
            key = resolve_api_key(
                name, config, encrypted, lambda: Vault.from_settings(self.settings), self.env
            )
            built = build_provider(
                name,
                config,
                credential=key,
                installation_id=install,
                sessions=self.sessions,
                state_dir=self.settings.home / "local-machines",
            )
            self._providers[(name, config)] = built
            return built

    # ------------------------------------------------------------------ metrics

    def read_groups(self, queues: Mapping[str, Queue]) -> list[ReadGroup]:
        return group_queues(queues)

    def source(self, group: ReadGroup) -> FallbackReader:
        with self._lock:
            src = self._sources.get(group.source)
            if src is None:
                src = build_source(
                    group.source,
                    env=self.env,
                    sightings=StoredSightings(self.sessions),
                    last=StoredReadings(self.sessions),
                )
                self._sources[group.source] = src
            return src

    def prometheus(self, trigger: MetricTrigger) -> PrometheusReader:
        """The reader of a `metric` trigger's Prometheus, one per address for as long as the
        config version runs (a new version may change its timeout or the variable holding its
        address). Raises MetricsConfigError (not cached) where the address is not set."""
        key = (trigger.url, trigger.url_env)
        with self._lock:
            reader = self._prometheus.get(key)
            if reader is None:
                reader = build_prometheus(trigger, env=self.env)
                self._prometheus[key] = reader
            return reader

    def worker_probe(self, source: MetricsSource) -> CeleryWorkerProbe | None:
        """Celery's remote control on a watched broker (Redis or RabbitMQ), or None where the
        source has none (asynq, plain lists, kombu's SQL transport: no broadcast there)."""
        key = source.model_copy(update={"queue": None})
        with self._lock:
            if key in self._probes:
                return self._probes[key]
            probe: CeleryWorkerProbe | None = None
            if source.source == "celery":
                try:
                    url = source_url(source, self.env)
                except ValueError:
                    url = ""
                if transport(url) in ("redis", "amqp"):
                    options = transport_options(source, url)
                    probe = CeleryWorkerProbe(url, transport_options=options, timeout=1.0)
            self._probes[key] = probe
            return probe

    def close(self) -> None:
        with self._lock:
            self._reset()
        self.engine.dispose()


def _close(thing: object) -> None:
    try:
        thing.close()  # type: ignore[attr-defined]
    except Exception:  # closing a broken connection must not break the caller
        log.debug("closing %r failed", thing, exc_info=True)


_RUNTIME: Runtime | None = None
_RUNTIME_LOCK = threading.Lock()


def runtime() -> Runtime:
    """This process's runtime (created on first use; Celery tasks share it)."""
    global _RUNTIME
    with _RUNTIME_LOCK:
        if _RUNTIME is None:
            _RUNTIME = Runtime()
        return _RUNTIME


def reset_runtime() -> None:
    """Forget this process's runtime (after a fork, or in tests)."""
    global _RUNTIME
    with _RUNTIME_LOCK:
        if _RUNTIME is not None:
            _RUNTIME.close()
        _RUNTIME = None
