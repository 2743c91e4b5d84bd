"""`python -m autoscaler.ops.healthcheck [api|store]`: the control-plane image's HEALTHCHECK.

- `api`: the server API answers `/healthz` on $AUTOSCALER_API_BIND (which reads the store);
- `store` (beat, worker, flower): the state store is reachable and at the migrations' head.

Exit 0 healthy, 1 not; one line on stdout, with the database URL's password masked.
"""

from __future__ import annotations

import sys
import urllib.request

from autoscaler.settings import Settings, redact_url

TIMEOUT = 5.0


def check_api(settings: Settings) -> str:
    host, _, port = settings.api_bind.rpartition(":")
    host = "127.0.0.1" if host in ("", "0.0.0.0", "::", "[::]") else host
    url = f"http://{host}:{port}/healthz"
    with urllib.request.urlopen(url, timeout=TIMEOUT) as answer:
        if answer.status != 200:
            raise RuntimeError(f"{url} answered {answer.status}")
    return f"api ok ({url})"


def check_store(settings: Settings) -> str:
    from autoscaler.store import migrate
    from autoscaler.store.db import make_engine

    url = settings.database_url
    pg = url.startswith("postgresql")
    engine = (
        make_engine(url, connect_args={"connect_timeout": int(TIMEOUT)})
        if pg
        else (make_engine(url))
    )
    try:
        current, head = migrate.revisions(engine)
    finally:
        engine.dispose()
    if current != head:
        raise RuntimeError(f"store at {current}, code needs {head}: run `autoscaler db upgrade`")
    return f"store ok ({redact_url(settings.database_url)} at {current})"


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    what = args[0] if args else "store"
    settings = Settings.from_env()
    try:
        print(check_api(settings) if what == "api" else check_store(settings))
    except Exception as exc:  # a health check reports, it never raises
        text = str(exc).splitlines()[0] if str(exc) else ""
        for secret in (settings.database_url,):
            text = text.replace(secret, redact_url(secret))
        print(f"unhealthy: {type(exc).__name__}: {text[:200]}")
        return 1
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
