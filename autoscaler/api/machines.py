"""What both kinds of machine (rented ones with a worker token, hand-made ones with an
enrolment key) report and are answered: finished jobs, the heartbeat's answer, the deployment.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field

from autoscaler.api.inputs import RequestBody

Name = Annotated[str, Field(min_length=1, max_length=200, pattern=r"^[A-Za-z0-9_.:@\-]+$")]
WorkerState = Literal["starting", "idle", "busy", "draining", "crashed"]
EPOCH_S = Annotated[float, Field(ge=0, le=2**33, allow_inf_nan=False)]


TaskId = Annotated[str, Field(min_length=1, max_length=200)]
"""A Celery task id as a worker reports it (any text the producer chose, bounded)."""


class JobReport(RequestBody):
    """A job the worker finished (the agent's hook): its task id, the queue it came from (the
    message's routing key, any text), the producer's publish stamp if any, and when it started
    and ended (epoch seconds). Clocks disagree (a producer's runs ahead, a worker's steps back):
    times out of order are clamped when recorded, never a reason to refuse the heartbeat that
    carries them — the heartbeat is what keeps a busy machine alive."""

    id: TaskId
    queue: Annotated[str, Field(max_length=200)] | None = None
    published_at: EPOCH_S | None = None
    started_at: EPOCH_S
    finished_at: EPOCH_S


class HeartbeatAnswer(BaseModel):
    drain: bool
    state: str


class DeploymentAnswer(BaseModel):
    queue: str
    git_url: str | None
    git_ref: str | None
    git_token: str | None = None
    startup_cmd: str | None
    env: dict[str, str]
    broker_url: str | None
    broker_note: str | None


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


__all__ = ["DeploymentAnswer", "HeartbeatAnswer", "JobReport", "Name", "deployment"]
