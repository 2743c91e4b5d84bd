"""Fake provider APIs: real HTTP servers on loopback that follow the published specs.

Each fake is a werkzeug WSGI app served by `werkzeug.serving.make_server` on 127.0.0.1 and a
free port, in a background thread. Every request is validated against the provider's OpenAPI
spec (tests/fakes/openapi_check.py) and refused as the real API would if the spec refuses it;
every response is validated too. Violations are recorded in `spec_violations` and the test
fixtures fail a test that leaves any behind (unless the test expected them).
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
from dataclasses import dataclass, field
from typing import Any

from werkzeug.serving import BaseWSGIServer, make_server
from werkzeug.wrappers import Request, Response

from tests.fakes.openapi_check import SpecChecker

logging.getLogger("werkzeug").setLevel(logging.ERROR)


@dataclass
class Recorded:
    method: str
    path: str
    query: dict[str, list[str]]
    body: Any
    authorization: str | None = field(default=None, repr=False)


class FakeServer:
    """Base of the fakes: serving, recording, auth and spec checks; subclasses route."""

    def __init__(self, checker: SpecChecker, api_key: str) -> None:
        self.checker = checker
        self.api_key = api_key
        self.lock = threading.RLock()
        self.requests: list[Recorded] = []
        self.spec_violations: list[str] = []
        self.rate_limit_next = 0  # the next N requests are answered 429 (no Retry-After)
        self.fail_next = 0  # the next N requests are answered 503 before doing anything
        # the next listing (`listing`) answered with what existed when it was asked, held back
        # until the event is set (`list_taken` says it was taken): a slow list racing our steps
        self.hold_list: threading.Event | None = None
        self.list_taken = threading.Event()
        # a provider that takes connections and never answers: every request held this long
        self.silent_for = 0.0
        self._server: BaseWSGIServer = make_server("127.0.0.1", 0, self._wsgi, threaded=True)
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_port}"

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    def __enter__(self) -> FakeServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- to implement

    def route(self, request: Request) -> Response:  # pragma: no cover - abstract
        raise NotImplementedError

    def unauthorized(self) -> Response:  # pragma: no cover - abstract
        raise NotImplementedError

    def invalid(self, kind: str, messages: list[str]) -> Response:  # pragma: no cover
        raise NotImplementedError

    def rate_limited(self) -> Response:  # pragma: no cover - abstract
        raise NotImplementedError

    def unavailable(self) -> Response:  # pragma: no cover - abstract
        raise NotImplementedError

    def unchecked(self, request: Request) -> bool:
        """Requests deliberately outside the spec (e.g. a deprecated endpoint) skip the check."""
        return False

    def listing(self, request: Request) -> bool:
        """The provider's list of machines (what reconcile reads)."""
        return False

    # -- helpers

    def calls(self, method: str, path_prefix: str = "") -> list[Recorded]:
        with self.lock:
            return [
                r for r in self.requests if r.method == method and r.path.startswith(path_prefix)
            ]

    @staticmethod
    def json(body: Any, status: int = 200, content_type: str = "application/json") -> Response:
        return Response(json.dumps(body), status=status, content_type=content_type)

    def _wsgi(self, environ: dict[str, Any], start_response: Any) -> Any:
        request = Request(environ)
        raw = request.get_data(cache=True)
        body: Any = None
        if raw:
            try:
                body = json.loads(raw)
            except ValueError:
                body = raw.decode("utf-8", "replace")
        with self.lock:
            self.requests.append(
                Recorded(
                    request.method,
                    request.path,
                    {k: request.args.getlist(k) for k in request.args},
                    body,
                    request.headers.get("Authorization"),
                )
            )
        if self.silent_for:
            sleep_quietly(self.silent_for)
        response = self._handle(request)
        hold = None
        if self.listing(request):
            with self.lock:  # one listing held per event set: the next ones (a launch's own
                hold, self.hold_list = self.hold_list, None  # lookup by label) are not
        if hold is not None:
            self.list_taken.set()
            hold.wait(60)
        if not self.unchecked(request):
            problems = self.checker.check_response(request, response)
            if problems:
                with self.lock:
                    self.spec_violations.append(
                        f"response {request.method} {request.path} {response.status_code}: "
                        + "; ".join(problems)
                    )
        return response(environ, start_response)

    def _handle(self, request: Request) -> Response:
        if request.headers.get("Authorization") != f"Bearer {self.api_key}":
            return self.unauthorized()
        if not self.unchecked(request):
            verdict = self.checker.check_request(request)
            if verdict is not None:
                kind, messages = verdict
                with self.lock:
                    self.spec_violations.append(
                        f"request {request.method} {request.path}: " + "; ".join(messages)
                    )
                return self.invalid(kind, messages)
        with self.lock:
            if self.rate_limit_next > 0:
                self.rate_limit_next -= 1
                return self.rate_limited()
            if self.fail_next > 0:
                self.fail_next -= 1
                return self.unavailable()
        return self.route(request)

    def expect_violations(self) -> list[str]:
        """Take the recorded violations (for tests that send bad requests on purpose)."""
        with self.lock:
            out, self.spec_violations = self.spec_violations, []
        return out


def sleep_quietly(seconds: float) -> None:
    """Hold a response (simulated slowness) without tying up the test thread."""
    with contextlib.suppress(Exception):
        threading.Event().wait(seconds)
