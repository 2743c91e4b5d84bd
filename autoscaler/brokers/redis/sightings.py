"""The reader's glue to head sightings: the first-sighting times of the oldest messages of a
list whose head is unstamped (`brokers.marks`, persisted through the `Sightings` port), which
bound those messages' ages; a window unchanged since the last read needs no store round trip."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence

from autoscaler.brokers.base import Mark
from autoscaler.brokers.base import Sightings as SightingsPort
from autoscaler.brokers.marks import ID_HASH_CHARS, WindowMarks, advance_window, id_hash
from autoscaler.brokers.redis.found import Found
from autoscaler.brokers.redis.heads import Item, head_age

log = logging.getLogger(__name__)


class HeadSightings:
    """Keeps the marks of every windowed priority key of the reader's source."""

    source_id: str
    _sightings: SightingsPort
    _marked: dict[str, str]
    _windows: dict[str, tuple[tuple[str, ...], list[float]]]

    def _sight(self, found: Found, queues: Sequence[str], now_ts: float) -> None:
        """Ages from the first sightings of the windows this read found new or changed (the
        store's marks advanced), and the marks of keys no longer windowed forgotten."""
        windows = found.windows
        read_now = set(queues)
        forget = [k for k, q in self._marked.items() if k not in windows and q in read_now]
        changed = {
            key: (qi, items)
            for key, (qi, items, idents) in windows.items()
            if (cached := self._windows.get(key)) is None or cached[0] != idents
        }
        if changed or forget:
            seen = self._first_sightings(changed, forget, now_ts)
            for key in forget:
                self._marked.pop(key, None)
                self._windows.pop(key, None)
            for key, (qi, items) in changed.items():
                self._marked[key] = queues[qi]
                found.aged(qi, head_age(items, now_ts, seen.get(key)))

    def _first_sightings(
        self,
        windows: Mapping[str, tuple[int, tuple[Item, ...]]],
        forget: Sequence[str],
        now: float,
    ) -> dict[str, list[float]]:
        """Advance the marks of every windowed key (and forget keys no longer windowed) in one
        store transaction; the first-sighting time of each item of each window."""
        seen: dict[str, list[float]] = {}

        def update(prior: dict[str, Mark]) -> dict[str, Mark | None]:
            new: dict[str, Mark | None] = {k: None for k in forget}
            for key, (_, items) in windows.items():
                text, at = prior.get(key, (None, None))
                marks, first = advance_window(
                    WindowMarks.decode(text, at), [_short(it.ident) for it in items], now
                )
                seen[key] = first
                new[key] = marks.encode()
            return new

        try:
            self._sightings.update_marks(self.source_id, [*windows, *forget], update)
        except Exception as exc:  # the store is down: ages unknown, counts kept
            log.warning("head sightings of %s unavailable: %s", self.source_id, type(exc).__name__)
            return {}
        for key, (_, items) in windows.items():
            self._windows[key] = (tuple(it.ident for it in items), seen[key])
        return seen


def _short(ident: str) -> str:
    """The 10-hex hash a window keeps: the script's "sha1:<hash>" cut, an id hashed."""
    return ident[5 : 5 + ID_HASH_CHARS] if ident.startswith("sha1:") else id_hash(ident)
