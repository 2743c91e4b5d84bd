"""What several security tests set up alike: a migrated store, a runtime in this process and
one queue `q` renting from the RunPod fake as provider `pods`."""

from __future__ import annotations

from pathlib import Path

from autoscaler.config import load_config_text
from autoscaler.control.runtime import Runtime, utc_now
from autoscaler.settings import Settings
from autoscaler.store import config_versions, migrate
from tests.fakes.runpod_server import FakeRunPod


def runpod_runtime(
    tmp_path: Path, db_url: str, fake: FakeRunPod, key: str, top: str = ""
) -> Runtime:
    """The runtime, with the config applied (`top`: top-level YAML lines to add)."""
    migrate.upgrade(db_url)
    env = {"AUTOSCALER_HOME": str(tmp_path), "AUTOSCALER_DATABASE_URL": db_url, "RP_KEY": key}
    rt = Runtime(Settings.from_env(env), env=env)
    config = load_config_text(f"""{top}
providers:
  pods: {{kind: runpod, base_url: "{fake.url}", api_key_env: RP_KEY,
          gpu_types: ["NVIDIA GeForce RTX 4090"]}}
queues:
  q:
    metrics: {{url: "redis://127.0.0.1:6379/0"}}
    autoscale:
      provider: pods
      max_workers: 1
      instance: {{gpu: "RTX 4090", max_price_per_hour: 0.8}}
""")
    with rt.transaction() as session:
        config_versions.record(session, config.model_dump(mode="json"), "t", utc_now())
    return rt
