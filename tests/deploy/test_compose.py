"""deploy/compose.yaml (and its TLS override) are valid Compose files that hold what the
production guide promises: `docker compose config` where docker compose exists, and in every
case the Compose Specification's JSON schema (tests/deploy/README.md says where it came from)
plus our own rules. Each check is also shown to fail on a broken file."""

from __future__ import annotations

import copy
import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
SCHEMA = json.loads((Path(__file__).parent / "compose-spec.json").read_text())
ENV = {
    "POSTGRES_PASSWORD": "pg-test-pw",
    "REDIS_PASSWORD": "redis-test-pw",
    "FLOWER_BASIC_AUTH": "operator:flower-test-pw",
    "AUTOSCALER_PUBLIC_URL": "https://autoscaler.example.com",
}
VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?:(:?[-?])([^}]*))?\}")


def interpolate(value: Any, env: dict[str, str]) -> Any:
    """Compose's ${VAR}, ${VAR:-default}, ${VAR:?error} and $$ (what `docker compose config`
    does before its own schema check); a required variable that is unset is an error."""
    if isinstance(value, dict):
        return {k: interpolate(v, env) for k, v in value.items()}
    if isinstance(value, list):
        return [interpolate(v, env) for v in value]
    if not isinstance(value, str):
        return value

    def sub(m: re.Match[str]) -> str:
        name, op, arg = m.group(1), m.group(2), m.group(3)
        if env.get(name):
            return env[name]
        if op and op.endswith("?"):
            raise KeyError(f"{name}: {arg}")
        return arg or ""

    return VAR.sub(sub, value.replace("$$", "\0")).replace("\0", "$")


def load(name: str, env: dict[str, str] = ENV) -> dict[str, Any]:
    raw = yaml.safe_load((DEPLOY / name).read_text())
    doc: dict[str, Any] = interpolate(raw, env)
    return doc


def schema_errors(doc: dict[str, Any]) -> list[str]:
    validator = jsonschema.Draft7Validator(SCHEMA)
    return [
        f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(doc)
    ]


