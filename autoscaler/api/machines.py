"""The deployment answer for both kinds of machine (rented ones with a worker token, hand-made
ones with an enrolment key); what they report and are answered is declared in `autoscaler.wire`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from autoscaler.wire import DeploymentAnswer


def deployment(
    queue: str, dep: Any, env: Mapping[str, str], broker_url: str | None, note: str | None
) -> DeploymentAnswer:
    """The answer for a machine of `queue` (its config's `deployment:` block `dep`, or None)."""
    return DeploymentAnswer(
        queue=queue,
        git_url=dep.git_url if dep else None,
        git_ref=dep.git_ref if dep else None,
        git_token=_git_token(dep, env),
        startup_cmd=dep.startup_cmd if dep else None,
        env={**(dep.env if dep else {}), "AUTOSCALER_QUEUE": queue},
        broker_url=broker_url,
        broker_note=note,
    )


def _git_token(dep: Any, env: Mapping[str, str]) -> str | None:
    """The private repository's read token, from the control plane's environment (only a
    machine's own authenticated deployment request gets it)."""
    name = getattr(dep, "git_token_env", None)
    return (env.get(name) or None) if name else None


__all__ = ["deployment"]
