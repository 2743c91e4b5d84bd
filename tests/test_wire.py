"""The agent and the API speak one protocol, `autoscaler.wire`.

- Every route a machine calls (`/v1/worker/…`, `/v1/hand-made/…`) takes and answers the wire
  models, and its OpenAPI document says so: the schema it publishes for each body and answer
  is the wire model's, field for field.
- The agent's real requests — its own code paths (register, deployment, boot phases, the
  heartbeat before its worker starts and the later ones with jobs and held tasks, the drain,
  drained; a hand-made machine's beat and deployment) against the real API on loopback — each
  validates against the schema the route publishes and the model it declares, and each answer
  is one the agent reads. A field renamed on either side fails here; so does a doctored message
  (the checks can fail).
- The field names are pinned: agents already on machines speak them.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import requests
from fastapi.routing import APIRoute
from jsonschema import Draft202012Validator
from pydantic import BaseModel, ValidationError

from autoscaler import wire
from autoscaler.agent import run
from autoscaler.agent.run import Agent
from autoscaler.agent.server_api import AgentConfig, AgentError
from autoscaler.api.routers import hand_made, worker
from autoscaler.lifecycle import InstanceState as S
from tests.agent.agentkit import serve
from tests.api.apikit import World, make_world

ROUTES: dict[tuple[str, str], tuple[type[wire.RequestBody] | None, type[wire.Answer]]] = {
    ("POST", "/v1/worker/{launch_id}/register"): (wire.Register, wire.Registered),
    ("GET", "/v1/worker/{launch_id}/deployment"): (None, wire.DeploymentAnswer),
    ("POST", "/v1/worker/{launch_id}/phases"): (wire.BootPhases, wire.PhasesKept),
    ("POST", "/v1/worker/{launch_id}/heartbeat"): (wire.Heartbeat, wire.HeartbeatAnswer),
    ("POST", "/v1/worker/{launch_id}/drained"): (None, wire.Drained),
    ("POST", "/v1/hand-made/heartbeat"): (wire.HandMadeBeat, wire.HeartbeatAnswer),
    ("GET", "/v1/hand-made/deployment"): (None, wire.DeploymentAnswer),
}
"""Every route a machine calls: the wire model of its body (None: it takes none) and of its
answer."""

FIELDS: dict[type[BaseModel], list[str]] = {
    wire.Register: ["worker_name", "hostname"],
    wire.Registered: ["launch_id", "queue", "heartbeat_interval"],
    wire.Heartbeat: [
        "state",
        "running_tasks",
        "last_task_at",
        "gpu_utilisation",
        "detail",
        "jobs",
        "tasks",
        "acks_late",
    ],
    wire.JobReport: ["id", "queue", "published_at", "started_at", "finished_at"],
    wire.HeartbeatAnswer: ["drain", "state"],
    wire.BootPhases: [
        "started",
        "registered",
        "code_fetched",
        "requirements_installed",
        "worker_up",
        "first_job",
    ],
    wire.PhasesKept: ["boot", "resume", "recorded"],
    wire.Drained: ["state"],
    wire.HandMadeBeat: ["name", "queues", "state", "running_tasks", "jobs"],
    wire.DeploymentAnswer: [
        "queue",
        "git_url",
        "git_ref",
        "git_token",
        "startup_cmd",
        "env",
        "broker_url",
        "broker_note",
    ],
}
"""The protocol as agents already running on machines speak it: renaming a field breaks them,
so it is a deliberate edit here too."""


def _machine_routes() -> dict[tuple[str, str], APIRoute]:
    out = {}
    for router in (worker.router, hand_made.router):
        for route in router.routes:
            assert isinstance(route, APIRoute)
            for method in route.methods:
                out[(method, route.path)] = route
    return out


def _declared_body(route: APIRoute) -> type[BaseModel] | None:
    """The model FastAPI validates the route's body with (None: the route takes no body)."""
    field = route.body_field
    if field is None:
        return None
    model = field.field_info.annotation
    assert isinstance(model, type) and issubclass(model, BaseModel), model
    return model