def merged(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merged(out[key], value)
        else:
            out[key] = value
    return out


def _docker_compose() -> list[str] | None:
    for cmd in (["docker", "compose"], ["docker-compose"]):
        if shutil.which(cmd[0]) is None:
            continue
        probe = subprocess.run([*cmd, "version"], capture_output=True, text=True, timeout=60)
        if probe.returncode == 0:
            return cmd
    return None


@pytest.mark.parametrize("files", [["compose.yaml"], ["compose.yaml", "compose.tls.yaml"]])
def test_compose_files_are_valid(files, tmp_path):
    docs = [load(f) for f in files]
    for name, doc in zip(files, docs, strict=True):
        assert schema_errors(doc) == [], name
    compose = _docker_compose()
    if compose is not None:  # the real parser too, where it is installed
        args = [a for f in files for a in ("-f", str(DEPLOY / f))]
        (DEPLOY / "secrets").mkdir(exist_ok=True)
        res = subprocess.run(
            [*compose, *args, "config", "-q"],
            capture_output=True,
            text=True,
            timeout=120,
            env={**os.environ, **ENV},
        )
        assert res.returncode == 0, res.stderr


def test_the_schema_check_can_fail():
    doc = load("compose.yaml")
    broken = copy.deepcopy(doc)
    broken["services"]["api"]["ports"] = 8480  # must be a list
    assert schema_errors(broken)
    broken = copy.deepcopy(doc)
    broken["services"]["worker"]["replica"] = 2  # no such key
    assert schema_errors(broken)
    broken = copy.deepcopy(doc)
    broken["services"]["api"]["depends_on"]["migrate"]["condition"] = "eventually"
    assert schema_errors(broken)
    with pytest.raises(KeyError, match="REDIS_PASSWORD"):  # a required secret left unset
        load("compose.yaml", {k: v for k, v in ENV.items() if k != "REDIS_PASSWORD"})


def _command(service: dict[str, Any]) -> list[str]:
    cmd = service.get("command") or []
    return cmd if isinstance(cmd, list) else cmd.split()


def test_the_compose_file_runs_what_the_guide_says():
    doc = load("compose.yaml")
    services = doc["services"]
    assert {"postgres", "redis", "migrate", "api", "beat", "worker", "lifecycle", "flower"} <= set(
        services
    )
    # one beat, several workers with task events (Flower shows their tasks)
    assert services["beat"].get("deploy", {}).get("replicas", 1) == 1
    assert _command(services["beat"])[:4] == ["celery", "-A", "autoscaler", "beat"]
    # the loop's workers and the lifecycle's apart: a lifecycle step never holds up a tick
    for name, queue in (("worker", "autoscaler"), ("lifecycle", "autoscaler.lifecycle")):
        assert services[name]["deploy"]["replicas"] >= 2
        command = _command(services[name])
        assert "-E" in command and command[command.index("-Q") + 1] == queue, name
    # the store is migrated before anything runs on it
    assert _command(services["migrate"]) == ["autoscaler", "db", "upgrade"]
    for name in ("api", "beat", "worker", "lifecycle", "flower"):
        needs = services[name]["depends_on"]
        assert needs["migrate"]["condition"] == "service_completed_successfully", name
    # Redis with a password; the control plane on its own database (never a watched one's)
    assert "--requirepass" in " ".join(_command(services["redis"]))
    for name in ("api", "beat", "worker", "lifecycle", "flower", "migrate"):
        env = services[name]["environment"]
        assert env["AUTOSCALER_BROKER_URL"] == "redis://:redis-test-pw@redis:6379/15", name
        assert env["AUTOSCALER_DATABASE_URL"].startswith("postgresql://autoscaler:pg-test-pw@")
        assert env["AUTOSCALER_API_URL"] == ENV["AUTOSCALER_PUBLIC_URL"]
        assert env["AUTOSCALER_VAULT_KEY_FILE"] == "/run/secrets/vault_key"
        assert "vault_key" in services[name]["secrets"]
    assert services["flower"]["environment"]["FLOWER_BASIC_AUTH"] == ENV["FLOWER_BASIC_AUTH"]
    # published on loopback only (a TLS proxy in front)
    for name in ("api", "flower"):
        assert all(str(p).startswith("127.0.0.1:") for p in services[name]["ports"]), name
    # every build names a Dockerfile that exists
    for name, svc in services.items():
        if "build" in svc:
            assert (DEPLOY / svc["build"]["context"] / svc["build"]["dockerfile"]).is_file(), name


def test_no_secret_is_written_in_the_compose_files():
    for name in ("compose.yaml", "compose.tls.yaml"):
        raw = yaml.safe_load((DEPLOY / name).read_text())
        for path, value in _walk(raw):
            if not isinstance(value, str):
                continue
            key = path[-1] if path else ""
            secret_name = re.search(r"PASSWORD|SECRET|TOKEN|AUTH|KEY$", key)
            if key.isupper() and secret_name and "FILE" not in key:
                assert value.startswith("${") or value == "", (name, path, value)
            assert not re.search(r"://[^:/@\s]*:(?!\$\{)[^@\s]+@", value), (name, path, value)


def test_tls_override_switches_every_client_to_rediss():
    doc = merged(load("compose.yaml"), load("compose.tls.yaml"))
    assert "--tls-port" in " ".join(_command(doc["services"]["redis"]))
    for name in ("api", "beat", "worker", "flower", "migrate"):
        url = doc["services"][name]["environment"]["AUTOSCALER_BROKER_URL"]
        assert url.startswith("rediss://") and "ssl_cert_reqs=required" in url, name


def _walk(value: Any, path: tuple[str, ...] = ()) -> Any:
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _walk(v, (*path, str(k)))
    elif isinstance(value, list):
        for v in value:
            yield from _walk(v, path)
    else:
        yield path, value
