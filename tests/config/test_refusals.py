"""Bad input is refused with the path, the cause and the fix — and nothing else is accepted."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from autoscaler.config import ConfigError, load_config_text
from autoscaler.config.durations import format_duration, parse_duration
from autoscaler.config.provider_options import VastOptions

SEED = yaml.safe_load((Path(__file__).resolve().parents[2] / "examples" / "seed.yaml").read_text())
VAST = {"gpu-vast": VastOptions(kind="vast")}


def mutate(change) -> str:
    doc: dict[str, Any] = copy.deepcopy(SEED)
    change(doc)
    return yaml.safe_dump(doc)


def auto(doc):
    return doc["queues"]["inference"]["autoscale"]


def _set(key, value):
    return lambda d: auto(d).__setitem__(key, value)


# (id, change, expected path, expected cause fragment, expected fix fragment)
CASES = [
    (
        "unknown provider lists known ones",
        _set("provider", "gpu-vsat"),
        "queues.inference.autoscale.provider",
        "unknown provider 'gpu-vsat' (known: gpu-vast)",
        "autoscaler providers add gpu-vsat",
    ),
    (
        "duration in words",
        lambda d: auto(d)["scale_up"][2].__setitem__("max_latency", "5 minutes"),
        "queues.inference.autoscale.scale_up[2].max_latency",
        "'5 minutes' is not a duration",
        '"30s", "5m", "2h", "1d" or "1h30m"',
    ),
    (
        "max below min",
        _set("min_workers", 5),
        "queues.inference.autoscale",
        "max_workers (4) is below min_workers (5)",
        "raise max_workers or lower min_workers",
    ),
    (
        "cron croniter rejects",
        lambda d: auto(d)["scale_down"].append({"trigger": "schedule", "cron": "61 * * * *"}),
        "queues.inference.autoscale.scale_down[1].cron",
        "'61 * * * *' is not a valid cron expression: field 1 (minute)",
        "five fields",
    ),
    (
        "negative price",
        lambda d: auto(d)["instance"].__setitem__("max_price_per_hour", -0.6),
        "queues.inference.autoscale.instance.max_price_per_hour",
        "-0.6 is out of range",
        "more than 0",
    ),
    (
        "unknown scale-up trigger",
        lambda d: auto(d)["scale_up"].append({"trigger": "cpu"}),
        "queues.inference.autoscale.scale_up[3].trigger",
        "unknown trigger 'cpu'",
        "no_workers, queue_depth, latency, metric, schedule",
    ),
    (
        "unknown scale-down trigger",
        lambda d: auto(d)["scale_down"][0].__setitem__("trigger", "idel"),
        "queues.inference.autoscale.scale_down[0].trigger",
        "unknown trigger 'idel'",
        "idle, schedule",
    ),
    (
        "trigger name missing",
        lambda d: auto(d)["scale_up"].append({"threshold": 3}),
        "queues.inference.autoscale.scale_up[3]",
        "'trigger' is missing",
        "add 'trigger'",
    ),
    (
        "typo in a field",
        _set("max_worker", 4),
        "queues.inference.autoscale.max_worker",
        "unknown field 'max_worker'",
        "spelling",
    ),
    (
        "negative threshold",
        lambda d: auto(d)["scale_up"][1].__setitem__("threshold", -1),
        "queues.inference.autoscale.scale_up[1].threshold",
        "-1 is out of range",
        "at least 0",
    ),
    (
        "queue_depth without a number",
        lambda d: auto(d)["scale_up"][1].pop("threshold"),
        "queues.inference.autoscale.scale_up[1]",
        "exactly one of 'threshold'",
        "target_per_worker",
    ),
    (
        "unknown time zone",
        lambda d: auto(d)["scale_up"].append(
            {
                "trigger": "schedule",
                "cron": "0 8 * * *",
                "timezone": "Mars/Olympus",
                "workers": 1,
                "duration": "1h",
            }
        ),
        "queues.inference.autoscale.scale_up[3].timezone",
        "'Mars/Olympus' is not an IANA time zone",
        "Europe/Paris",
    ),
    (
        "schedule above max",
        lambda d: auto(d)["scale_up"].append(
            {"trigger": "schedule", "cron": "0 8 * * *", "workers": 9, "duration": "1h"}
        ),
        "queues.inference.autoscale",
        "a schedule asks for 9 workers but max_workers is 4",
        "raise max_workers",
    ),
    (
        "schedule without duration",
        lambda d: auto(d)["scale_up"].append(
            {"trigger": "schedule", "cron": "0 8 * * *", "workers": 1}
        ),
        "queues.inference.autoscale.scale_up[3].duration",
        "'duration' is required",
        "add 'duration'",
    ),
    (
        "zero idle timeout",
        lambda d: auto(d)["scale_down"][0].__setitem__("timeout", "0s"),
        "queues.inference.autoscale.scale_down[0].timeout",
        "0.0 is out of range",
        "more than 0",
    ),
    (
        "missing instance",
        lambda d: auto(d).pop("instance"),
        "queues.inference.autoscale.instance",
        "'instance' is required",
        "add 'instance'",
    ),
    (
        "negative min_workers",
        _set("min_workers", -1),
        "queues.inference.autoscale.min_workers",
        "-1 is out of range",
        "at least 0",
    ),
    (
        "unknown provider kind",
        lambda d: d.__setitem__("providers", {"x": {"kind": "aws"}}),
        "providers.x.kind",
        "unknown provider kind 'aws'",
        "runpod, vast, mock, local",
    ),
    (
        "vast reliability above 1",
        lambda d: d.__setitem__("providers", {"gpu-vast": {"kind": "vast", "min_reliability": 3}}),
        "providers.gpu-vast.min_reliability",
        "3 is out of range",
        "at most 1",
    ),
    (
        "backoff cap under base",
        lambda d: d.__setitem__("backoff", {"base": "5m", "cap": "1m"}),
        "backoff",
        "backoff cap is below its base",
        "raise 'cap'",
    ),
    (
        "metric without an address",
        lambda d: auto(d)["scale_up"].append({"trigger": "metric", "query": "up", "threshold": 1}),
        "queues.inference.autoscale.scale_up[3]",
        "metric needs the Prometheus address",
        "url_env",
    ),
    (
        "enabled not a boolean",
        _set("enabled", "sometimes"),
        "queues.inference.autoscale.enabled",
        "'sometimes'",
        "correct the value",
    ),
    (
        "runpod cloud type",
        lambda d: d.__setitem__("providers", {"rp": {"kind": "runpod", "cloud_type": "HOME"}}),
        "providers.rp.cloud_type",
        "'HOME' is not allowed",
        "'SECURE' or 'COMMUNITY'",
    ),
    (
        "no shard",
        lambda d: d.__setitem__("evaluation", {"shards": 0}),
        "evaluation.shards",
        "0 is out of range",
        "at least 1",
    ),
]


@pytest.mark.parametrize(
    ("change", "path", "cause", "fix"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_bad_input_is_refused_with_path_cause_and_fix(change, path, cause, fix):
    with pytest.raises(ConfigError) as exc:
        load_config_text(mutate(change), "seed.yaml", VAST)
    matching = [r for r in exc.value.refusals if r.path == path]
    assert matching, f"no refusal at {path}: {exc.value.render()}"
    assert any(cause in r.cause for r in matching), exc.value.render()
    assert any(fix in r.fix for r in matching), exc.value.render()


def test_every_problem_is_reported_at_once():
    def many(d):
        auto(d)["min_workers"] = -1
        auto(d)["scale_up"][1]["threshold"] = -5
        auto(d)["instance"]["max_price_per_hour"] = 0

    with pytest.raises(ConfigError) as exc:
        load_config_text(mutate(many), "seed.yaml", VAST)
    assert len(exc.value.refusals) == 3


@pytest.mark.parametrize("text", ["queues: [1, 2", "- just\n- a list\n", "queues:\n\tx: 1\n"])
def test_unparseable_or_wrong_shaped_documents(text):
    with pytest.raises(ConfigError) as exc:
        load_config_text(text)
    assert exc.value.refusals[0].fix


@given(st.integers(min_value=0, max_value=10_000_000))
def test_duration_round_trip(seconds):
    assert parse_duration(format_duration(seconds)) == seconds


@given(st.text(max_size=12))
def test_duration_parser_never_accepts_garbage_silently(text):
    try:
        value = parse_duration(text)
    except ValueError as exc:
        assert "not a duration" in str(exc) or "negative" in str(exc)
    else:
        assert value >= 0
        assert text.strip() != ""