@pytest.fixture(scope="module")
def openapi() -> dict[str, Any]:
    from autoscaler.api.app import create_app

    return create_app().openapi()


def _schema(openapi: dict[str, Any], ref: dict[str, Any]) -> Draft202012Validator:
    """A validator for a schema of the OpenAPI document (its `$ref`s resolved in it)."""
    return Draft202012Validator({**ref, "components": openapi["components"]})


def _plain(schema: Any) -> Any:
    """A schema as the OpenAPI document writes it: FastAPI leaves out a `default` of None."""
    if isinstance(schema, dict):
        return {k: _plain(v) for k, v in schema.items() if not (k == "default" and v is None)}
    if isinstance(schema, list):
        return [_plain(v) for v in schema]
    return schema


def _ref_name(schema: dict[str, Any]) -> str:
    ref = schema["$ref"]
    assert ref.startswith("#/components/schemas/"), ref
    return str(ref.rsplit("/", 1)[1])


def _request_schema(openapi: dict[str, Any], method: str, path: str) -> dict[str, Any] | None:
    operation = openapi["paths"][path][method.lower()]
    body = operation.get("requestBody")
    return None if body is None else body["content"]["application/json"]["schema"]


def _answer_schema(openapi: dict[str, Any], method: str, path: str) -> dict[str, Any]:
    operation = openapi["paths"][path][method.lower()]
    return operation["responses"]["200"]["content"]["application/json"]["schema"]


# ---------------------------------------------------------------------------------------------
# the routes take and answer the wire models, and publish them


def test_every_machine_route_takes_and_answers_the_wire_models():
    routes = _machine_routes()
    assert set(routes) == set(ROUTES), "a machine route without its wire models in ROUTES"
    for key, route in routes.items():
        body, answer = ROUTES[key]
        assert _declared_body(route) is body, key
        assert route.response_model is answer, key


def test_the_openapi_document_publishes_the_wire_models_field_for_field(openapi):
    published = {
        (method.upper(), path)
        for path, operations in openapi["paths"].items()
        if path.startswith(("/v1/worker/", "/v1/hand-made/"))
        for method in operations
    }
    assert published == set(ROUTES)
    components = openapi["components"]["schemas"]
    template = "#/components/schemas/{model}"
    for (method, path), (body, answer) in ROUTES.items():
        request = _request_schema(openapi, method, path)
        if body is None:
            assert request is None, (method, path)
        else:
            assert request is not None and _ref_name(request) == body.__name__, (method, path)
            mine = body.model_json_schema(ref_template=template, mode="validation")
            theirs = components[body.__name__]
            for key in ("properties", "required", "additionalProperties"):
                assert theirs.get(key) == _plain(mine.get(key)), (method, path, key)
            assert theirs["additionalProperties"] is False  # unknown fields refused
        said = _answer_schema(openapi, method, path)
        assert _ref_name(said) == answer.__name__, (method, path)
        mine = answer.model_json_schema(ref_template=template, mode="serialization")
        theirs = components[answer.__name__]
        assert theirs["properties"] == _plain(mine["properties"]), (method, path)
        assert theirs.get("required") == mine.get("required"), (method, path)
    # and the job reports the heartbeats carry
    job = wire.JobReport.model_json_schema(ref_template=template)
    assert components["JobReport"]["properties"] == _plain(job["properties"])


def test_the_field_names_are_the_ones_agents_on_machines_speak():
    for model, names in FIELDS.items():
        assert list(model.model_fields) == names, model.__name__
    assert {m for pair in ROUTES.values() for m in pair if m is not None} <= set(FIELDS)


# ---------------------------------------------------------------------------------------------
# the agent's real requests against the real API


@dataclass
class Exchange:
    method: str
    path: str
    body: bytes | None
    status: int
    answer: Any


