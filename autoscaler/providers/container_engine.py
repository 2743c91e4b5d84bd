"""The Docker Engine API of a Docker or Podman engine, as the container provider
(`providers.container`) calls it: where the engine is and how it is reached, the client made on
first use, what the SDK raises mapped to the provider errors, and a launch's secrets scrubbed
from whatever the engine says.

The engine is reached by its unix socket, or over TCP with verified TLS only, loopback included:
any container could call a plain TCP port, and the engine's API is root on its host.
"""

from __future__ import annotations

import math
import os
import threading
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

import docker
import docker.errors
import requests
from docker.tls import TLSConfig
from docker.utils import kwargs_from_env

from autoscaler.config.provider_options import (
    ENGINE_TCP_FIX,
    ENGINE_TCP_WITHOUT_TLS,
    ContainerOptions,
)
from autoscaler.providers.base import (
    AuthError,
    ProviderError,
    ProviderRequestError,
    RateLimitedError,
    TransientError,
)
from autoscaler.urls import shown_url, split_url

DEFAULT_URL = "unix:///var/run/docker.sock"
PROBE_API_VERSION = "1.41"
"""The API version the client is made with before asking the engine for its own."""
REDACTED = "***"

UNREACHABLE = (requests.exceptions.RequestException, docker.errors.DockerException, OSError)
"""What the SDK raises when the engine cannot be reached or its answer cannot be read."""

_CALL_SECRETS: ContextVar[frozenset[str]] = ContextVar("container_secrets", default=frozenset())


