"""A deployment's own variables and a private repository's token reach the machine through its
own authenticated request only; git reads the token from its environment, never argv."""

from __future__ import annotations

import copy
import subprocess
from collections.abc import Iterator

import pytest

from autoscaler.agent.run import git_auth_env
from autoscaler.config import ConfigError, load_config_text
from autoscaler.control.runtime import utc_now
from autoscaler.store import config_versions
from tests.api.apikit import CONFIG, World, make_world

TOKEN = "ghp-PRIVATE-REPO-TOKEN-123"


@pytest.fixture
def world(sqlite_url, tmp_path) -> Iterator[World]:
    w = make_world(sqlite_url, tmp_path)
    doc = copy.deepcopy(CONFIG)
    doc["queues"]["q1"]["deployment"].update(
        {"env": {"MODEL": "llama-8b", "HF_HOME": "/cache"}, "git_token_env": "REPO_TOKEN"}
    )
    with w.rt.transaction() as session:
        config_versions.record(session, doc, "test", utc_now())
    w.rt.env = {**w.rt.env, "REPO_TOKEN": TOKEN}
    try:
        yield w
    finally:
        w.close()


def test_the_machine_gets_its_deployment_env_and_the_repo_token(world):
    dep = world.client.get("/v1/worker/m1/deployment", headers=world.h(world.tokens["m1"]))
    assert dep.status_code == 200
    body = dep.json()
    assert body["env"] == {"MODEL": "llama-8b", "HF_HOME": "/cache", "AUTOSCALER_QUEUE": "q1"}
    assert body["git_token"] == TOKEN


def test_the_token_is_in_no_other_answer(world):
    admin = world.h(world.admin)
    for path in ("/v1/admin/config", "/v1/admin/queues", "/v1/admin/instances", "/metrics"):
        answer = world.client.get(path, headers=admin)
        assert TOKEN not in answer.text, path
    # another machine's token, a revoked one, or none: no deployment at all
    for headers in (world.h(world.tokens["m2"]), world.h(world.tokens["gone"]), {}):
        answer = world.client.get("/v1/worker/m1/deployment", headers=headers)
        assert answer.status_code in (401, 403) and TOKEN not in answer.text


@pytest.mark.parametrize(
    ("env", "why"),
    [
        ({"AUTOSCALER_QUEUE": "x"}, "start with 'AUTOSCALER_'"),
        ({"1BAD": "x"}, "not the name of an environment variable"),
    ],
)
def test_deployment_env_names_are_checked(env, why):
    doc = copy.deepcopy(CONFIG)
    doc["queues"]["q1"]["deployment"]["env"] = env
    import yaml

    with pytest.raises(ConfigError) as info:
        load_config_text(yaml.safe_dump(doc))
    assert why in info.value.render()


def test_git_reads_the_token_from_its_environment_not_its_command_line(tmp_path):
    env = git_auth_env(TOKEN)
    assert all(TOKEN not in v for v in env.values())  # only its base64 form, in a header
    got = subprocess.run(
        ["git", "config", "--get", "http.extraHeader"],
        env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), **env},
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    import base64

    assert (
        got
        == "Authorization: Basic " + base64.b64encode(f"x-access-token:{TOKEN}".encode()).decode()
    )
    assert git_auth_env(None) == {} and git_auth_env("") == {}
