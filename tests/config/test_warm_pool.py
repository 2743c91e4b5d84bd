"""`autoscale.warm_pool`: validate refuses a pool that cannot work (with path, cause and fix,
and nothing applied), and the dry run says what a full pool costs per hour."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
import yaml
from click.testing import CliRunner
from sqlalchemy import text

from autoscaler.cli import main
from autoscaler.config import ConfigError, load_config_text
from autoscaler.config.loader import known_providers
from autoscaler.config.provider_options import MockOptions, ProviderConfig, RunPodOptions
from autoscaler.config.summary import describe
from autoscaler.store.db import make_engine
from autoscaler.vault import generate_key

NOW = datetime(2025, 3, 3, 12, 0, tzinfo=UTC)

RUNPOD: dict[str, Any] = {"kind": "runpod", "api_key_env": "RUNPOD_API_KEY"}


def _doc(
    provider: dict[str, Any] | None,
    pool: dict[str, Any] | None = None,
    max_workers: int = 2,
    **autoscale: Any,
) -> str:
    auto: dict[str, Any] = {
        "provider": "p",
        "max_workers": max_workers,
        "scale_up": [{"trigger": "no_workers"}],
        "scale_down": [{"trigger": "idle", "timeout": "10m"}],
        "instance": {"gpu": "RTX 4090", "max_price_per_hour": 0.6},
        **autoscale,
    }
    if pool is not None:
        auto["warm_pool"] = pool
    doc: dict[str, Any] = {"queues": {"q": {"autoscale": auto}}}
    if provider is not None:
        doc["providers"] = {"p": provider}
    return yaml.safe_dump(doc)


def _refused(document: str, registered: dict[str, ProviderConfig] | None = None) -> ConfigError:
    with pytest.raises(ConfigError) as exc:
        load_config_text(document, "c.yaml", registered or {}, runnable=True)
    return exc.value


def _dry_run(document: str, registered: dict[str, ProviderConfig] | None = None) -> str:
    config = load_config_text(document, "c.yaml", registered or {}, runnable=True)
    return describe(config, known_providers(config, registered or {}), NOW)


# --------------------------------------------------------------------------- refusals


def test_a_pool_above_max_workers_is_refused_by_the_schema():
    [refusal] = _refused(_doc({"kind": "mock"}, {"size": 3}, max_workers=2)).refusals
    assert refusal.path == "queues.q.autoscale"
    assert refusal.cause.startswith("warm_pool.size (3) is above max_workers (2)")
    assert refusal.fix == "lower warm_pool.size or raise max_workers"
    load_config_text(_doc({"kind": "mock"}, {"size": 2}, max_workers=2), runnable=True)


def test_a_pool_on_a_kind_that_cannot_stop_is_refused(monkeypatch):
    # Every kind can stop today: the check must hold for the next one that cannot.
    document = _doc({"kind": "mock"}, {"size": 1})
    load_config_text(document, "c.yaml", {}, runnable=True)  # accepted while mock can stop
    monkeypatch.setattr(MockOptions, "can_stop", False)
    [refusal] = _refused(document).refusals
    assert refusal.path == "queues.q.autoscale.warm_pool.size"
    assert "needs machines that can be stopped with their disk kept" in refusal.cause
    assert "provider 'p' is of kind 'mock', which cannot stop one" in refusal.cause
    assert refusal.fix.startswith("set warm_pool.size to 0 (or remove warm_pool)")
    assert "(runpod, vast, local, container)" in refusal.fix  # mock no longer listed
    assert "known ones that can" not in refusal.fix  # none is known here
    # a registered provider that can stop is offered by name
    other = {"gpu-runpod": RunPodOptions(kind="runpod", volume_gb=20)}
    [named] = _refused(document, other).refusals
    assert named.fix.endswith("; known ones that can: gpu-runpod")
    # no pool, no refusal
    load_config_text(_doc({"kind": "mock"}, {"size": 0}), "c.yaml", {}, runnable=True)
    load_config_text(_doc({"kind": "mock"}), "c.yaml", {}, runnable=True)


def test_a_pool_on_runpod_without_a_volume_is_refused():
    [refusal] = _refused(_doc(RUNPOD, {"size": 2})).refusals
    assert refusal.path == "queues.q.autoscale.warm_pool.size"
    assert "RunPod provider 'p' gives its pods no volume disk (volume_gb: 0)" in refusal.cause
    assert "the container disk is erased at stop" in refusal.cause
    assert "the agent's work folder" in refusal.cause and "needs a volume" in refusal.cause
    assert refusal.fix == (
        "set providers.p.volume_gb to the GB that folder needs (e.g. 20); "
        "or set warm_pool.size to 0"
    )
    load_config_text(_doc({**RUNPOD, "volume_gb": 20}, {"size": 2}), runnable=True)
    load_config_text(_doc(RUNPOD, {"size": 0}), runnable=True)  # no pool: no volume needed
    load_config_text(_doc(RUNPOD), runnable=True)


def test_a_registered_runpod_without_a_volume_is_refused_with_the_fix_that_applies():
    registered: dict[str, ProviderConfig] = {"p": RunPodOptions(kind="runpod")}
    [refusal] = _refused(_doc(None, {"size": 1}), registered).refusals
    assert refusal.path == "queues.q.autoscale.warm_pool.size"
    assert "providers.p.volume_gb" not in refusal.fix  # not in the file: nothing to set there
    assert "declare it under 'providers:' with volume_gb" in refusal.fix
    assert "'autoscaler providers remove p'" in refusal.fix
    assert "'--option volume_gb=20'" in refusal.fix
    # the file's declaration wins over the registered one
    load_config_text(
        _doc({**RUNPOD, "volume_gb": 10}, {"size": 1}), "c.yaml", registered, runnable=True
    )


def test_every_queue_with_a_pool_is_refused_at_once():
    doc = yaml.safe_load(_doc(RUNPOD, {"size": 1}))
    doc["queues"]["r"] = doc["queues"]["q"]
    refusals = _refused(yaml.safe_dump(doc)).refusals
    assert [r.path for r in refusals] == [
        "queues.q.autoscale.warm_pool.size",
        "queues.r.autoscale.warm_pool.size",
    ]


def test_an_unknown_provider_is_refused_once_not_twice():
    [refusal] = _refused(_doc(None, {"size": 1})).refusals
    assert refusal.path == "queues.q.autoscale.provider"


def test_a_resume_timeout_shorter_than_the_poll_is_refused():
    document = _doc({"kind": "mock"}, {"size": 1, "resume_timeout": "20s"}, poll_interval="1m")
    [refusal] = _refused(document).refusals
    assert refusal.path == "queues.q.autoscale.warm_pool.resume_timeout"
    assert "20s is shorter than the queue's poll interval (1m)" in refusal.cause
    assert refusal.fix == "make resume_timeout at least 1m, or poll more often"
    load_config_text(document.replace("20s", "1m"), runnable=True)
    # without a pool, its timeout is never used
    load_config_text(
        _doc({"kind": "mock"}, {"resume_timeout": "20s"}, poll_interval="1m"), runnable=True
    )


@pytest.fixture
def cli(db_url, tmp_path):
    env = {
        "AUTOSCALER_HOME": str(tmp_path / "home"),
        "AUTOSCALER_DATABASE_URL": db_url,
        "AUTOSCALER_VAULT_KEY": generate_key(),
        "AUTOSCALER_BROKER_URL": "redis://127.0.0.1:6379/15",
    }
    runner = CliRunner()

    def run(*args: str):
        return runner.invoke(main, list(args), env=env)

    assert run("db", "upgrade").exit_code == 0
    return run


@pytest.mark.parametrize(
    ("pool", "provider", "shown"),
    [
        (
            {"size": 2},
            RUNPOD,
            "queues.q.autoscale.warm_pool.size: RunPod provider 'p' gives its pods no volume "
            "disk (volume_gb: 0): the container disk is erased at stop",
        ),
        (
            {"size": 3},
            {**RUNPOD, "volume_gb": 20},
            "queues.q.autoscale: warm_pool.size (3) is above max_workers (2): the pool only "
            "ever holds machines the queue had running — fix: lower warm_pool.size or raise "
            "max_workers",
        ),
    ],
    ids=["runpod without a volume", "pool above max_workers"],
)
def test_validate_and_apply_refuse_the_whole_config_and_record_nothing(
    cli, db_url, tmp_path, pool, provider, shown
):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(_doc(provider, pool))
    for command in ("validate", "apply"):
        result = cli(command, str(cfg))
        assert result.exit_code == 2, result.output
        assert "c.yaml is refused (1 problem(s)):" in result.output
        assert shown in " ".join(result.output.split()), result.output
        assert "Dry run" not in result.output
    engine = make_engine(db_url)
    try:
        with engine.connect() as c:
            assert c.execute(text("SELECT count(*) FROM config_versions")).scalar() == 0
    finally:
        engine.dispose()
    # the same file with the fix applied is recorded
    cfg.write_text(_doc({**RUNPOD, "volume_gb": 20}, {"size": 2}))
    assert cli("apply", str(cfg)).exit_code == 0


# --------------------------------------------------------------------------- dry run

FULL_NOTE = "a stopped machine is not capacity and does not count toward max_workers"


def _pool_lines(dry_run: str) -> list[str]:
    lines = dry_run.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("  warm pool:"))
    return lines[at : at + 2]


def test_the_dry_run_prices_a_runpod_pool_at_its_volume():
    out = _dry_run(_doc({**RUNPOD, "volume_gb": 20}, {"size": 2, "keep_for": "6h"}))
    # 2 pods × 20 GB × $0.20/GB-month ÷ 730 h = $0.010959/h; $8.00 a month
    assert round(2 * 20 * 0.20 / 730, 3) == 0.011
    assert _pool_lines(out) == [
        "  warm pool: up to 2 stopped machine(s) kept, each destroyed after 6h stopped; a "
        "resumed one with no ready worker within 2m is destroyed and a fresh one rented",
        "    while full: 2 × $0.00548/h (20 GB volume × $0.20/GB-month) = $0.011/h of storage "
        f"(≈ $8.00/month); {FULL_NOTE}",
    ]
    assert "→ drain it and stop its machine while the warm pool has room, else destroy it" in out
    assert out.endswith(
        "worst case for all queues: $1.20/h\n"
        "warm pools while full: $0.011/h of storage, on top of the worst case"
    )


def test_the_dry_run_follows_runpods_storage_price():
    provider = {**RUNPOD, "volume_gb": 100, "storage_price_per_gb_month": 0.07}
    out = _dry_run(_doc(provider, {"size": 1}))
    # 100 GB × $0.07 ÷ 730 = $0.00959/h
    assert "1 × $0.00959/h (100 GB volume × $0.07/GB-month) = $0.00959/h" in out
    assert "(≈ $7.00/month)" in out


def test_the_dry_run_prices_a_mock_pool():
    out = _dry_run(_doc({"kind": "mock", "storage_price_per_hour": 0.05}, {"size": 2}))
    assert _pool_lines(out)[1] == (
        f"    while full: 2 × $0.05/h ($0.05/h stopped) = $0.10/h of storage "
        f"(≈ $73.00/month); {FULL_NOTE}"
    )


def test_the_dry_run_says_a_local_pool_costs_nothing():
    out = _dry_run(_doc({"kind": "local"}, {"size": 2, "resume_timeout": "5m"}))
    lines = _pool_lines(out)
    assert "within 5m is destroyed" in lines[0]
    assert lines[1] == f"    while full: no storage cost (a folder on this machine); {FULL_NOTE}"
    assert out.endswith("warm pools while full: $0.00/h of storage, on top of the worst case")


def test_the_dry_run_says_vast_prices_storage_per_host():
    doc = yaml.safe_load(_doc({"kind": "vast", "api_key_env": "VAST_API_KEY"}, {"size": 2}))
    doc["queues"]["q"]["autoscale"]["instance"]["disk_gb"] = 80
    out = _dry_run(yaml.safe_dump(doc))
    assert _pool_lines(out)[1] == (
        "    while full: 2 × its host's own storage price per GB-month × the instance's 80 GB "
        f"disk, priced per host at rent time (not known before); {FULL_NOTE}"
    )
    assert out.endswith(
        "warm pools while full: the storage of 2 stopped machine(s) priced per host, on top of "
        "the worst case"
    )


def test_pools_of_several_queues_add_up():
    doc = yaml.safe_load(_doc({"kind": "mock"}, {"size": 2}))  # mock: $0.01/h stopped
    doc["providers"]["v"] = {"kind": "vast", "api_key_env": "VAST_API_KEY"}
    doc["queues"]["r"] = {
        "autoscale": {**doc["queues"]["q"]["autoscale"], "provider": "v", "warm_pool": {"size": 1}}
    }
    doc["queues"]["off"] = {"autoscale": {**doc["queues"]["q"]["autoscale"], "enabled": False}}
    out = _dry_run(yaml.safe_dump(doc))
    assert out.count("  warm pool:") == 2  # the queue that is off shows no pool
    assert out.endswith(
        "warm pools while full: $0.02/h of storage, plus the storage of 1 stopped machine(s) "
        "priced per host, on top of the worst case"
    )


# The dry run of a config without a pool, exactly as it was printed before warm pools.
BEFORE = """\
poll every 30s, boot timeout 15m, silent worker deadline 5m, failed rentals back off 30s \
doubling up to 10m

provider p: declared in this file

queue q: on p (RunPod SECURE cloud, GPU types in order: the queue's GPU)
  machine: RTX 4090 ×1, 50 GB disk, at most $0.60/h each; image \
ghcr.io/gpu-queue-autoscaler/worker:latest
  bounds: 0..2 machines (booting ones count), priority 0; worst case $1.20/h
  metrics: celery queue q on the broker in $AUTOSCALER_WATCH_BROKER_URL
  scale up when:
    - jobs pending and no live worker serves the queue → start 1 machine
  scale down when:
    - a worker has run no task for 10m → drain it and destroy its machine (most idle first, \
busy workers spared, never below the floor); once the queue has shown 8 quiet gaps, the \
timeout that would have cost least over them (up to 40m; `learn: false` turns it off)

worst case for all queues: $1.20/h"""


@pytest.mark.parametrize(
    "pool", [None, {"size": 0}, {"size": 0, "keep_for": "2h"}], ids=["absent", "off", "off+opts"]
)
def test_a_config_without_a_pool_prints_exactly_as_before(pool):
    assert _dry_run(_doc(RUNPOD, pool)) == BEFORE
