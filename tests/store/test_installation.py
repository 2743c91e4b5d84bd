"""Concurrent first uses of the installation id converge on one row (a reconcile round's
provider lists and its worker observation ask for it at once on a fresh store)."""

from __future__ import annotations

import threading

from autoscaler.store import installation, migrate
from autoscaler.store.db import make_engine, session_factory, transaction


def test_racing_first_uses_get_one_id(db_url) -> None:
    migrate.upgrade(db_url)
    engine = make_engine(db_url)
    factory = session_factory(engine)
    ready = threading.Barrier(4)
    got: list[str] = []
    errors: list[BaseException] = []

    def first_use() -> None:
        try:
            ready.wait()
            with transaction(factory) as session:
                got.append(installation.installation_id(session))
        except BaseException as exc:  # the failure the test is about
            errors.append(exc)

    threads = [threading.Thread(target=first_use) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    engine.dispose()
    assert errors == [] and len(got) == 4 and len(set(got)) == 1, (errors, got)
