"""`create_on_best_offer` across providers, tried hard by hypothesis: whatever each provider
answers to each create (no stock, a gone offer, a refused key, a 429, a refused request, a
create that happened but answered 5xx — found by its label or not yet), one launch never makes
two machines, never creates again after a create of unknown outcome, never calls a provider it
set aside, and never calls a provider it was not given (decide()'s providers in backoff).

The providers here are in-process stand-ins for a provider's API (the interface's five
operations over a dict of machines); the code under test is ours, unmocked.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from autoscaler.config.machine_specs import InstanceSpec
from autoscaler.providers.base import (
    AmbiguousCreateError,
    AuthError,
    CapacityError,
    LaunchSpec,
    MachineStatus,
    NotPlacedError,
    Offer,
    OfferGoneError,
    Provider,
    ProviderMachine,
    ProviderRequestError,
    RateLimitedError,
    create_on_best_offer,
)

INSTALL = "inst1234"
SPEC = InstanceSpec(gpu="RTX 4090", max_price_per_hour=1.0)
ANSWERS = ["ok", "capacity", "gone", "auth", "limited", "refused", "made_5xx", "lost_5xx"]


class Scripted(Provider):
    """A provider whose creates answer from a script, one answer per create."""

    kind = "mock"

    def __init__(
        self,
        name: str,
        script: list[str],
        machines: dict[str, ProviderMachine],
        log: list[tuple[str, str]] | None = None,
    ):
        super().__init__(name, INSTALL)
        self.script = list(script)
        self.machines = machines  # shared by every provider: "how many machines exist"
        self.log = log if log is not None else []  # shared: (provider, answer) of every create
        self.creates = 0

    def find_offers(self, spec: InstanceSpec) -> list[Offer]:  # pragma: no cover - unused
        return []

    def create(self, offer: Offer, launch: LaunchSpec) -> ProviderMachine:
        self.creates += 1
        answer = self.script.pop(0) if self.script else "capacity"
        self.log.append((self.name, answer))
        made = ProviderMachine(
            f"{self.name}-{self.creates}", launch.label, MachineStatus.STARTING, gpu=offer.gpu
        )
        if answer in ("ok", "made_5xx"):
            self.machines[made.provider_instance_id] = made
        if answer == "ok":
            return made
        if answer in ("made_5xx", "lost_5xx"):
            raise AmbiguousCreateError("500 after the create", provider=self.name)
        error: dict[str, Any] = {
            "capacity": CapacityError("no stock"),
            "gone": OfferGoneError("no_such_ask"),
            "auth": AuthError("401"),
            "limited": RateLimitedError("429", retry_after=30),
            "refused": ProviderRequestError("400"),
        }
        raise error[answer]

    def get(self, provider_instance_id: str) -> ProviderMachine | None:
        return self.machines.get(provider_instance_id)

    def list_owned(self) -> list[ProviderMachine]:
        return [m for m in self.machines.values() if m.provider_instance_id.startswith(self.name)]

    def destroy(self, provider_instance_id: str) -> None:  # pragma: no cover - unused
        self.machines.pop(provider_instance_id, None)


@st.composite
def launches(draw):
    names = draw(st.lists(st.sampled_from(["a", "b", "c"]), min_size=1, max_size=3, unique=True))
    scripts = {n: draw(st.lists(st.sampled_from(ANSWERS), max_size=4)) for n in names}
    offers = [
        Offer(n, f"{n}-{i}", "RTX 4090", 1, draw(st.floats(0.1, 1.0)), SPEC)
        for n in names
        for i in range(draw(st.integers(0, 3)))
    ]
    ranked = draw(st.permutations(offers))
    # decide() leaves out providers in backoff: the launch is given only some
    given_names = draw(st.lists(st.sampled_from(names), min_size=1, unique=True))
    return scripts, [o for o in ranked if o.provider in given_names], given_names


@settings(max_examples=600, deadline=None)
@given(launches())
def test_one_launch_never_makes_two_machines_and_never_calls_a_provider_it_may_not(world):
    scripts, ranked, given_names = world
    machines: dict[str, ProviderMachine] = {}
    log: list[tuple[str, str]] = []
    every = {n: Scripted(n, s, machines, log) for n, s in scripts.items()}
    providers = {n: every[n] for n in given_names}
    launch = LaunchSpec.new(INSTALL, "launch1")
    calls: list[str] = []

    def before(name: str) -> bool:
        calls.append(name)
        return True

    try:
        placed = create_on_best_offer(ranked, providers, launch, before)
        outcome = "placed"
    except AmbiguousCreateError:
        placed, outcome = None, "ambiguous"
    except NotPlacedError as exc:
        placed, outcome = None, "not placed"
        assert set(exc.errors) <= set(given_names)
    assert len(machines) <= 1  # never two machines for one launch
    for name, p in every.items():
        if name not in given_names:
            assert p.creates == 0  # a provider left out (in backoff) is never called
    assert sum(p.creates for p in every.values()) == len(calls)  # each create announced first
    # once a create's outcome is unknown, nothing else is created, on any provider
    assert [n for n, _ in log] == calls
    answers = [a for _, a in log]
    if "made_5xx" in answers or "lost_5xx" in answers:
        first = next(i for i, a in enumerate(answers) if a in ("made_5xx", "lost_5xx"))
        assert len(calls) == first + 1
        assert outcome == ("placed" if answers[first] == "made_5xx" else "ambiguous")
    # a provider set aside (key refused, 429, request refused) gets no second create
    for name in set(calls):
        mine = [a for n, a in zip(calls, answers, strict=True) if n == name]
        for i, a in enumerate(mine):
            if a in ("auth", "limited", "refused"):
                assert i == len(mine) - 1, mine
    if placed is not None:
        assert placed.machine.provider_instance_id in machines
        assert placed.offer.provider not in placed.errors


def test_a_create_whose_answer_was_lost_is_found_by_label_not_repeated() -> None:
    machines: dict[str, ProviderMachine] = {}
    first = Scripted("a", ["made_5xx"], machines)
    second = Scripted("b", ["ok"], machines)
    offers = [
        Offer("a", "a-0", "RTX 4090", 1, 0.3, SPEC),
        Offer("b", "b-0", "RTX 4090", 1, 0.4, SPEC),
    ]
    placed = create_on_best_offer(offers, {"a": first, "b": second}, LaunchSpec.new(INSTALL, "l2"))
    assert placed.offer.provider == "a" and second.creates == 0 and len(machines) == 1


def test_a_row_moved_meanwhile_stops_the_launch_before_any_create() -> None:
    machines: dict[str, ProviderMachine] = {}
    a = Scripted("a", ["ok"], machines)
    with pytest.raises(NotPlacedError, match="stopped before its create"):
        create_on_best_offer(
            [Offer("a", "a-0", "RTX 4090", 1, 0.3, SPEC)],
            {"a": a},
            LaunchSpec.new(INSTALL, "l3"),
            lambda name: False,
        )
    assert a.creates == 0 and machines == {}
