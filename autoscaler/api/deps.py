"""What every router of the API shares: this process's runtime, the request's transaction, the
three kinds of key as dependencies (`Admin`, `Worker`, `Enrolled`) and the one-line answer.

The runtime is made at the first request, not when the app is built, so building the app (its
OpenAPI schema, a test's client) opens no connection.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Annotated

from fastapi import Depends, HTTPException, Path, Request
from pydantic import BaseModel

from autoscaler.access import keys
from autoscaler.control.runtime import Runtime
from autoscaler.store.db import Session
from autoscaler.store.instances import InstanceDetails

LaunchId = Annotated[str, Path(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_\-]+$")]


class Message(BaseModel):
    message: str


class LazyRuntime:
    """The app's runtime: the one it was built with, else this process's own, made once."""

    def __init__(self, rt: Runtime | None, make: Callable[[], Runtime] = Runtime) -> None:
        self._rt = rt
        self._make = make
        self._lock = threading.Lock()

    def __call__(self) -> Runtime:
        if self._rt is None:
            # once, however many first requests ask at the same time (each its own thread):
            # one runtime, one connection pool per process
            with self._lock:
                if self._rt is None:
                    self._rt = self._make()
        return self._rt


def runtime(request: Request) -> Runtime:
    lazy: LazyRuntime = request.app.state.runtime
    return lazy()


Rt = Annotated[Runtime, Depends(runtime)]


def db(rt: Rt) -> Iterator[Session]:
    """One transaction per request: committed when the handler returns, rolled back if it
    raises. Every dependency of the request shares it (the key check and the handler)."""
    with rt.transaction() as session:
        yield session


DB = Annotated[Session, Depends(db, scope="function")]


def bearer(request: Request) -> str:
    header = request.headers.get("authorization", "")
    scheme, _, value = header.partition(" ")
    return value.strip() if scheme.lower() == "bearer" else ""


def unauthorised() -> HTTPException:
    return HTTPException(401, "a valid key is needed", headers={"WWW-Authenticate": "Bearer"})


def admin(request: Request, session: DB) -> str:
    """An operator's admin key: the key's name."""
    found = keys.check_key(session, bearer(request), keys.ADMIN)
    if found is None:
        raise unauthorised()
    return found.name


def enrolled(request: Request, session: DB) -> keys.KeyInfo:
    """A hand-made machine's enrolment key (the queues it opens are the router's to check)."""
    found = keys.check_key(session, bearer(request), keys.ENROLMENT)
    if found is None:
        raise unauthorised()
    return found


def worker(request: Request, launch_id: LaunchId, session: DB) -> InstanceDetails:
    """A rented machine's worker token, for its own launch only (another's id is a 403): its
    row, as a frozen record."""
    row = keys.instance_of_token(session, bearer(request))
    if row is None:
        raise unauthorised()
    if row.launch_id != launch_id:
        raise HTTPException(403, "this token belongs to another machine")
    return row


Admin = Annotated[str, Depends(admin)]
Worker = Annotated[InstanceDetails, Depends(worker)]
Enrolled = Annotated[keys.KeyInfo, Depends(enrolled)]

__all__ = [
    "DB",
    "Admin",
    "Enrolled",
    "LaunchId",
    "LazyRuntime",
    "Message",
    "Rt",
    "Worker",
    "bearer",
    "unauthorised",
]
