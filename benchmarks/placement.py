"""Placement across providers: from a launch's start to its create call, with two providers
that answer offers badly — RunPod slow, Vast not at all.

    python benchmarks/placement.py [--trials 3] [--slow 1.5] [--offer-timeout 3] [--http-read 8]

The project's RunPod and Vast fakes (tests/fakes: real HTTP on loopback, the real APIs' paths
and bodies) with the real provider clients: RunPod's catalog answers after `--slow` seconds,
Vast's search never answers (its client gives up at its own read timeout, `--http-read`).
Measured per trial, the seconds until the create call would leave (the launch is stopped just
before it, so nothing is rented):

  parallel   `control.placement`: every provider asked at once, each bounded by the queue's
             `offer_timeout` (the provider that does not answer is skipped this round);
  one by one the baseline in the same run: each provider asked in turn and waited for until its
             HTTP client gives up, retries included (a loop over the list without a bound).

Measured on this 2-core machine (3 trials, slow 1.5 s, offer limit 3 s, read timeout 8 s):
parallel 3.05 s median (the offer limit + 50 ms), one by one 36.5 s median (RunPod's 1.5 s,
then Vast's client waiting out its read timeout on each of its retries): 12× sooner, and
bounded by the offer limit whatever a provider does.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from autoscaler.config import load_config_text  # noqa: E402
from autoscaler.control import placement  # noqa: E402
from autoscaler.providers.base import LaunchSpec, Offer, ProviderError  # noqa: E402
from autoscaler.providers.registry import build_provider  # noqa: E402
from autoscaler.store.db import make_engine, session_factory  # noqa: E402
from autoscaler.store.models import Base  # noqa: E402
from tests.fakes.runpod_server import FakeRunPod  # noqa: E402
from tests.fakes.vast_server import FakeVast  # noqa: E402

RUNPOD_KEY = "rpa_BENCH_placement_not_a_real_key"
VAST_KEY = "vast_BENCH_placement_not_a_real_key"
INSTALL = "bench123"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trials", type=int, default=3)
    ap.add_argument("--slow", type=float, default=1.5, help="seconds RunPod's offers take")
    ap.add_argument("--offer-timeout", type=float, default=3.0)
    ap.add_argument("--http-read", type=float, default=8.0, help="the clients' read timeout")
    args = ap.parse_args()

    runpod, vast = FakeRunPod(RUNPOD_KEY), FakeVast(VAST_KEY)
    runpod.delay_catalog = args.slow
    vast.hold_search = threading.Event()
    folder = tempfile.mkdtemp(prefix="placement-bench-")
    engine = make_engine(f"sqlite:///{folder}/state.db")
    Base.metadata.create_all(engine)
    config = load_config_text(
        f"""
providers:
  pods: {{kind: runpod, base_url: "{runpod.url}", api_key_env: X, cloud_type: COMMUNITY}}
  vast: {{kind: vast, base_url: "{vast.url}", api_key_env: Y}}
queues:
  render:
    autoscale:
      provider: [vast, pods]
      offer_timeout: {args.offer_timeout}
      max_workers: 1
      instance: {{gpu: "RTX 4090", max_price_per_hour: 0.8}}
"""
    )
    auto = config.queues["render"].autoscale
    assert auto is not None
    keys = {"pods": RUNPOD_KEY, "vast": VAST_KEY}
    providers = {
        name: build_provider(
            name,
            config.providers[name],
            credential=keys[name],
            installation_id=INSTALL,
            sessions=session_factory(engine),
            timeout=(2.0, args.http_read),
        )
        for name in ("vast", "pods")
    }
    launch = LaunchSpec.new(INSTALL, "benchlaunch")
    parallel, serial = [], []
    try:
        for trial in range(args.trials):
            started = time.perf_counter()
            at: list[float] = []

            def stop_at_create(name: str, at: list[float] = at, t0: float = started) -> bool:
                at.append(time.perf_counter() - t0)
                return False  # stop just before the create: nothing is rented

            outcome = placement.PlacementOutcome()
            placement.place(providers, auto, launch, {}, 300.0, stop_at_create, outcome)
            parallel.append(at[0])
            skipped = sorted(n for n, (cause, _) in outcome.failures.items())

            started = time.perf_counter()
            offers: list[Offer] = []
            for provider in providers.values():  # the baseline: one by one, unbounded
                with contextlib.suppress(ProviderError):
                    offers += provider.find_offers(auto.instance)
            placement.ranked(offers, auto, {}, 300.0)
            serial.append(time.perf_counter() - started)
            print(
                f"trial {trial + 1}: parallel {parallel[-1]:.2f} s (skipped: "
                f"{', '.join(skipped) or 'none'}), one by one {serial[-1]:.2f} s",
                flush=True,
            )
    finally:
        vast.hold_search.set()
        runpod.close()
        vast.close()
    p, s = statistics.median(parallel), statistics.median(serial)
    print(
        f"\nlaunch start → create call, median of {args.trials}: parallel {p:.2f} s "
        f"(offer limit {args.offer_timeout:g} s), one by one {s:.2f} s; {s / p:.1f}× sooner"
    )


if __name__ == "__main__":
    main()
