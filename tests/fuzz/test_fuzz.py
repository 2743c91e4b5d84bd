"""Our fuzz suite, fast enough for CI: hypothesis over the config grammar (and hostile raw
YAML and bytes), the trace format and the CLI. Every case must end in an acceptance or a
clear refusal; `python benchmarks/fuzz.py` runs the same generators for ≥ 10⁴ cases."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from autoscaler.config import ConfigError, load_config_text
from tests.fuzz.clicases import CliWorld, cli_cases
from tests.fuzz.files import config_bytes, trace_bytes
from tests.fuzz.harness import run_config, run_trace
from tests.fuzz.values import GOOD_URLS, HOSTILE_URLS

FAST = settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    database=None,
)
WORKDIR = Path(tempfile.mkdtemp(prefix="asg-fuzz-tests-"))


@FAST
@given(
    config_bytes(),
    st.sampled_from(GOOD_URLS + HOSTILE_URLS),
    st.sampled_from(["redis://127.0.0.1:6379/0", "redis://h:abc/0", "sqla+sqlite:///b.db", "x"]),
)
def test_config_files_are_accepted_or_refused(data, watched, broker):
    outcome, detail = run_config(
        data, WORKDIR, {"AUTOSCALER_WATCH_BROKER_URL": watched}, broker=broker
    )
    assert outcome in ("accepted", "refused"), detail


@FAST
@given(trace_bytes())
def test_traces_are_loaded_or_refused(case):
    suffix, data = case
    outcome, detail = run_trace(suffix, data, WORKDIR)
    assert outcome in ("accepted", "refused"), detail


@pytest.fixture(scope="module")
def world():
    return CliWorld()


@pytest.mark.timeout(600)
@settings(
    max_examples=120,
    deadline=None,
    suppress_health_check=list(HealthCheck),
    database=None,
)
@given(data=st.data())
def test_cli_invocations_end_in_a_message_and_an_exit_code(world, data):
    args, stdin, env = data.draw(cli_cases(world))
    outcome, detail = world.run(args, stdin, env)
    assert outcome in ("accepted", "refused"), (args[:3], env, detail)


@pytest.mark.timeout(600)
@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck), database=None)
@given(data=st.data())
def test_cli_on_postgresql(pg_url, data):
    # the store that refuses what SQLite stores (names over 100 characters, NUL bytes)
    world = _pg_world(pg_url)
    args, stdin, env = data.draw(cli_cases(world))
    if args[:1] == ["simulate"]:
        return  # needs no store: covered above
    outcome, detail = world.run(args, stdin, env)
    assert outcome in ("accepted", "refused"), (args[:3], env, detail)


_PG_WORLDS: dict[str, CliWorld] = {}


def _pg_world(url: str) -> CliWorld:
    if url not in _PG_WORLDS:
        _PG_WORLDS.clear()
        _PG_WORLDS[url] = CliWorld(url)
    return _PG_WORLDS[url]


UNICODE_CASES = [
    # (where, YAML value, the refusal's path)
    ("url", "'redis://h/²'", "queues.q.metrics.url"),  # once a ValueError out of validate
    ("url", "'redis://h/٣'", "queues.q.metrics.url"),  # redis-py would read database 3
    ("url", "'redis://h:６３７９/0'", "queues.q.metrics.url"),
    ("url", "'redis://h/0?db=۳'", "queues.q.metrics.url"),
    ("url", "'redis://h/1\u200b'", "queues.q.metrics.url"),
    ("count", "'٣'", "queues.q.autoscale.max_workers"),
    ("count", "'3\u00a0'", "queues.q.autoscale.max_workers"),  # pydantic would strip it
    ("count", "'３'", "queues.q.autoscale.max_workers"),
    ("duration", "'5m\u00a0'", "queues.q.autoscale.scale_down[0].timeout"),
    ("duration", "'３0s'", "queues.q.autoscale.scale_down[0].timeout"),
    ("duration", "'1\u2060h'", "queues.q.autoscale.scale_down[0].timeout"),
    ("duration", "'²'", "queues.q.autoscale.scale_down[0].timeout"),
]


@pytest.mark.parametrize(("where", "value", "path"), UNICODE_CASES)
def test_numbers_written_outside_ascii_are_refused_with_path_cause_and_fix(where, value, path):
    """Another script's digit or a no-break / zero-width blank at a numeric position of a URL,
    a count or a duration: a refusal naming the field (never a crash, never another number)."""
    fields = {"url": "'redis://h:6379/0'", "count": "3", "duration": "'5m'"}
    fields[where] = value
    text = (
        "providers: {gpu: {kind: mock}}\n"
        "queues:\n  q:\n"
        f"    metrics: {{url: {fields['url']}}}\n"
        "    autoscale:\n      provider: gpu\n"
        f"      max_workers: {fields['count']}\n"
        f"      scale_down: [{{trigger: idle, timeout: {fields['duration']}}}]\n"
        "      instance: {gpu: RTX 4090, max_price_per_hour: 0.6}\n"
    )
    outcome, detail = run_config(text.encode(), WORKDIR)
    assert outcome == "refused", detail
    with pytest.raises(ConfigError) as info:
        load_config_text(text, "c.yaml", {})
    (refusal,) = info.value.refusals
    assert refusal.path == path, refusal
    said = f"{refusal.cause} {refusal.fix}"
    assert "ASCII" in said or "control characters" in said, refusal
