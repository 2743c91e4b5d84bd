"""Terminal tables and the numbers in them: ages, money, clock times, padded columns."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

MAX_CELL = 48


def age(seconds: float | None) -> str:
    """45s, 12m05s, 3h05m, 2d04h: two units at most."""
    if seconds is None:
        return "—"
    s = int(max(0.0, seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


def money(value: float | None, digits: int = 2) -> str:
    return "?" if value is None else f"${value:,.{digits}f}"


def clock(at: datetime | None, now: datetime) -> str:
    if at is None:
        return "—"
    return f"{at:%H:%M:%S}" if at.date() == now.date() else f"{at:%Y-%m-%d %H:%M}"


def _cell(value: Any) -> str:
    text = " ".join(str(value).split())
    return text if len(text) <= MAX_CELL else text[: MAX_CELL - 1] + "…"


def table(
    headers: Sequence[str],
    rows: Sequence[Sequence[Any]],
    right: Sequence[int] = (),
    *,
    wide_last: bool = False,
) -> str:
    """Columns padded to their widest cell; `right` columns (numbers) aligned right. Cells are
    one line and at most MAX_CELL characters, but the last column with `wide_last`."""
    cells = [
        [
            _cell(v) if (i < len(r) - 1 or not wide_last) else " ".join(str(v).split())
            for i, v in enumerate(r)
        ]
        for r in rows
    ]
    widths = [len(h) for h in headers]
    for r in cells:
        for i, v in enumerate(r[:-1] if wide_last else r):
            widths[i] = max(widths[i], len(v))
    lines = []
    for r in [list(headers), *cells]:
        parts = []
        for i, v in enumerate(r):
            last = i == len(r) - 1
            if last and wide_last:
                parts.append(v)
            elif i in right:
                parts.append(v.rjust(widths[i]))
            else:
                parts.append(v if last else v.ljust(widths[i]))
        lines.append("  ".join(parts).rstrip())
    return "\n".join(lines)
