"""How the agent talks to the server API: its settings (`AgentConfig`), one `Api` client that
retries what may be retried and reads every answer as its `wire` model, and the errors that
stop the agent (never carrying a token)."""

from __future__ import annotations

import logging
import os
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import requests
from pydantic import ValidationError

from autoscaler import wire

log = logging.getLogger("autoscaler.agent")


class AgentError(Exception):
    """The agent cannot go on; the message says why (never a token)."""


class ApiAnswered(AgentError):
    """The API answered, with an error status (as opposed to not being reachable at all)."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


@dataclass
class AgentConfig:
    api_url: str
    token: str
    launch_id: str | None = None  # None: a hand-made machine (token is an enrolment key)
    name: str | None = None
    queue: str | None = None
    workdir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="asg-agent-")))
    heartbeat_interval: float | None = None
    stop_grace: float = 3600.0

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **over: str) -> AgentConfig:
        e = os.environ if env is None else env
        api = over.pop("api_url", None) or e.get("AUTOSCALER_API_URL", "")
        token = e.get("AUTOSCALER_WORKER_TOKEN") or e.get("AUTOSCALER_ENROLMENT_KEY") or ""
        launch = None if e.get("AUTOSCALER_ENROLMENT_KEY") else e.get("AUTOSCALER_LAUNCH_ID")
        if not api or not token:
            raise AgentError(
                "the agent needs AUTOSCALER_API_URL and AUTOSCALER_WORKER_TOKEN (a rented "
                "machine gets both at launch) or AUTOSCALER_ENROLMENT_KEY (a hand-made one)"
            )
        interval = e.get("AUTOSCALER_HEARTBEAT_INTERVAL")
        cfg = cls(
            api_url=api.rstrip("/"),
            token=token,
            launch_id=launch,
            name=over.pop("name", None) or e.get("AUTOSCALER_AGENT_NAME") or os.uname().nodename,
            queue=over.pop("queue", None) or e.get("AUTOSCALER_QUEUE"),
            heartbeat_interval=float(interval) if interval else None,
        )
        workdir = over.pop("workdir", None) or e.get("AUTOSCALER_AGENT_WORKDIR")
        if workdir:
            cfg.workdir = Path(workdir).absolute()  # the worker runs in the checkout
        if cfg.launch_id is None and not cfg.queue:
            raise AgentError("a hand-made machine's agent needs --queue (or AUTOSCALER_QUEUE)")
        return cfg


A = TypeVar("A", bound=wire.Answer)


def said(exc: ValidationError) -> str:
    """Which fields a message got wrong and why, never their values (an answer holds the
    machine's broker password and the repository's token)."""
    return "; ".join(
        f"{'.'.join(str(p) for p in e['loc']) or 'the message'}: {e['msg']}"
        for e in exc.errors(include_url=False, include_input=False, include_context=False)
    )


def body_of(message: wire.RequestBody) -> dict[str, Any]:
    """The JSON a request body is sent as (a field not set is left out: the API's default)."""
    return message.model_dump(mode="json", exclude_none=True)


class Api:
    """The server API as the agent speaks to it: every body a `wire` request model, every answer
    parsed with the `wire` model the route answers (fields it does not know are ignored; an
    answer it cannot read is an AgentError, as an answer that is no JSON)."""

    def __init__(self, cfg: AgentConfig) -> None:
        self.cfg = cfg
        self.http = requests.Session()
        self.http.headers["Authorization"] = f"Bearer {cfg.token}"

    def _url(self, tail: str) -> str:
        if self.cfg.launch_id is None:
            return f"{self.cfg.api_url}/v1/hand-made/{tail}"
        return f"{self.cfg.api_url}/v1/worker/{self.cfg.launch_id}/{tail}"

    def call(
        self,
        method: str,
        tail: str,
        answer: type[A],
        body: wire.RequestBody | None = None,
        params: Mapping[str, str] | None = None,
    ) -> A:
        sent = body_of(body) if body is not None else None
        try:
            r = self.http.request(method, self._url(tail), timeout=10, json=sent, params=params)
        except requests.RequestException as exc:
            raise AgentError(f"the API cannot be reached ({type(exc).__name__})") from None
        if r.status_code >= 400:
            what = f"{method} {tail}: HTTP {r.status_code} {r.text[:300]}"
            raise ApiAnswered(what, r.status_code)
        try:
            data = r.json()
        except ValueError:
            raise AgentError(f"{method} {tail}: the API's answer is not JSON") from None
        try:
            return answer.model_validate(data)
        except ValidationError as exc:
            raise AgentError(
                f"{method} {tail}: the API's answer is not a {answer.__name__} ({said(exc)})"
            ) from None

    def call_retrying(
        self,
        method: str,
        tail: str,
        answer: type[A],
        body: wire.RequestBody | None = None,
        params: Mapping[str, str] | None = None,
        tries: int = 30,
    ) -> A:
        for attempt in range(tries):
            try:
                return self.call(method, tail, answer, body, params)
            except AgentError as exc:
                refused = isinstance(exc, ApiAnswered) and 400 <= exc.status < 500
                if attempt == tries - 1 or refused:
                    raise
                log.warning("%s; retrying", exc)
                time.sleep(min(10.0, 0.5 * 2**attempt))
        raise AgentError("unreachable")
