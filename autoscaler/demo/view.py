"""The demo's live status: a rich table refreshing in place on a terminal, plain lines
otherwise (a line when the numbers change, and one per decision or action with its reason)."""

from __future__ import annotations

import sys
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, TextIO

STATES = ("pending", "creating", "booting", "ready", "draining", "terminating", "terminated")


@dataclass
class Status:
    phase: str = "starting"
    depth: int | None = None
    running: int = 0
    done: int = 0
    published: int = 0
    machines: dict[str, int] = field(default_factory=dict)
    elapsed: float = 0.0

    def machines_text(self) -> str:
        parts = [f"{s} {self.machines[s]}" for s in STATES if self.machines.get(s)]
        parts += [f"{s} {n}" for s, n in sorted(self.machines.items()) if s not in STATES and n]
        return ", ".join(parts) or "none"

    def line(self) -> str:
        depth = "?" if self.depth is None else str(self.depth)
        return (
            f"[{self.elapsed:5.1f}s] {self.phase}: queue depth {depth}, running {self.running}, "
            f"done {self.done}/{self.published}; machines: {self.machines_text()}"
        )


class View:
    """`update(status, new_events)` as often as you like; `close()` once."""

    def __init__(self, out: TextIO | None = None, live: bool | None = None) -> None:
        self.out = out or sys.stdout
        self.live = self.out.isatty() if live is None else live
        self.events: deque[str] = deque(maxlen=10)
        self._last_line = ""
        self._last_print = 0.0
        self._live: Any = None
        if self.live:
            from rich.console import Console
            from rich.live import Live

            self._console = Console(file=self.out)
            self._live = Live(
                self._render(Status()),
                console=self._console,
                refresh_per_second=4,
                transient=False,
            )
            self._live.start()

    def say(self, text: str) -> None:
        if self._live is not None:
            self._live.console.print(text, markup=False, highlight=False)
        else:
            print(text, file=self.out, flush=True)

    def update(self, status: Status, events: list[str]) -> None:
        if self._live is not None:
            self.events.extend(events)
            self._live.update(self._render(status))
            return
        for e in events:
            print(f"  {e}", file=self.out, flush=True)
        line = status.line()
        key = line.split("]", 1)[-1]
        now = time.monotonic()
        if key != self._last_line or now - self._last_print >= 15:
            print(line, file=self.out, flush=True)
            self._last_line, self._last_print = key, now

    def _render(self, status: Status) -> Any:
        from rich.console import Group
        from rich.table import Table
        from rich.text import Text

        top = Table(title=f"autoscaler demo — {status.phase}", expand=True, show_header=False)
        top.add_column("what", style="bold", no_wrap=True)
        top.add_column("now", overflow="fold")
        top.add_row("elapsed", f"{status.elapsed:.0f} s")
        top.add_row("queue depth", "?" if status.depth is None else str(status.depth))
        top.add_row("jobs", f"{status.running} running, {status.done}/{status.published} done")
        top.add_row("machines", status.machines_text())
        log = Table(title="decisions and actions (newest last)", expand=True)
        log.add_column("event", overflow="fold")
        for e in self.events:
            log.add_row(Text(e))
        return Group(top, log)

    def close(self) -> None:
        if self._live is not None:
            self._live.stop()
            self._live = None
