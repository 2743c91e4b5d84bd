"""The API fuzzed from its own OpenAPI document (schemathesis): whatever comes in, no 5xx, no
stack trace, no secret (a key, a token, a broker password) in any answer. Each operation is
called with the key its group needs (so the fuzz reaches the handlers, not only the auth check).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error

from autoscaler.api.app import create_app
from tests.api.apikit import World, make_world

FUZZ_EXAMPLES = 40
CALLS: Counter[tuple[str, str, int]] = Counter()


@pytest.fixture
def fuzz_world(sqlite_url, tmp_path) -> Iterator[World]:
    w = make_world(sqlite_url, tmp_path)
    try:
        yield w
    finally:
        w.close()


schema = schemathesis.openapi.from_dict(create_app().openapi())


def key_for(world: World, path: str) -> str:
    if path.startswith("/v1/worker"):
        return world.tokens["m1"]
    if path.startswith("/v1/hand-made"):
        return world.enrolment
    return world.admin


@schema.parametrize()
@settings(
    max_examples=FUZZ_EXAMPLES,
    deadline=None,
    suppress_health_check=list(HealthCheck),
)
def test_fuzz_api_no_5xx_no_secret(case, fuzz_world):
    world = fuzz_world
    # half the time the machine's own id: the handlers, not only the 403
    if (
        case.path.startswith("/v1/worker")
        and case.path_parameters
        and hash(str(case.body)) % 2 == 0
    ):
        case.path_parameters["launch_id"] = "m1"
    headers = {"Authorization": f"Bearer {key_for(world, case.path)}"}
    kwargs = case.as_transport_kwargs(headers=headers)
    kwargs.pop("base_url", None)
    kwargs.pop("cookies", None)  # the API reads none
    if isinstance(kwargs.get("data"), bytes | str):
        kwargs["content"] = kwargs.pop("data")
    response = world.client.request(**kwargs)
    CALLS[(case.method, case.path, response.status_code // 100)] += 1
    case.validate_response(response, checks=[not_a_server_error])
    text = response.text
    assert "Traceback" not in text
    for secret in (world.admin, world.enrolment, *world.tokens.values()):
        assert secret not in text


def test_fuzz_reached_every_operation_and_the_handlers():
    """Run after the fuzz (same module, in order): every operation was called, and most of
    the worker and admin calls got past the key check (2xx or 4xx other than 401)."""
    if not CALLS:
        pytest.skip("run with the fuzz test")
    ops = {(m, p) for m, p, _ in CALLS}
    documented = {(op.ok().method.upper(), op.ok().path) for op in schema.get_all_operations()}
    assert documented <= ops, documented - ops
    assert not any(c == 5 for _, _, c in CALLS), CALLS
    ok = sum(n for (_, _, c), n in CALLS.items() if c == 2)
    print(
        f"fuzz: {sum(CALLS.values())} calls: {len(documented)} documented operations and "
        f"{len(ops - documented)} undocumented method/path pairs, {ok} 2xx, 0 5xx"
    )
    assert ok > 0
