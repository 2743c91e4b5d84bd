"""Typos are named with the field that was meant, unknown keys first; bad crons name the field."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from autoscaler.config import ConfigError, load_config_text
from autoscaler.config.provider_options import VastOptions

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
SEED = yaml.safe_load((EXAMPLES / "seed.yaml").read_text())
VAST = {"gpu-vast": VastOptions(kind="vast")}


def refused(text: str) -> ConfigError:
    with pytest.raises(ConfigError) as exc:
        load_config_text(text, "c.yaml", VAST)
    return exc.value


def seed_with(change) -> str:
    doc: dict[str, Any] = copy.deepcopy(SEED)
    change(doc)
    return yaml.safe_dump(doc)


def auto(doc: dict[str, Any]) -> dict[str, Any]:
    return doc["queues"]["inference"]["autoscale"]


def test_an_unknown_key_is_reported_before_the_missing_one_it_misspells():
    def typo(d):
        auto(d)["max_worker"] = auto(d).pop("max_workers")

    error = refused(seed_with(typo))
    first = error.refusals[0]
    assert first.path == "queues.inference.autoscale.max_worker"
    assert "unknown field 'max_worker'" in first.cause
    assert "did you mean 'max_workers'?" in first.fix
    assert any(r.path == "queues.inference.autoscale.max_workers" for r in error.refusals[1:])


@pytest.mark.parametrize(
    ("change", "path", "suggestion"),
    [
        (lambda d: d.__setitem__("queue", d.pop("queues")), "queue", "queues"),
        (
            lambda d: auto(d)["scale_up"][1].__setitem__(
                "treshold", auto(d)["scale_up"][1].pop("threshold")
            ),
            "queues.inference.autoscale.scale_up[1].treshold",
            "threshold",
        ),
        (
            lambda d: auto(d)["instance"].__setitem__("max_price_per_hr", 1),
            "queues.inference.autoscale.instance.max_price_per_hr",
            "max_price_per_hour",
        ),
        (
            lambda d: d.__setitem__("providers", {"gpu-vast": {"kind": "vast", "country": ["US"]}}),
            "providers.gpu-vast.country",
            "countries",
        ),
        (
            lambda d: d["queues"]["inference"].__setitem__("metrics", {"url_evn": "X"}),
            "queues.inference.metrics.url_evn",
            "url_env",
        ),
        (
            lambda d: auto(d)["scale_down"][0].__setitem__("timout", "5m"),
            "queues.inference.autoscale.scale_down[0].timout",
            "timeout",
        ),
    ],
    ids=["top level", "trigger", "instance", "provider", "metrics", "scale-down trigger"],
)
def test_a_misspelled_key_gets_did_you_mean_from_the_fields_at_its_path(change, path, suggestion):
    error = refused(seed_with(change))
    first = error.refusals[0]
    assert first.path == path, error.render()
    assert f"did you mean '{suggestion}'?" in first.fix, error.render()


def test_an_unknown_key_with_no_close_field_lists_the_known_ones():
    error = refused(seed_with(lambda d: auto(d)["instance"].__setitem__("colour", "red")))
    first = error.refusals[0]
    assert "did you mean" not in first.fix
    assert "max_price_per_hour" in first.fix and "gpu_count" in first.fix


def test_a_misspelled_trigger_name_gets_did_you_mean():
    error = refused(seed_with(lambda d: auto(d)["scale_down"][0].__setitem__("trigger", "idel")))
    assert "did you mean 'idle'?" in error.refusals[0].fix


# ------------------------------------------------------------------ crons


@pytest.mark.parametrize(
    ("cron", "cause"),
    [
        ("0 25 * * *", "field 2 (hour) '25' is out of range 0-23"),
        ("61 * * * *", "field 1 (minute) '61' is out of range 0-59"),
        ("0 8 0 * *", "field 3 (day-of-month) '0' is out of range 1-31"),
        ("0 8 * 13 *", "field 4 (month) '13' is out of range 1-12"),
        ("0 8 * * 8", "field 5 (day-of-week) '8' is out of range 0-7"),
        ("5-70 8 * * *", "field 1 (minute) '5-70': 70 is out of range 0-59"),
        ("0 8 * * mon-fry", "field 5 (day-of-week) 'mon-fry' is not valid"),
        ("0 8 * *", "has 4 fields, not 5"),
        ("0 0 8 * * *", "has 6 fields, not 5"),
    ],
)
def test_a_bad_cron_names_the_wrong_field_and_its_range(cron, cause):
    def add(d):
        auto(d)["scale_down"].append({"trigger": "schedule", "cron": cron})

    error = refused(seed_with(add))
    [refusal] = [r for r in error.refusals if r.path.endswith("scale_down[1].cron")]
    assert cause in refusal.cause, error.render()
    assert "minute hour day-of-month month day-of-week" in refusal.fix
