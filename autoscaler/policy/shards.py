"""Which shard evaluates a queue: a stable hash of its name, the same in every process.

CRC-32, not Python's `hash()`: that is salted per process, and every worker must agree on the
shard of every queue (a queue in two shards would be evaluated twice at once)."""

from __future__ import annotations

import zlib
from collections.abc import Iterable


def shard_of(queue: str, shards: int) -> int:
    return zlib.crc32(queue.encode()) % shards if shards > 1 else 0


def queues_of(queues: Iterable[str], shard: int, shards: int) -> list[str]:
    """The queues among `queues` that shard `shard` of `shards` evaluates, in order."""
    return [q for q in queues if shard_of(q, shards) == shard]
