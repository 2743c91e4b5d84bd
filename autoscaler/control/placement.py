"""Placement, the shell around `policy.placement`: one ranked list of offers per launch.

The providers a launch may use (decide()'s `Launch.providers`: those of its queue not in
backoff and not rate-limited when it decided) are asked for offers at once, each bounded by the
queue's `offer_timeout`: one that has not answered by then is skipped for this launch, never
waited for. The offers are ranked by the queue's `placement` rule and tried in that order by
`providers.base.create_on_best_offer` (a capacity error moves to the next offer, on any
provider; never two creates for one launch). What each provider did is returned as a cause per
provider, so the launch backs off exactly the providers that failed it.

Measured (`benchmarks/placement.py`): from the launch's start to the create call, with one
provider answering at once, one slow and one never: the offer limit plus a few milliseconds.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field

from autoscaler.access.credentials import CredentialError
from autoscaler.config import gpus
from autoscaler.config.machine_specs import InstanceSpec
from autoscaler.config.models import Autoscale
from autoscaler.policy.placement import BootTimes, Candidate, rank
from autoscaler.policy.snapshot import BackoffCause
from autoscaler.providers.base import (
    AuthError,
    CapacityError,
    LaunchSpec,
    NotPlacedError,
    Offer,
    Placed,
    Provider,
    ProviderError,
    RateLimitedError,
    create_on_best_offer,
)


@dataclass
class PlacementOutcome:
    """What one launch's providers did: the machine placed (or None), the providers that failed
    it with the cause and text each backs off with, and the 429s to record."""

    placed: Placed | None = None
    failures: dict[str, tuple[BackoffCause, str]] = field(default_factory=dict)
    limited: dict[str, RateLimitedError] = field(default_factory=dict)
    """429s met during this launch: recorded for every process (`control.rate_limits`)."""
    held: dict[str, str] = field(default_factory=dict)
    """Providers not called at all: a rate limit recorded earlier is still in force."""
    stopped: str | None = None
    """Why the launch stopped between two creates (its row was moved meanwhile)."""

    def fail(self, name: str, error: BaseException) -> None:
        """Note `name`'s error under its cause (a 429 is no failure of the rental)."""
        if isinstance(error, RateLimitedError):
            self.limited[name] = error
            return
        self.failures[name] = (cause_of(error), str(error)[:500] or type(error).__name__)


def cause_of(error: BaseException) -> BackoffCause:
    """The cause `status` shows for a provider's failed rental."""
    if isinstance(error, AuthError | CredentialError):
        return "auth"
    if isinstance(error, CapacityError):
        return "capacity"
    if isinstance(error, TimeoutError):
        return "no_answer"
    return "error"


def offers_of(provider: Provider, spec: InstanceSpec, interruptible: bool) -> list[Offer]:
    """One provider's offers: on demand, and for an interruptible launch its bid offers too, at
    the queue's bid (a share of the cheapest on-demand price where the bid is "50%")."""
    offers = provider.find_offers(spec)
    wanted = spec.interruptible if interruptible else None
    if wanted is None:
        return offers
    if isinstance(wanted.bid, str):
        if not offers:
            return offers  # no on-demand price to take the share of
        bid = wanted.price(min(o.price_per_hour for o in offers))
    else:
        bid = wanted.bid
    try:
        return provider.find_bid_offers(spec, bid) + offers
    except ValueError:  # a bid the provider refuses (below its floor): on demand only
        return offers


def gather(
    providers: Mapping[str, Provider],
    spec: InstanceSpec,
    timeout: float,
    outcome: PlacementOutcome,
    interruptible: bool = False,
) -> list[Offer]:
    """Every provider's offers for `spec` (`offers_of`), asked in parallel; a provider that
    fails or has not answered within `timeout` seconds is noted in `outcome` and skipped (its
    thread is left to finish on its own: its HTTP client's own timeout ends it)."""
    if not providers:
        return []
    pool = ThreadPoolExecutor(max_workers=len(providers), thread_name_prefix="offers")
    asked: dict[Future[list[Offer]], str] = {
        pool.submit(offers_of, p, spec, interruptible): name for name, p in providers.items()
    }
    done, late = wait(asked, timeout=timeout)
    pool.shutdown(wait=False, cancel_futures=True)
    offers: list[Offer] = []
    for future in late:
        outcome.fail(asked[future], TimeoutError(f"no offers within {timeout:g}s"))
    for future in done:
        name = asked[future]
        error = future.exception()
        if error is not None:
            outcome.fail(name, error)
            continue
        found = future.result()
        if found:
            offers += found
        else:
            outcome.failures[name] = (
                "no_offer",
                f"{name}: no offer of {', '.join(spec.gpus)} under ${spec.max_price_per_hour:g}/h",
            )
    return offers


def ranked(
    offers: Sequence[Offer], auto: Autoscale, boot_times: BootTimes, fallback_boot: float
) -> list[Offer]:
    """`offers` in the order the launch tries them (`policy.placement.rank`)."""
    positions: dict[str, int] = {}
    candidates: list[tuple[Candidate, Offer]] = []
    for offer in offers:
        index = positions.get(offer.provider, 0)
        positions[offer.provider] = index + 1
        gpu = gpus.canonical(offer.gpu)
        candidates.append((Candidate(offer.provider, gpu, offer.price_per_hour, index), offer))
    by_candidate = {id(c): o for c, o in candidates}
    wanted = tuple(gpus.canonical(g) for g in auto.instance.gpus)
    order = rank(
        [c for c, _ in candidates],
        auto.placement,
        auto.providers,
        wanted,
        boot_times,
        fallback_boot,
    )
    return [by_candidate[id(c)] for c in order]


def place(
    providers: Mapping[str, Provider],
    auto: Autoscale,
    launch: LaunchSpec,
    boot_times: BootTimes,
    fallback_boot: float,
    before_create: Callable[[str], bool],
    outcome: PlacementOutcome,
    interruptible: bool = False,
) -> PlacementOutcome:
    """Gather, rank and rent (see the module): `outcome.placed` is the machine, or None with
    every provider's cause in `outcome`. `interruptible`: the launch may rent at the queue's bid
    (decide() keeps the share within `max_share`); bid offers rank with the others at their
    bid. An ambiguous create (or an unexpected error once a
    create may have left) is raised for the launch to leave to reconcile."""
    offers = gather(providers, auto.instance, auto.offer_timeout, outcome, interruptible)
    order = ranked(offers, auto, boot_times, fallback_boot)
    try:
        outcome.placed = create_on_best_offer(order, providers, launch, before_create)
    except NotPlacedError as exc:
        for name, error in exc.errors.items():
            outcome.fail(name, error)
        if not exc.errors:
            outcome.stopped = str(exc)
        return outcome
    for name, error in outcome.placed.errors.items():
        outcome.fail(name, error)
    return outcome


def placement_error(outcome: PlacementOutcome) -> ProviderError:
    """One error saying why nothing was rented, naming every provider's cause."""
    parts = [f"{name}: {text}" for name, (_, text) in outcome.failures.items()]
    parts += [f"{name}: rate limited ({exc})" for name, exc in outcome.limited.items()]
    parts += list(outcome.held.values())
    parts += [outcome.stopped] if outcome.stopped else []
    return ProviderError("nothing rented; " + "; ".join(parts) if parts else "no offer at all")
