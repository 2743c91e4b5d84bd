"""A user's Git values never reach git as options.

`git_ref: "--orphan=evil"` reached `git checkout` as an option. `validate` refuses a ref or a URL
starting with '-' with path, cause and fix; the agent refuses such a deployment before running
git (its answer comes from our API, but the agent trusts nothing it is told), and passes every
value after `--`, where git reads no options. Real git, real repositories made by the test.
"""

from __future__ import annotations

import subprocess

import pytest

from autoscaler.agent.run import prepare_deploy
from autoscaler.agent.server_api import AgentError
from autoscaler.config import ConfigError, load_config_text
from tests.agent.agentkit import deployment, git_repo

CONFIG = """
providers: {{gpu: {{kind: mock}}}}
queues:
  q:
    deployment: {{git_url: '{url}', git_ref: '{ref}', startup_cmd: 'celery -A tasks worker'}}
    metrics: {{url: 'redis://127.0.0.1:6379/0'}}
    autoscale:
      provider: gpu
      max_workers: 1
      instance: {{gpu: RTX 4090, max_price_per_hour: 0.6}}
"""


@pytest.mark.parametrize(
    ("url", "ref", "path"),
    [
        ("https://example.invalid/r.git", "--orphan=evil", "queues.q.deployment.git_ref"),
        ("--upload-pack=touch /tmp/x", "main", "queues.q.deployment.git_url"),
    ],
)
def test_validate_refuses_git_values_that_git_would_read_as_options(url, ref, path):
    with pytest.raises(ConfigError) as info:
        load_config_text(CONFIG.format(url=url, ref=ref), "c.yaml", {})
    (refusal,) = info.value.refusals
    assert refusal.path == path and "option" in refusal.cause, refusal


def test_the_agent_refuses_an_option_and_checks_out_a_ref_after_end_of_options(tmp_path):
    url = git_repo(tmp_path / "repo", {"tasks.py": "x = 1\n"})
    subprocess.run(["git", "-C", str(tmp_path / "repo"), "branch", "other"], check=True)
    for dep in (
        {"git_url": url, "git_ref": "--orphan=evil"},
        {"git_url": "--upload-pack=touch /tmp/x", "git_ref": "main"},
    ):
        with pytest.raises(AgentError, match="starts with '-'"):
            prepare_deploy(deployment(**dep), tmp_path / "work")
        assert not (tmp_path / "work" / "repo").exists()  # git never ran
    repo = prepare_deploy(deployment(git_url=url, git_ref="other"), tmp_path / "work").repo
    head = subprocess.run(
        ["git", "-C", str(repo), "branch", "--show-current"], capture_output=True, text=True
    )
    assert head.stdout.strip() == "other"
