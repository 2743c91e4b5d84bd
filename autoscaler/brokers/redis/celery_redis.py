"""Celery queues on Redis, read the way Flower reads them, in short pipelined server calls.

Per queue `q` kombu keeps one list per priority step: `{prefix}q` for step 0 and
`{prefix}q{sep}{step}` for the others (`global_keyprefix`, `sep`, `priority_steps` from
`broker_transport_options`). Producers LPUSH and workers BRPOP, so each list's oldest message is
`LINDEX key -1`.

- pending   = messages in every priority key whose due time has come (a missing key is empty);
- scheduled = messages with an ETA / countdown still in the future (Celery's `eta` header),
              in the lists (no worker has fetched them) or in the `unacked` hash (a worker holds
              them until due); `next_due_at` the earliest. The lists are scanned server-side up
              to `scan_limit` messages per key and `scan_budget` per read beyond each key's
              window; messages beyond count as due (a lower bound on scheduled);
- oldest    = the longest wait among due messages (for a job that had an ETA, since its ETA):
              from the `x-autoscaler-published-at` header when the producer is stamped
              (`brokers.stamp`), otherwise a lower bound from first sightings of the oldest
              `window` messages (`brokers.marks`, persisted through `Sightings`, restart-proof),
              so the bound keeps growing while the queue drains;
- in flight = due messages in the `{prefix}unacked` hash (delivered to a worker, not acked)
              whose (exchange, routing key) is routed to the queue: the anonymous exchange
              routes by queue name, any other through kombu's binding table
              `{prefix}_kombu.binding.{exchange}` (direct: equal routing keys; topic: the stored
              pattern). With Celery's default early acks a running job is acked already, so
              in flight is prefetched-not-started jobs, never the running ones (those come from
              the workers: `QueueMetrics.running`).

No command keeps the user's Redis busy for long (`redis_pieces`): the lists are read by a script
run per piece of at most `piece_budget` units (commands, messages examined), all pieces of a
round in one pipeline, their answers parsed as they arrive; kombu's unacked index in rank slices
of the same budget, with each tag's value from the hash in the same call; binding tables by SSCAN
pages. A read is one round trip unless a list is deeper than a piece can scan (one more) or the
unacked index outgrew the slices sized from the last read.

What can move between two pieces, and why no job is counted twice, is in `unacked`.

We never run a Celery app on the watched Redis (it would requeue the watched app's unacked
messages), only plain redis-py reads.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Sequence
from datetime import datetime
from typing import Literal

import redis

from autoscaler.brokers.base import (
    Clock,
    ReaderBuild,
    Secrets,
    SightingsMemo,
    SourceError,
    failed_metrics,
    safe_error,
    utc_now,
)
from autoscaler.brokers.base import Sightings as SightingsPort
from autoscaler.brokers.redis.found import Found, queue_metrics
from autoscaler.brokers.redis.heads import Item
from autoscaler.brokers.redis.index_scans import CursorScan
from autoscaler.brokers.redis.keys import CeleryRedisLayout, redis_layout
from autoscaler.brokers.redis.list_scans import ListScan, Task, parse_piece, tasks_of
from autoscaler.brokers.redis.piece_reads import PieceReads
from autoscaler.brokers.redis.redis_pieces import (
    MAX_PIECE_BUDGET,
    MIN_PIECE_BUDGET,
    PIECE_BUDGET,
    PIECES_LUA,
)
from autoscaler.brokers.redis.rounds import MAX_ROUNDS, RoundTrips, resp
from autoscaler.brokers.redis.sightings import HeadSightings
from autoscaler.brokers.redis.unacked import (
    Binding,
    Unacked,
    UnackedReads,
    parse_bindings,
    resolve_unacked,
)
from autoscaler.brokers.redis_client import open_redis, redis_identity
from autoscaler.config.metrics_sources import CelerySource
from autoscaler.policy.snapshot import QueueMetrics

WINDOW = 64
"""Oldest messages per priority key whose first sightings bound unstamped ages."""
SCAN_LIMIT = 10_000
"""Messages per priority key examined for ETAs on each read."""
SCAN_BUDGET = 50_000
"""Messages examined for ETAs per read over all keys, beyond each key's window (the total work
of a read; each server call is bounded by the piece budget)."""


class CeleryRedisReader(PieceReads, UnackedReads, HeadSightings, RoundTrips):
    """`MetricsReader` for Celery on Redis (`source: celery` with a redis:// or rediss:// URL).

    `mode="script"` (default) reads the keys with a server-side script run per piece of at most
    `piece_budget` units of work (`redis_pieces`); `mode="pipeline"` sends LLEN + LRANGE of the
    window per key (for servers where scripting is disabled; the script mode falls back to it
    by itself when EVAL is refused: ETAs are then only seen within the window). Either way one
    pipeline per round, one round for most reads.

    Each concern is a base class of its own module: the per-key piece reads (`PieceReads`),
    the in-flight accounting from kombu's unacked index (`UnackedReads`), the head sightings
    (`HeadSightings`), one round trip (`RoundTrips`); `_fetch` here runs the rounds and `read`
    turns what they found into readings.
    """

    def __init__(
        self,
        url: str,
        *,
        layout: CeleryRedisLayout | None = None,
        sightings: SightingsPort | None = None,
        clock: Clock = utc_now,
        timeout: float = 5.0,
        count_in_flight: bool = True,
        mode: Literal["script", "pipeline"] = "script",
        window: int = WINDOW,
        scan_limit: int = SCAN_LIMIT,
        scan_budget: int = SCAN_BUDGET,
        piece_budget: int = PIECE_BUDGET,
    ) -> None:
        self._secrets = Secrets.from_urls(url)
        self._client = open_redis(url, timeout)
        self._sha = hashlib.sha1(PIECES_LUA.encode()).hexdigest()
        self.mode = mode
        self.layout = layout or CeleryRedisLayout()
        self._sightings: SightingsPort = sightings or SightingsMemo()
        self._clock = clock
        self._count_in_flight = count_in_flight
        self.window = max(1, window)
        self.scan_limit = max(0, scan_limit)
        self.scan_budget = max(0, scan_budget)
        self.piece_budget = min(MAX_PIECE_BUDGET, max(MIN_PIECE_BUDGET, piece_budget))
        self.rounds = 0  # round trips of the last read
        self._index_size = 0  # entries in the unacked index at the last read
        self._marked: dict[str, str] = {}  # priority key -> queue, marked on the last read
        # priority key -> (window ids, their first sightings) as last stored: an unchanged
        # window needs no store round trip
        self._windows: dict[str, tuple[tuple[str, ...], list[float]]] = {}
        # flat key index -> (the script's items, parsed, their ids): an unchanged head is not
        # parsed again
        self._items: dict[int, tuple[bytes, tuple[Item, ...], tuple[str, ...]]] = {}
        self._exchanges: set[str] = set()  # exchanges whose binding tables are read each tick
        self._last_queues: list[str] = []
        # (queues, queues per piece) -> the first pass's queue names, encoded
        self._chunks: tuple[tuple[list[str], int], list[tuple[int, bytes]]] | None = None
        self.source_id = f"celery-redis:{redis_identity(url)}:{self.layout.global_keyprefix}"

    def _fetch(
        self, queues: Sequence[str], read_at: datetime
    ) -> tuple[Found, list[bytes], list[bytes], dict[str, list[Binding]]]:
        """Every queue's counts; the values of the unacked entries to count, and of those
        delivered during the read; the binding tables of the known exchanges.

        Round 1 sends the unacked index with its hash values (the first view), then the first
        pass over every queue, then the index again (the second view): one round trip unless
        a list must be continued, the index grew past what its slices covered (the first pass
        goes again behind the rest of the first view) or a binding table takes pages."""
        now = read_at.timestamp()
        lay = self.layout
        nsteps = len(lay.suffixes)
        budget = self.piece_budget
        counting = self._count_in_flight
        found: Found | None = None
        scans: dict[int, ListScan] = {}
        reloaded = False
        first, last = self._views()
        legacy: CursorScan | None = None
        tables = (
            {ex: CursorScan("SSCAN", lay.binding_key(ex), budget) for ex in sorted(self._exchanges)}
            if counting
            else {}
        )
        self.rounds = 0
        while self.rounds < MAX_ROUNDS:
            before: list[bytes] = []
            if counting and not first.done:
                before += [resp(c) for c in first.calls()]
                took_first = True
            elif counting and first.needs_values():
                before += [resp(c) for c in first.value_calls()]
                took_first = True
            else:
                took_first = False
            if (
                counting
                and legacy is None
                and first.done
                and (first.error is not None or (first.size == 0 and first.hash_size > 0))
            ):
                legacy = CursorScan("HSCAN", lay.unacked, budget)  # a hash without kombu's index
            paging = [c for c in ([legacy] if legacy else []) + list(tables.values()) if not c.done]
            before += [resp(c.call()) for c in paging]
            passing = found is None
            tasks: list[Task] = []
            if passing:
                body = self._first_pass(queues, now)
            elif self.mode == "script":
                tasks = tasks_of(
                    (s for s in scans.values() if s.ranges), self.piece_budget, self.window
                )
                body = self._continuations(tasks, now)
            else:
                body = []
            # the second view of the index comes after every key's depth
            late = counting and not last.done
            after = [resp(c) for c in last.calls()] if late else []
            if not before and not body and not after:
                break
            self.rounds += 1
            replies = self._round(before + body + after)
            if took_first:
                first.feed(replies)
            for c in paging:
                c.feed(next(replies))
            if passing:
                # depths read before the first view was complete cannot tell a job held all
                # along from one delivered meanwhile: the pass goes again behind the rest of it
                valid = not counting or first.done
                got = self._take_pass(replies, len(body), queues, read_at, valid)
                if isinstance(got, Exception):
                    reloaded = self._trouble(got, reloaded) or reloaded
                    first, last = self._views(first.expected)  # their slices failed too
                    legacy = None
                elif got is not None:
                    found, scans = got
                    for index, s in scans.items():
                        qi, si = divmod(index, nsteps)
                        s.key = lay.global_keyprefix + queues[qi] + lay.suffixes[si]
                    self._deep_stops(scans)
            elif body:
                results: dict[int, list[bytes]] = {}
                trouble: Exception | None = None
                for _ in body:
                    reply = next(replies)
                    if isinstance(reply, Exception):
                        trouble = trouble or reply
                    else:
                        results.update(parse_piece(reply))
                if trouble is None:
                    self._take_tasks(tasks, results)
                elif not self._trouble(trouble, reloaded):
                    for s in scans.values():  # refused now: what the pieces saw so far stands
                        s.ranges = []
                else:
                    reloaded = True
            if late:
                last.feed(replies)
                if found is None:  # the pass did not count: nor does this view
                    last = self._views(max(first.expected, first.size or 0))[1]
            for _ in replies:  # nothing is left; ends the round
                pass
            if counting and (first.noscript or last.noscript):
                # the script went away between two rounds: load it again, read the view anew
                # (a first view read anew must come before the first pass again)
                if reloaded:
                    raise redis.exceptions.NoScriptError("the script keeps disappearing")
                self._client.script_load(PIECES_LUA)
                reloaded = True
                fresh_first, fresh_last = self._views(first.expected)
                if first.noscript:
                    first, found, scans = fresh_first, None, {}
                last = fresh_last
        if found is None:  # only when MAX_ROUNDS ran out (never in practice)
            raise redis.RedisError("the read did not complete")
        self._index_size = max(first.size or 0, last.size or 0)
        heads = []
        for index, s in scans.items():
            qi = index // nsteps
            found.add(qi, s.depth, min(s.scheduled, s.depth), s.next_due)
            if s.oldest is not None:
                found.aged(qi, max(0.0, now - s.oldest))
            joined = s.joined_items()
            if joined:
                heads.append((index, *self._parsed(index, joined)))
        self._settle(found, heads, 0, 0, queues, read_at)
        return (
            found,
            self._held(first, last, legacy),
            self._delivered(first, last, legacy),
            {
                ex: parse_bindings(list(t.found), lay.sep)
                for ex, t in tables.items()
                if t.error is None
            },
        )

    def read(self, queues: Sequence[str]) -> dict[str, QueueMetrics]:
        now = self._clock()
        now_ts = now.timestamp()
        queues = list(dict.fromkeys(queues))
        if not queues:
            return {}
        if queues != self._last_queues:
            self._items.clear()  # flat key indexes name other keys now
            self._last_queues = queues
        try:
            found, raw_unacked, raw_delivered, bindings = self._fetch(queues, now)
            unacked, exchanges = resolve_unacked(raw_unacked, bindings, now_ts)
            delivered, more = resolve_unacked(raw_delivered, bindings, now_ts)
            if (exchanges | more) - self._exchanges:
                bindings.update(self._bindings_for(exchanges | more))
                unacked, _ = resolve_unacked(raw_unacked, bindings, now_ts)
                delivered, _ = resolve_unacked(raw_delivered, bindings, now_ts)
        except redis.RedisError as exc:
            raise SourceError(safe_error(exc, self._secrets, self.source_id)) from None
        per_queue = len(self.layout.steps)
        suffixes = self.layout.suffixes
        prefix = self.layout.global_keyprefix

        errors: dict[int, str] = {}
        for index, text in found.errors.items():
            qi, si = divmod(index, per_queue)
            key = prefix + queues[qi] + suffixes[si]
            errors.setdefault(qi, self._secrets.scrub(f"key {key!r}: {text}"))
        self._sight(found, queues, now_ts)

        # the queues the pieces could not settle, and those the unacked hash adds to
        for qi in found.open | {qi for qi, q in enumerate(queues) if q in unacked}:
            q = queues[qi]
            error = errors.get(qi)
            if error is not None:
                found.metrics[qi] = failed_metrics(q, now, error)
                continue
            u = unacked.get(q) or Unacked()
            nd = found.next_due[qi]
            if u.next_due is not None:
                nd = u.next_due if nd is None else min(nd, u.next_due)
            found.metrics[qi] = queue_metrics(
                q,
                found.pending[qi],
                found.ages[qi],
                u.due,
                now,
                found.scheduled[qi] + u.scheduled,
                nd,
                u.scheduled,
            )
        metrics = found.metrics
        for qi, q in enumerate(queues):
            d = delivered.get(q)
            if d is not None and d.due and not metrics[qi].stale:
                metrics[qi] = dataclasses.replace(metrics[qi], delivered_during_read=d.due)
        return {q: metrics[qi] for qi, q in enumerate(queues)}

    def close(self) -> None:
        self._client.close()


def build(source: CelerySource, ctx: ReaderBuild) -> CeleryRedisReader:
    """Celery's reader on Redis (`brokers.registry.CELERY_TRANSPORTS`)."""
    return CeleryRedisReader(
        ctx.url,
        layout=redis_layout(source),
        sightings=ctx.sightings,
        clock=ctx.clock,
        timeout=ctx.timeout,
        piece_budget=source.piece_budget,
    )
