"""The outcomes of a fuzz case, their tally, the runners that classify what the product does
with a hostile config file or trace, and `oddly_written` (a number in another script's digits).

Shared by the fast fuzz tests (tests/fuzz/test_*.py) and the long run (benchmarks/fuzz.py). The
generators live beside it: `values` (hostile scalars), `files` (config files and traces) and
`clicases` (whole CLI invocations and the store they run on). Every case ends in one outcome:

- ``accepted``: a valid input, handled (exit 0);
- ``refused``: a clear refusal (ConfigError / TraceError, or exit 2 with a message);
- ``crash``: anything else (another exception, exit 1 "internal error", a traceback);
- ``hang``: the case ran past its time limit (only where a limit is armed: benchmarks).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from hypothesis import strategies as st

from autoscaler.config import ConfigError, load_config
from autoscaler.config.isolation import check_broker_isolation
from autoscaler.config.summary import describe
from autoscaler.sim.trace import TraceError, load_trace

NOW = datetime(2025, 3, 3, 12, 0, tzinfo=UTC)
REPO = Path(__file__).resolve().parents[2]
SIM_CONFIG = REPO / "autoscaler" / "sim" / "traces" / "sim-config.yaml"

OUTCOMES = ("accepted", "refused", "crash", "hang")


class Hang(BaseException):
    """Raised by the benchmark's alarm when a case runs past its time limit."""


@dataclass
class Tally:
    counts: dict[str, dict[str, int]] = field(default_factory=dict)
    examples: list[tuple[str, str, str]] = field(default_factory=list)

    def add(self, family: str, outcome: str, detail: str = "", case: str = "") -> None:
        fam = self.counts.setdefault(family, dict.fromkeys(OUTCOMES, 0))
        fam[outcome] += 1
        if outcome in ("crash", "hang") and len(self.examples) < 20:
            self.examples.append((family, detail[:500], case[:300]))

    def total(self, outcome: str | None = None) -> int:
        return sum(
            n for fam in self.counts.values() for o, n in fam.items() if outcome in (None, o)
        )


# ---------------------------------------------------------------------------- odd numbers

ODD_DIGITS = ["¹", "²", "³", "０", "３", "９", "٠", "٣", "۳", "३"]
"""Digits a paste or another keyboard brings: superscripts, fullwidth, Arabic-Indic (both),
Devanagari. Python's checks and parsers disagree about them (`autoscaler.digits`)."""
ODD_BLANKS = ["\u00a0", "\u2007", "\u202f", "\u200b", "\u2060", "\ufeff"]
"""No-break, figure and narrow no-break spaces; zero-width space, word joiner, BOM."""


@st.composite
def oddly_written(draw: st.DrawFn, text: str) -> str:
    """`text` with one of its numbers written as a word processor or another keyboard writes
    it: one ASCII digit replaced by another script's, or a blank put before, inside or after
    the number."""
    spots = [i for i, c in enumerate(text) if c.isascii() and c.isdigit()]
    if not spots:
        return text + draw(st.sampled_from(ODD_BLANKS))
    i = draw(st.sampled_from(spots))
    if draw(st.booleans()):
        return text[:i] + draw(st.sampled_from(ODD_DIGITS)) + text[i + 1 :]
    at = i + draw(st.sampled_from([0, 1]))
    return text[:at] + draw(st.sampled_from(ODD_BLANKS)) + text[at:]


# ------------------------------------------------------------------------------ runners


def run_config(
    data: bytes,
    workdir: Path,
    env: Mapping[str, str] | None = None,
    broker: str = "redis://127.0.0.1:6379/15",
) -> tuple[str, str]:
    """The path `autoscaler validate` runs, in process: load, isolation check, dry run."""
    path = workdir / "fuzz.yaml"
    path.write_bytes(data)
    try:
        config = load_config(path, {}, store_readable=False)
        refusals = check_broker_isolation(config, broker, "autoscaler-control:", env or {})
        if refusals:
            raise ConfigError(refusals, str(path))
        text = describe(config, config.providers, NOW)
        if "inf" in text.split() or "$inf" in text or "nan" in text.split():
            return "crash", "the dry run prints inf/nan"
    except ConfigError as exc:
        rendered = exc.render()
        if len(rendered) > 20_000:
            return "crash", f"a refusal of {len(rendered)} characters"
        return "refused", ""
    except Hang:
        raise
    except BaseException as exc:
        return "crash", f"{type(exc).__name__}: {str(exc)[:300]}"
    return "accepted", ""


def run_trace(suffix: str, data: bytes, workdir: Path) -> tuple[str, str]:
    path = workdir / f"fuzz{suffix}"
    path.write_bytes(data)
    try:
        load_trace(path)
    except TraceError:
        return "refused", ""
    except Hang:
        raise
    except BaseException as exc:
        return "crash", f"{type(exc).__name__}: {str(exc)[:300]}"
    return "accepted", ""
