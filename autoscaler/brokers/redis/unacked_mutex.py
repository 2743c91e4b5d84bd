"""kombu's `unacked_mutex` on a watched Redis: a forged one is found and cleared.

kombu's Redis transport takes `{prefix}unacked_mutex` (its `Mutex`: a redis-py `Lock`, i.e.
`SET key <32 hex digits> NX PX <unacked_mutex_expire>`, 300 s by default) before it brings
expired deliveries back (`QoS.restore_visible`), and gives up at once while someone else holds
it. Every worker of a trust domain needs `SET` on that key, so a rented machine can set it with
no expiry, or with a long one: every consumer's restore of the domain then stops for as long as
the key lives, after the machine is gone too. kombu never sets it without an expiry, nor for
longer than its `unacked_mutex_expire`, nor to anything but a lock token; such a key is not
kombu's and is deleted, on the watched broker's admin connection, only if it still holds the
value that was judged (WATCH: a real holder that took it meanwhile is left alone). No caller
waits on the mutex.
"""

from __future__ import annotations

import re

import redis

from autoscaler.brokers.redis.keys import CeleryRedisLayout

MUTEX_KEY = "unacked_mutex"
KOMBU_MUTEX_EXPIRE = 300.0
"""kombu's `unacked_mutex_expire` (seconds): its mutex never lives longer than this."""
_TOKEN = re.compile(rb"[0-9a-f]{32}")
"""A redis-py `Lock` token (`uuid1().hex`): what kombu's mutex holds."""


def forged_why(ttl_ms: int, value: bytes | None, expire: float = KOMBU_MUTEX_EXPIRE) -> str | None:
    """Why a mutex with this PTTL and value cannot be kombu's, or None when it could be."""
    if value is None or ttl_ms == -2:
        return None  # gone
    if ttl_ms == -1:
        return "it has no expiry"
    if ttl_ms > expire * 1000:
        return f"it expires in {ttl_ms / 1000:.0f}s, beyond kombu's {expire:g}s"
    if not _TOKEN.fullmatch(value):
        return "it holds no lock token"
    return None


def clear_forged(
    client: redis.Redis,
    layout: CeleryRedisLayout,
    *,
    key: str = MUTEX_KEY,
    expire: float = KOMBU_MUTEX_EXPIRE,
) -> str | None:
    """Delete the domain's `unacked_mutex` if it cannot be kombu's; returns why it was deleted,
    None when it was left (absent, plausibly kombu's, or changed while we looked)."""
    name = layout.global_keyprefix + key
    with client.pipeline(transaction=True) as pipe:
        try:
            pipe.watch(name)  # type: ignore[no-untyped-call]
            ttl = int(pipe.pttl(name))
            raw = pipe.get(name)
            why = forged_why(ttl, raw if isinstance(raw, bytes) else None, expire)
            if why is None:
                pipe.unwatch()
                return None
            pipe.multi()
            pipe.delete(name)
            pipe.execute()
        except redis.WatchError:
            return None  # taken or released meanwhile: judged again next round
    return why


__all__ = ["KOMBU_MUTEX_EXPIRE", "MUTEX_KEY", "clear_forged", "forged_why"]
