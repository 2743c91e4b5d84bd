"""The one schema of what a machine's agent and the server API say to each other.

Every request body a machine sends (`/v1/worker/{launch_id}/…` with its worker token,
`/v1/hand-made/…` with an enrolment key) and every answer its agent reads is declared here,
once: the API's routes take these models as their bodies and response models, the agent builds
its bodies from them (`model_dump(mode="json")`) and parses the answers it reads with them. A
field renamed here is renamed on both sides; `tests/test_wire.py` holds the routes and the
agent's real requests to it.

Request bodies (`RequestBody`, the base of every request body of the API, the operators' ones
too) refuse unknown fields, and text the state store cannot hold: PostgreSQL's `text` refuses a
NUL byte, and a lone surrogate cannot be encoded as UTF-8. Producers choose task ids; a NUL in
one made every heartbeat of its machine a 503 on PostgreSQL — the agent resent it for ever, and
the machine was judged silent and destroyed. Such a value is a 422 naming its field.

Answers (`Answer`) ignore fields they do not know: a newer server may say more than an older
agent reads, and that must never stop the agent.

Imports pydantic and the standard library only: the agent and the API both stand above it.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator

# ---------------------------------------------------------------------------------------------
# the two bases and the field types


def storable(text: str) -> str:
    """`text` if the store can hold it; ValueError saying why not."""
    if "\x00" in text:
        raise ValueError("contains a NUL byte (\\u0000), which the store cannot hold")
    if any("\ud800" <= c <= "\udfff" for c in text):
        raise ValueError("contains a lone UTF-16 surrogate, which is not UTF-8 text")
    return text


def _storable_values(value: Any) -> Any:
    if isinstance(value, str):
        storable(value)
    elif isinstance(value, list | tuple | set | frozenset):
        for item in value:
            _storable_values(item)
    elif isinstance(value, dict):
        for k, v in value.items():
            _storable_values(k)
            _storable_values(v)
    return value


class RequestBody(BaseModel):
    """A request body: unknown fields refused, every text storable."""

    model_config = ConfigDict(extra="forbid")

    @field_validator("*", mode="after")
    @classmethod
    def _storable(cls, value: Any) -> Any:
        return _storable_values(value)


class Answer(BaseModel):
    """An answer the agent reads: fields it does not know are ignored (a newer server's)."""

    model_config = ConfigDict(extra="ignore")


def _utc(value: datetime) -> datetime:
    """An aware UTC time; a naive one is taken as UTC. Times UTC cannot hold (year 1 with an
    offset east of Greenwich, 9999-12-31 west of it) are refused rather than overflowing."""
    aware = value if value.tzinfo is not None else value.replace(tzinfo=UTC)
    try:
        return aware.astimezone(UTC)
    except OverflowError:
        raise ValueError("is outside the range of UTC times; send an ISO 8601 time") from None


UtcTime = Annotated[datetime, AfterValidator(_utc)]
"""A time in a request body (ISO 8601 or epoch seconds), converted to UTC at the door."""

Name = Annotated[str, Field(min_length=1, max_length=200, pattern=r"^[A-Za-z0-9_.:@\-]+$")]
"""A worker's or a queue's name as a machine reports it."""

WorkerState = Literal["starting", "idle", "busy", "draining", "crashed"]
"""What the agent says its worker is doing."""

EpochSeconds = Annotated[float, Field(ge=0, le=2**33, allow_inf_nan=False)]
"""A time as epoch seconds on the machine's clock."""

TaskId = Annotated[str, Field(min_length=1, max_length=200)]
"""A Celery task id as a worker reports it (any text the producer chose, bounded)."""

HEARTBEAT_JOBS = 1000
"""Finished jobs one heartbeat carries at most (the rest go with the next)."""
HELD_TASKS = 1000
"""Task ids one heartbeat lists at most."""


class JobReport(RequestBody):
    """A job the worker finished (the agent's hook): its task id, the queue it came from (the
    message's routing key, any text), the producer's publish stamp if any, and when it started
    and ended (epoch seconds). Clocks disagree (a producer's runs ahead, a worker's steps back):
    times out of order are clamped when recorded, never a reason to refuse the heartbeat that
    carries them — the heartbeat is what keeps a busy machine alive."""

    id: TaskId
    queue: Annotated[str, Field(max_length=200)] | None = None
    published_at: EpochSeconds | None = None
    started_at: EpochSeconds
    finished_at: EpochSeconds


# ---------------------------------------------------------------------------------------------
# a rented machine: /v1/worker/{launch_id}/…, its worker token


class Register(RequestBody):
    """`POST register`: its agent is up and names its worker."""

    worker_name: Name
    hostname: Name | None = None


class Registered(Answer):
    launch_id: str
    queue: str
    heartbeat_interval: float


class Heartbeat(RequestBody):
    """`POST heartbeat`: the agent's word on its worker, and the jobs it finished."""

    state: WorkerState
    running_tasks: int = Field(default=0, ge=0, le=100_000)
    last_task_at: UtcTime | None = None
    gpu_utilisation: float | None = Field(default=None, ge=0, le=100)
    detail: str | None = Field(default=None, max_length=500)
    jobs: list[JobReport] = Field(default_factory=list, max_length=HEARTBEAT_JOBS)
    tasks: list[TaskId] = Field(default_factory=list, max_length=HELD_TASKS)
    """Ids of the jobs its worker holds now (received, not finished): what is handed back to
    the broker if the machine is lost (`control.steps.handback`)."""
    acks_late: bool | None = None
    """Its worker's `task_acks_late`: with early acks a lost machine's running jobs are gone."""


class HeartbeatAnswer(Answer):
    """The answer to either kind of machine's heartbeat: drain now or not, and its state."""

    drain: bool
    state: str


class BootPhases(RequestBody):
    """`POST phases`: when each phase of this boot happened, on the machine's clock (UTC; ISO
    8601 or epoch seconds): the fields are `policy.boots.BOOT_PHASES` (a test holds them
    alike), any other name refused. A phase already kept for this boot is left as it was (the
    first report wins); a time before the boot began or after the store's now is clamped into
    that span."""

    started: UtcTime | None = None
    registered: UtcTime | None = None
    code_fetched: UtcTime | None = None
    requirements_installed: UtcTime | None = None
    worker_up: UtcTime | None = None
    first_job: UtcTime | None = None


class PhasesKept(Answer):
    boot: int
    """The row's resumes when reported: 0 for the cold boot, n for its n-th resume."""
    resume: bool
    recorded: list[str]
    """The phases newly kept by this report (those kept before are not changed)."""


class Drained(Answer):
    """`POST drained` (no body): the machine's next state, stopping or terminating."""

    state: str


# ---------------------------------------------------------------------------------------------
# a hand-made machine: /v1/hand-made/…, an enrolment key


class HandMadeBeat(RequestBody):
    """`POST heartbeat`: a sighting of the machine's worker for its queues, its finished jobs."""

    name: Name
    queues: list[Name] = Field(min_length=1, max_length=50)
    state: WorkerState = "idle"
    running_tasks: int = Field(default=0, ge=0, le=100_000)
    jobs: list[JobReport] = Field(default_factory=list, max_length=HEARTBEAT_JOBS)


# ---------------------------------------------------------------------------------------------
# both kinds: GET deployment


class DeploymentAnswer(Answer):
    """What the machine runs: the checkout, its startup command and environment, and (a rented
    machine's only) the broker URL of its own broker user, or a note saying why there is none."""

    queue: str
    git_url: str | None
    git_ref: str | None
    git_token: str | None = None
    startup_cmd: str | None
    env: dict[str, str]
    broker_url: str | None
    broker_note: str | None


__all__ = [
    "Answer",
    "BootPhases",
    "DeploymentAnswer",
    "Drained",
    "EpochSeconds",
    "HandMadeBeat",
    "Heartbeat",
    "HeartbeatAnswer",
    "JobReport",
    "Name",
    "PhasesKept",
    "Register",
    "Registered",
    "RequestBody",
    "TaskId",
    "UtcTime",
    "WorkerState",
    "storable",
]
