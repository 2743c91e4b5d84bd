"""The lists' side of a read in pieces: how many queues a first-round piece takes, the script's
answers parsed, and the lists a first round did not finish (`ListScan`) cut into tasks and
packed into pieces of about the budget for the next round (`redis_pieces` has the script and
why its calls stay short)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field

from autoscaler.brokers.redis.redis_pieces import BATCH


def queue_cost(nsteps: int) -> int:
    """Units the LLEN / EXISTS pass of one queue may spend at most."""
    return 1 if nsteps <= 1 else nsteps + 1


def queues_per_piece(nsteps: int, budget: int) -> int:
    """Queues in one first-round piece: their keys take at most half the budget, the rest
    scans their heads."""
    return max(1, (budget // 2) // queue_cost(nsteps))


Items = tuple[tuple[str, float | None, float | None], ...]
"""(id, stamp, eta) of messages from a list's head, as the script returned them."""


def parse_float(raw: bytes) -> float | None:
    if not raw:
        return None
    try:
        return float(raw)
    except ValueError:
        return None


def parse_items(raw: bytes) -> Items:
    out = []
    for part in raw.split(b" "):
        ident, _, rest = part.partition(b",")
        stamp, _, eta = rest.partition(b",")
        out.append((ident.decode(errors="replace"), parse_float(stamp), parse_float(eta)))
    return tuple(out)


@dataclass(slots=True)
class Range:
    """Messages [lo, hi) of a list still to examine (logical positions: from the head as it
    was when the list was counted), behind the anchor: the message whose SHA-1 is `anchor`,
    followed by position `after`, physically at `phys` when last seen ('' and 0 at the head).
    `settled` / `want`: the state of the head's items (see the script)."""

    lo: int
    hi: int
    after: int = 0
    phys: int = 0
    anchor: str = ""
    settled: bool = False
    want: bool = False

    def collecting(self, window: int) -> bool:
        return self.lo < window and (not self.settled or self.want)


@dataclass(slots=True)
class ListScan:
    """One non-empty priority key whose scan goes on over several pieces."""

    index: int
    key: str
    depth: int
    stop: int = 0  # messages to examine for ETAs this read
    scheduled: int = 0
    next_due: float | None = None
    oldest: float | None = None
    items: list[bytes] = field(default_factory=list)
    ranges: list[Range] = field(default_factory=list)
    restarts: int = 0

    def fold(self, fields: Sequence[bytes]) -> Range | None:
        """Add one answer line's counts; where to go on (hi still to be set), if anywhere."""
        self.scheduled += int(fields[3])
        nd = parse_float(fields[4])
        if nd is not None:
            self.next_due = nd if self.next_due is None else min(self.next_due, nd)
        old = parse_float(fields[5])
        if old is not None:
            self.oldest = old if self.oldest is None else min(self.oldest, old)
        if fields[6]:
            self.items.append(fields[6])
        if len(fields) < 12:
            return None
        return Range(
            int(fields[7]),
            0,
            int(fields[8]),
            int(fields[9]),
            fields[11].decode(),
            b"s" in fields[10],
            b"w" in fields[10],
        )

    def target(self, rng: Range, window: int) -> int:
        """Where a range starting at rng.lo ends: the scan stop, or the window's end while the
        head's items are still being collected."""
        hi = max(self.stop, window) if rng.collecting(window) else self.stop
        return min(self.depth, hi)

    def restart(self, window: int) -> None:
        """Scan again from the head (an anchor was lost): the counts of this key restart."""
        self.restarts += 1
        self.scheduled, self.next_due, self.oldest, self.items = 0, None, None, []
        head = Range(0, 0)
        head.hi = self.target(head, window)
        self.ranges = [head]

    def joined_items(self) -> bytes:
        return b" ".join(self.items)


Task = tuple[ListScan, Range, int, int]
"""One piece of work: the list, the range it belongs to, and the positions [lo, hi) to examine."""


def tasks_of(scans: Iterable[ListScan], budget: int, window: int) -> list[Task]:
    """This round's work: a range still collecting the head's items goes on from where it
    stopped (its pieces are sequential); any other range is cut into segments of about a
    piece each, every one found behind the range's anchor - all examined in one round."""
    seg = max(1, (budget - 6) * BATCH // (BATCH + 1))  # an anchor check, an LRANGE per batch
    out: list[Task] = []
    for s in scans:
        for r in s.ranges:
            if r.collecting(window):
                out.append((s, r, r.lo, r.hi))
                continue
            for lo in range(r.lo, r.hi, seg):
                out.append((s, r, lo, min(r.hi, lo + seg)))
    return out


def task_args(number: int, task: Task) -> list[str | int]:
    s, r, lo, hi = task
    flags = ("s" if r.settled else "") + ("w" if r.want else "")
    return [number, s.key, s.depth, lo, r.after, r.phys, flags, hi, r.anchor]


def pack(tasks: Sequence[Task], budget: int, window: int) -> list[list[int]]:
    """Task numbers grouped into pieces of about `budget` units."""
    pieces: list[list[int]] = []
    current: list[int] = []
    used = 0
    for number, (_, _, lo, hi) in enumerate(tasks):
        est = min(budget, 3 + hi - lo + -(-(hi - lo) // BATCH))
        if current and used + est > budget:
            pieces.append(current)
            current, used = [], 0
        current.append(number)
        used += est
    if current:
        pieces.append(current)
    return pieces


def parse_piece(reply: bytes | None) -> Iterator[tuple[int, list[bytes]]]:
    """(flat key index, fields) per line of one piece's answer (fields[1] is b"E" for a key
    of the wrong type, the error text after it)."""
    if not reply:
        return
    for line in reply.split(b"\n"):
        fields = line.split(b"\t")
        if len(fields) >= 3:
            yield int(fields[0]), fields
