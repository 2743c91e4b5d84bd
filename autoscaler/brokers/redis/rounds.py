"""One round trip to the watched Redis: every call of a round, RESP-encoded, in one pipeline,
the replies read as they arrive. A base of the reader: `celery_redis` runs each read's rounds
through it, `unacked` the binding tables' pages."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import redis

MAX_ROUNDS = 10_000
"""Round trips one read may take (a safety net: the budgets end a read long before)."""


def resp_args(args: Sequence[str | int | bytes]) -> bytes:
    """Arguments in the Redis protocol (what redis-py would send), without the count."""
    out = []
    for a in args:
        b = a if isinstance(a, bytes) else str(a).encode()
        out.append(b"$%d\r\n%s\r\n" % (len(b), b))
    return b"".join(out)


def resp(args: Sequence[str | int | bytes]) -> bytes:
    """One command in the Redis protocol."""
    return b"*%d\r\n%s" % (len(args), resp_args(args))


class RoundTrips:
    """The reader's round trips over its client's connection pool."""

    _client: redis.Redis

    def _round(self, calls: Sequence[bytes]) -> Iterator[Any]:
        """One round trip: every call (RESP-encoded) in one pipeline; the replies as they
        arrive (an error reply in its place), so the first pieces are parsed while the server
        runs the next. A connection found dead before any reply is opened again once."""
        pool = self._client.connection_pool
        for attempt in (0, 1):
            conn: Any = pool.get_connection()
            read = 0
            try:
                conn.send_packed_command(list(calls))
                for _ in calls:
                    try:
                        reply = conn.read_response()
                    except redis.ResponseError as exc:
                        reply = exc
                    read += 1
                    yield reply
                return
            except (redis.ConnectionError, redis.TimeoutError):
                conn.disconnect()
                if read or attempt:
                    raise
            except BaseException:
                conn.disconnect()  # replies left unread: the connection is out of step
                raise
            finally:
                pool.release(conn)