def _record(agent: Agent, log: list[Exchange]) -> None:
    """Every request the agent sends and the answer it gets, as they cross the wire."""

    def hook(r: requests.Response, *args: Any, **kwargs: Any) -> None:
        body = r.request.body
        log.append(
            Exchange(
                method=str(r.request.method),
                path=urlsplit(str(r.request.url)).path,
                body=body.encode() if isinstance(body, str) else body,
                status=r.status_code,
                answer=r.json() if r.content else None,
            )
        )

    agent.api.http.hooks["response"].append(hook)


def _route_of(exchange: Exchange) -> tuple[tuple[str, str], APIRoute]:
    for key, route in _machine_routes().items():
        if key[0] == exchange.method and route.path_regex.match(exchange.path):
            return key, route
    raise AssertionError(f"the agent called {exchange.method} {exchange.path}: no machine route")


def problems(exchange: Exchange, openapi: dict[str, Any]) -> list[str]:
    """What is wrong with one exchange: its body against the schema the route publishes and the
    model it declares, its answer against the schema published and the model the agent reads."""
    key, route = _route_of(exchange)
    method, path = key
    out: list[str] = []
    declared = _declared_body(route)
    published = _request_schema(openapi, method, path)
    if declared is None or published is None:
        if exchange.body:
            out.append(f"{key}: a body sent to a route that takes none")
    else:
        doc = json.loads(exchange.body or b"null")
        out += [
            f"{key} body (OpenAPI): {e.message}"
            for e in _schema(openapi, published).iter_errors(doc)
        ]
        try:
            declared.model_validate(doc)
        except ValidationError as exc:
            out.append(f"{key} body ({declared.__name__}): {exc}")
    if exchange.status != 200:
        out.append(f"{key}: answered {exchange.status}")
        return out
    said = _answer_schema(openapi, method, path)
    out += [
        f"{key} answer (OpenAPI): {e.message}"
        for e in _schema(openapi, said).iter_errors(exchange.answer)
    ]
    try:
        ROUTES[key][1].model_validate(exchange.answer)
    except ValidationError as exc:
        out.append(f"{key} answer ({ROUTES[key][1].__name__}): {exc}")
    return out


@pytest.fixture
def world(sqlite_url, tmp_path) -> Iterator[World]:
    w = make_world(sqlite_url, tmp_path)
    try:
        yield w
    finally:
        w.close()


def _status(agent: Agent, **doc: Any) -> None:
    Path(agent.status_file).write_text(json.dumps(doc))


def _agent(cfg: AgentConfig, work: Path) -> Agent:
    work.mkdir(parents=True, exist_ok=True)
    cfg.workdir = work
    return Agent(cfg)


def _conversation(world: World, api: str, tmp_path: Path, monkeypatch) -> list[Exchange]:
    """A rented machine's agent from register to drained, and a hand-made one's beats, each
    message built by the agent's own code."""
    monkeypatch.setattr(run, "gpu_utilisation", lambda: 37.5)
    log: list[Exchange] = []
    now = time.time()
    job = {"id": "j1", "queue": "q1", "published_at": now - 9, "started_at": now - 8}
    rented = _agent(
        AgentConfig(api_url=api, token=world.tokens["m1"], launch_id="m1", queue="q1"),
        tmp_path / "rented",
    )
    _record(rented, log)
    rented.phase("started")
    assert rented.register().queue == "q1"
    rented.phase("registered")
    rented.report_phases()
    assert rented.deployment().startup_cmd == "celery -A tasks worker"
    rented.phase("code_fetched")
    rented.phase("requirements_installed")
    assert rented.may_start("cold start: checkout cloned") is True
    rented.phase("worker_up")
    rented.report_phases()
    _status(
        rented,
        running=1,
        last_task_at=now - 5,
        jobs=[
            job | {"finished_at": now - 5},
            {"id": "j2", "started_at": now - 4, "finished_at": now},
        ],
        tasks=["j3"],
        acks_late=True,
    )
    assert rented.beat("auto").drain is False
    rented.report_phases()  # first_job
    world.set_state("m1", S.DRAINING)
    _status(rented, running=0, last_task_at=now)
    assert rented.beat("draining").drain is True
    rented.report_drained()

    hand = _agent(
        AgentConfig(api_url=api, token=world.enrolment, name="desk-1", queue="q1"),
        tmp_path / "hand",
    )
    _record(hand, log)
    hand.beat("starting")
    assert hand.deployment().queue == "q1"
    _status(hand, running=1, jobs=[job | {"id": "h1", "finished_at": now}])
    assert hand.beat("auto") == wire.HeartbeatAnswer(drain=False, state="hand-made")
    return log


