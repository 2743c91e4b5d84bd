"""Fuzz the product as an attacker or a careless user would, and count what happens.

    python benchmarks/fuzz.py [--cases 12000] [--timeout 20] [--database-url URL]

Runs the generators of tests/fuzz/ (values.py, files.py, clicases.py) — config files through
the path `autoscaler validate` runs (load, broker isolation check, dry run), job traces, and
whole CLI invocations (validate, apply, providers add/list/remove, history, vault, simulate,
random arguments) on a fresh state store (SQLite unless --database-url) — and prints, per
family, the cases run and their outcomes: accepted, refused, crash, hang (a case past --timeout
seconds), then peak memory. Exits 1 if any case crashed or hung. Goal: ≥ 10⁴ cases, 0 crashes,
0 hangs, peak memory < 200 MB.
"""

from __future__ import annotations

import argparse
import resource
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from tests.fuzz.clicases import CliWorld, cli_cases
from tests.fuzz.files import config_bytes, trace_bytes
from tests.fuzz.harness import OUTCOMES, Hang, Tally, run_config, run_trace
from tests.fuzz.values import GOOD_URLS, HOSTILE_URLS

BATCH = 400


def _alarm(_sig: int, _frame: Any) -> None:
    raise Hang()


def _guarded(tally: Tally, family: str, timeout: float, case: str, fn: Any) -> None:
    signal.setitimer(signal.ITIMER_REAL, timeout)
    try:
        outcome, detail = fn()
    except Hang:
        outcome, detail = "hang", f"over {timeout:g} s"
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
    tally.add(family, outcome, detail, case)


def _settings(n: int, seed: int) -> settings:
    return settings(
        max_examples=n,
        deadline=None,
        phases=[Phase.generate],
        database=None,
        suppress_health_check=list(HealthCheck),
        derandomize=False,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=12_000)
    parser.add_argument("--timeout", type=float, default=20.0, help="seconds per case")
    parser.add_argument("--database-url", default=None)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    signal.signal(signal.SIGALRM, _alarm)
    workdir = Path(tempfile.mkdtemp(prefix="asg-fuzz-bench-"))
    tally = Tally()
    n_config = args.cases * 60 // 100
    n_trace = args.cases * 15 // 100
    n_cli = args.cases - n_config - n_trace
    t0 = time.monotonic()

    world = CliWorld(args.database_url)

    def configs(n: int) -> None:
        @_settings(n, args.seed)
        @given(
            config_bytes(),
            st.sampled_from(GOOD_URLS + HOSTILE_URLS),
            st.sampled_from(["redis://127.0.0.1:6379/0", "redis://h:abc/0", "sqla+sqlite:///b"]),
        )
        def run(data: bytes, watched: str, broker: str) -> None:
            _guarded(
                tally,
                "config (validate path)",
                args.timeout,
                repr(data[:300]),
                lambda: run_config(
                    data, workdir, {"AUTOSCALER_WATCH_BROKER_URL": watched}, broker=broker
                ),
            )

        run()

    def traces(n: int) -> None:
        @_settings(n, args.seed)
        @given(trace_bytes())
        def run(case: tuple[str, bytes]) -> None:
            suffix, data = case
            _guarded(
                tally,
                "trace",
                args.timeout,
                repr(data[:300]),
                lambda: run_trace(suffix, data, workdir),
            )

        run()

    def cli(n: int) -> None:
        @_settings(n, args.seed)
        @given(st.data())
        def run(data: st.DataObject) -> None:
            argv, stdin, env = data.draw(cli_cases(world))
            _guarded(
                tally,
                "cli",
                args.timeout,
                repr((argv, stdin, env))[:300],
                lambda: world.run(argv, stdin, env),
            )

        run()

    # In batches: one long hypothesis run keeps a record of every case it generated (~40 MB
    # per 1,000 cases), which is the fuzzer's memory, not the product's.
    peaks = []
    for family, total in ((configs, n_config), (traces, n_trace), (cli, n_cli)):
        for start in range(0, total, BATCH):
            family(min(BATCH, total - start))
        peaks.append(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024)
    elapsed = time.monotonic() - t0
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024

    width = max(len(f) for f in tally.counts)
    print(f"{'family':<{width}}  {'cases':>6}  " + "  ".join(f"{o:>8}" for o in OUTCOMES))
    for family, counts in tally.counts.items():
        print(
            f"{family:<{width}}  {sum(counts.values()):>6}  "
            + "  ".join(f"{counts[o]:>8}" for o in OUTCOMES)
        )
    print(
        f"{'total':<{width}}  {tally.total():>6}  "
        + "  ".join(f"{tally.total(o):>8}" for o in OUTCOMES)
    )
    print(
        f"{tally.total()} cases in {elapsed:.0f} s; {tally.total('crash')} crashes, "
        f"{tally.total('hang')} hangs; peak memory {peak_mb:.0f} MB (goal: ≥ 10000 cases, "
        "0 crashes, 0 hangs, < 200 MB)"
    )
    print("peak memory after each family (MB): " + ", ".join(map(str, peaks)))
    for family, detail, case in tally.examples:
        print(f"- {family}: {detail}\n    case: {case}")
    if tally.total("crash") or tally.total("hang"):
        sys.exit(1)


if __name__ == "__main__":
    main()
