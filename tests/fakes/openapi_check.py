"""Checking the fakes' traffic against the providers' published OpenAPI specs (openapi-core).

The specs are copies kept in `tests/fakes/specs/` (see the README there for where each came from).

Every request a fake receives is validated against the spec (method, path, path/query
parameters, security, body); a request the spec refuses is refused by the fake with the status
the real API would use, and recorded. Every response a fake sends is validated too, so a fake
cannot drift from the real shapes either.

Vast's spec has known mistakes where the official CLI (vast-cli) and docs disagree with it.
The fake follows the CLI and accepts both forms:
- `order` in a search is typed with minItems/maxItems 2 (as if it were one [field, dir] pair);
  clients send a list of pairs with one entry, `[["dph_total", "asc"]]`. Both accepted.
- `env` on create is typed as a docker-flag string; the docs and the CLI send an object
  `{"KEY": "value"}`. Both accepted.
- Paths in the spec carry no trailing slash; the CLI sends one. Both accepted (the trailing
  slash is stripped before validation).
On the response side, the live `GET /api/v0/instances/{id}/` answers `{"instances": null}`
for an instance that is gone, which the spec's `Instance` object type does not allow; the
fake's answers are checked against a spec that also allows null there.

RunPod's errors are `application/problem+json`; openapi-core is told to read that as JSON so
the error bodies are checked against `ErrorResponse` too.
"""

from __future__ import annotations

import copy
import functools
import json
from pathlib import Path
from typing import Any

import yaml
from openapi_core import Config, OpenAPI
from openapi_core.datatypes import RequestParameters
from werkzeug.datastructures import Headers, ImmutableMultiDict
from werkzeug.wrappers import Request, Response

SPECS = Path(__file__).parent / "specs"
RUNPOD_SERVER = "https://api.runpod.io"
VAST_SERVER = "https://console.vast.ai"


@functools.cache
def runpod_api() -> OpenAPI:
    spec = json.loads((SPECS / "runpod-rest-v2.openapi.json").read_text(encoding="utf-8"))
    return OpenAPI.from_dict(spec, config=_config())


def _config() -> Config:
    return Config(
        spec_validator_cls=None,
        extra_media_type_deserializers={"application/problem+json": json.loads},
    )


def patch_vast_spec(spec: dict[str, Any]) -> dict[str, Any]:
    """The Vast spec with its known mistakes relaxed to also accept what the CLI sends."""
    spec = copy.deepcopy(spec)
    paths = spec["paths"]
    search = paths["/api/v0/bundles"]["post"]["requestBody"]["content"]["application/json"]
    order = search["schema"]["properties"]["order"]
    # CLI: a list of [field, direction] pairs, one or more; the spec's 2..2 bound is wrong.
    order.pop("minItems", None)
    order.pop("maxItems", None)
    order["minItems"] = 1
    order["items"] = {"type": "array", "items": {"type": "string"}, "minItems": 2, "maxItems": 2}
    create = paths["/api/v0/asks/{id}"]["put"]["requestBody"]["content"]["application/json"]
    env = create["schema"]["properties"]["env"]
    description = env.get("description", "")
    create["schema"]["properties"]["env"] = {
        # CLI/docs: an object of KEY: value; spec: a docker-flag string. Both accepted.
        "oneOf": [
            {"type": "string"},
            {"type": "object", "additionalProperties": {"type": "string"}},
        ],
        "description": description,
    }
    show = paths["/api/v0/instances/{id}"]["get"]["responses"]["200"]["content"]
    props = show["application/json"]["schema"]["properties"]
    # the live API answers {"instances": null} for a gone instance (the spec does not say so).
    props["instances"] = {"anyOf": [props["instances"], {"type": "null"}]}
    return spec


@functools.cache
def vast_api() -> OpenAPI:
    spec = yaml.safe_load((SPECS / "vast.openapi.yaml").read_text(encoding="utf-8"))
    return OpenAPI.from_dict(patch_vast_spec(spec), config=_config())


class _SpecRequest:
    """A werkzeug request seen through openapi-core's Request protocol, on the spec's server."""

    def __init__(self, request: Request, server: str, strip_trailing_slash: bool) -> None:
        path = request.path
        if strip_trailing_slash and len(path) > 1:
            path = path.rstrip("/")
        self.host_url = server
        self.path = path
        self.method = request.method.lower()
        data = request.get_data(cache=True)
        self.body: bytes | None = data or None
        self.content_type = request.content_type or ""
        self.parameters = RequestParameters(
            query=ImmutableMultiDict(list(request.args.items(multi=True))),
            header=Headers(request.headers),
            cookie=ImmutableMultiDict(list(request.cookies.items(multi=True))),
        )


class _SpecResponse:
    def __init__(self, response: Response) -> None:
        self.status_code = response.status_code
        self.content_type = response.content_type or ""
        self.headers = Headers(response.headers)
        self.data = response.get_data()


def _messages(exc: Exception) -> list[str]:
    """Short messages of a validation failure (the schema dumps are far too long)."""
    out: list[str] = []
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        for err in getattr(cur, "schema_errors", ()) or ():
            out.append(str(getattr(err, "message", err)).splitlines()[0])
        cur = cur.__cause__ or cur.__context__
    if not out:
        out.append(f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
    return out


class SpecChecker:
    """Validates requests and responses of one fake against one spec."""

    def __init__(self, api: OpenAPI, server: str, *, strip_trailing_slash: bool) -> None:
        self.api = api
        self.server = server
        self.strip = strip_trailing_slash

    def check_request(self, request: Request) -> tuple[str, list[str]] | None:
        """None when the spec accepts the request; else (kind, messages).

        kind is 'security' (answer 401), 'path' (404/405) or 'invalid' (400/422)."""
        try:
            self.api.validate_request(_SpecRequest(request, self.server, self.strip))
        except Exception as exc:
            name = type(exc).__name__
            if "Security" in name:
                return "security", _messages(exc)
            if "PathNotFound" in name or "OperationNotFound" in name or "ServerNotFound" in name:
                return "path", _messages(exc)
            return "invalid", _messages(exc)
        return None

    def check_response(self, request: Request, response: Response) -> list[str]:
        try:
            self.api.validate_response(
                _SpecRequest(request, self.server, self.strip), _SpecResponse(response)
            )
        except Exception as exc:
            if type(exc).__name__ == "ResponseNotFound":
                # An undocumented status (a 5xx, or a 429 on an endpoint whose spec lists none):
                # real servers send those too; there is no schema to hold them to.
                return []
            return _messages(exc)
        return []