def test_every_message_the_agent_sends_is_one_the_route_declares(
    world, tmp_path, monkeypatch, openapi
):
    with serve(world) as api:
        log = _conversation(world, api, tmp_path, monkeypatch)
    assert [p for e in log for p in problems(e, openapi)] == []
    # every machine route was spoken, bodies with what the API reads
    assert {_route_of(e)[0] for e in log} == set(ROUTES)
    beats = [json.loads(e.body or b"") for e in log if e.path == "/v1/worker/m1/heartbeat"]
    first, full = beats[0], beats[1]
    assert first["detail"] == "cold start: checkout cloned" and first["state"] == "idle", first
    assert set(full) == set(FIELDS[wire.Heartbeat]) - {"detail"}, full  # no detail: none said
    assert [j["id"] for j in full["jobs"]] == ["j1", "j2"] and full["tasks"] == ["j3"]
    assert world.row("m1").state == S.TERMINATING  # the drained report was taken


def test_a_renamed_field_on_either_side_fails_the_contract(world, tmp_path, monkeypatch, openapi):
    """The checks can fail: a body with a field renamed is refused by the route's schema and
    model (and by the real API, naming the field); an answer with one renamed is one the agent
    cannot read (an AgentError naming it), while a field it does not know is ignored."""
    with serve(world) as api:
        log = _conversation(world, api, tmp_path, monkeypatch)
        beat = next(e for e in log if e.path == "/v1/worker/m1/heartbeat")
        doc = json.loads(beat.body or b"")
        doc["running"] = doc.pop("running_tasks")
        renamed = Exchange(beat.method, beat.path, json.dumps(doc).encode(), 200, beat.answer)
        found = problems(renamed, openapi)
        assert any("OpenAPI" in p and "running" in p for p in found), found
        assert any("(Heartbeat)" in p and "running" in p for p in found), found
        refused = requests.post(
            f"{api}/v1/worker/m2/heartbeat",
            json=doc,
            headers=world.h(world.tokens["m2"]),
            timeout=10,
        )
        assert refused.status_code == 422 and "running" in refused.text
        answer = Exchange("GET", "/v1/hand-made/deployment", None, 200, {"queue": "q1"})
        assert any("git_url" in p for p in problems(answer, openapi))

        agent = _agent(
            AgentConfig(api_url=api, token=world.tokens["m2"], launch_id="m2", queue="q1"),
            tmp_path / "m2",
        )

        def answered(change: dict[str, Any]) -> Any:
            def hook(r: requests.Response, *args: Any, **kwargs: Any) -> requests.Response:
                doc = r.json()
                for old, new in change.items():
                    doc[new] = doc.pop(old) if old in doc else True
                r._content = json.dumps(doc).encode()
                return r

            return hook

        agent.api.http.hooks["response"] = [answered({"drain": "drained"})]
        with pytest.raises(AgentError, match=r"not a HeartbeatAnswer.*drain"):
            agent.beat("auto")
        agent.api.http.hooks["response"] = [answered({"a newer server's word": "extra"})]
        assert agent.beat("auto") == wire.HeartbeatAnswer(drain=False, state="ready")


def test_an_answer_the_agent_cannot_read_names_the_field_never_a_secret():
    secret = "postgres://machine:s3cret-password@broker/0"
    doc = {"queue": "q1", "git_url": 7, "git_ref": None, "startup_cmd": None, "env": {}}
    try:
        wire.DeploymentAnswer.model_validate(doc | {"broker_url": secret})
    except ValidationError as exc:
        told = run.said(exc)
    else:
        raise AssertionError("a deployment answer without broker_note was read")
    assert "git_url" in told and "broker_note" in told and "s3cret" not in told, told