def cause(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text[:300]


def endpoint(
    provider: str, config: ContainerOptions, environ: Mapping[str, str]
) -> tuple[str, TLSConfig | None]:
    """The engine's URL and TLS, from the options, else from DOCKER_HOST (and its
    DOCKER_TLS_VERIFY / DOCKER_CERT_PATH), else the local socket. An engine reached over the
    network must be reached with verified TLS: its API is root on its host."""
    tls = config.tls
    if config.url is not None:
        if tls is None:
            if config.url.lower().startswith("tcp://"):  # the config model refuses it
                raise ProviderRequestError(
                    f"provider {provider!r}: url {shown_url(config.url)} "
                    f"{ENGINE_TCP_WITHOUT_TLS}; {ENGINE_TCP_FIX}",
                    provider=provider,
                )
            return config.url, None
        for field in ("ca_cert", "client_cert", "client_key"):
            path = getattr(tls, field)
            if path is not None and not os.access(path, os.R_OK):
                raise ProviderRequestError(
                    f"provider {provider!r}: tls.{field} {path!r} cannot be read by this "
                    "process; put the file there (readable by the autoscaler's user) or "
                    "fix the path",
                    provider=provider,
                )
        return config.url, TLSConfig(
            client_cert=(tls.client_cert, tls.client_key),
            ca_cert=tls.ca_cert,  # None: the system's CAs
            verify=True,
        )
    try:
        params = kwargs_from_env(environment=dict(environ))
    except docker.errors.DockerException as exc:
        raise ProviderRequestError(
            f"provider {provider!r}: DOCKER_TLS_VERIFY / DOCKER_CERT_PATH are unusable "
            f"({cause(exc)}); fix them or give the provider a url and tls",
            provider=provider,
        ) from None
    url = str(params.get("base_url") or DEFAULT_URL)
    env_tls = params.get("tls")
    parts = split_url(url)
    scheme = parts.scheme.lower() if parts is not None else ""
    if parts is None or scheme not in ("unix", "tcp"):
        raise ProviderRequestError(
            f"provider {provider!r}: DOCKER_HOST {shown_url(url)} is not a unix:// socket "
            "or a tcp:// address; fix it, or give the provider a url",
            provider=provider,
        )
    verified = isinstance(env_tls, TLSConfig) and bool(env_tls.verify)
    if scheme == "tcp" and not verified:
        raise ProviderRequestError(
            f"provider {provider!r}: DOCKER_HOST {shown_url(url)} reaches the engine over "
            "TCP without verified TLS, which is refused even on loopback: whoever can "
            "connect to that port (any process or container of that host) can run "
            "containers as root on it; point DOCKER_HOST at the engine's unix:// socket, "
            "set DOCKER_TLS_VERIFY=1 and DOCKER_CERT_PATH, or give the provider a unix:// "
            "url or a tcp:// url with a tls block",
            provider=provider,
        )
    return url, env_tls if isinstance(env_tls, TLSConfig) else None


class Engine:
    """One engine's API for the provider named `provider`; nothing is called before the first
    operation (`client`)."""

    def __init__(
        self,
        provider: str,
        config: ContainerOptions,
        environ: Mapping[str, str],
        *,
        timeout: float,
    ) -> None:
        self.provider = provider
        self.timeout = timeout
        self.url, self._tls = endpoint(provider, config, environ)
        self.shown_url = shown_url(self.url)
        self._api: Any = None
        self.name = "the engine"  # "Docker <version>" or "Podman <version>" once connected
        self._host: str | None = None
        self._lock = threading.Lock()

    def client(self) -> Any:
        """The engine's API client, made on first use."""
        with self._lock:
            if self._api is not None:
                return self._api
            with self.call("connect"):
                api = docker.APIClient(
                    base_url=self.url,
                    tls=self._tls or False,
                    timeout=max(1, math.ceil(self.timeout)),
                    version=PROBE_API_VERSION,
                )
                api.trust_env = False  # no proxy or .netrc of the environment for the engine
                version = api.version(api_version=False)
                api._version = str(version.get("ApiVersion") or PROBE_API_VERSION)
            components = version.get("Components") or []
            podman = any("podman" in str(c.get("Name", "")).lower() for c in components)
            self.name = f"{'Podman' if podman else 'Docker'} {version.get('Version', '')}"
            self._api = api
            return api

    @property
    def is_podman(self) -> bool:
        return self.name.startswith("Podman")

    def scrub(self, text: str) -> str:
        for secret in sorted(_CALL_SECRETS.get(), key=len, reverse=True):
            text = text.replace(secret, REDACTED)
        return text

    @contextmanager
    def redacting(self, secrets: Iterable[str]) -> Iterator[None]:
        """Scrub a launch's secrets (its worker token) from what the provider says meanwhile:
        an engine's error may quote the create request, environment included."""
        token = _CALL_SECRETS.set(_CALL_SECRETS.get() | {s for s in secrets if len(s) >= 8})
        try:
            yield
        finally:
            _CALL_SECRETS.reset(token)

    @contextmanager
    def call(self, what: str) -> Iterator[None]:
        """Map what the SDK raises to the provider errors (docstring of `providers.base`)."""
        try:
            yield
        except ProviderError:
            raise
        except docker.errors.APIError as exc:
            raise self.refused(exc, what) from None
        except requests.exceptions.SSLError as exc:
            raise AuthError(
                f"{self.provider}: {what}: the TLS handshake with the engine at "
                f"{self.shown_url} failed ({cause(exc)}); check tls.ca_cert (the CA that "
                "signed the engine's certificate) and that the engine trusts tls.client_cert",
                provider=self.provider,
            ) from None
        except UNREACHABLE as exc:
            raise self.unreachable(exc, what) from None

    def unreachable(self, exc: BaseException, what: str) -> TransientError:
        return TransientError(
            self.scrub(
                f"{self.provider}: {what}: the engine at {self.shown_url} did not answer "
                f"({cause(exc)}); is it running (systemctl start docker, or podman system "
                "service) and is the url right?"
            ),
            provider=self.provider,
        )

    def refused(self, exc: docker.errors.APIError, what: str) -> ProviderError:
        status = int(exc.status_code or 0)
        said = self.scrub(cause(exc.explanation or exc))
        message = f"{self.provider}: {what}: {self.name} answered HTTP {status}: {said}"
        if status in (401, 403):
            return AuthError(
                f"{message}; check the client certificate (tls) and the engine's authorization",
                provider=self.provider,
            )
        if status == 429:
            return RateLimitedError(message, provider=self.provider)
        if 400 <= status < 500:
            return ProviderRequestError(message, provider=self.provider)
        return TransientError(message, provider=self.provider)

    def host_name(self) -> str:
        if self._host is None:
            api = self.client()
            with self.call("info"):
                self._host = str(api.info().get("Name") or "") or self.shown_url
        return self._host

    def inspect(self, container_id: str) -> dict[str, Any] | None:
        """The container's full description; None when the engine has no such container."""
        api = self.client()
        with self.call(f"inspect {container_id[:64]}"):
            try:
                attrs: dict[str, Any] = api.inspect_container(container_id)
            except docker.errors.NotFound:
                return None
        return attrs
