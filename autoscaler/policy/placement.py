"""Placement: which provider's offer a launch tries first, when a queue lists several.

Pure: the shell (`control.placement`) gathers the offers of every listed provider that is not
waiting, turns them into `Candidate`s and tries them in the order `rank()` gives; the
simulator ranks its virtual offers with the same function.

- `cheapest`: by price. Offers within `TIE` of the cheapest still unranked form a band, and a
  band goes by observed boot time (a few cents an hour buy minutes of waiting), then by the
  order the user wrote.
- `in_order`: the provider list is a preference: the first provider's offers first, each
  provider's in the GPU order written, then by price.
- `fastest`: the lowest observed boot time first, then by price.

A (provider, GPU) that has never booted is given the queue's fallback estimate, so a new
provider is neither shunned nor favoured by `fastest` until it has been measured.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

Rule = Literal["cheapest", "in_order", "fastest"]

TIE = 0.05
"""Offers priced within 5 % of each other are a tie for `cheapest`: the faster boot wins."""


@dataclass(frozen=True)
class Candidate:
    """One offer as placement sees it. `gpu` is the table's name (`config.gpus`) where it is
    known, else the provider's own; `index` its place in its provider's answer."""

    provider: str
    gpu: str
    price_per_hour: float
    index: int = 0


BootTimes = Mapping[tuple[str, str], float]
"""Observed boot seconds (median) per (provider, GPU)."""


def rank(
    candidates: Sequence[Candidate],
    rule: Rule,
    providers: Sequence[str],
    gpus: Sequence[str],
    boot_times: BootTimes,
    fallback_boot: float,
) -> list[Candidate]:
    """The candidates in the order a launch tries them (a stable, total order)."""

    def preference(c: Candidate) -> tuple[int, int, int]:
        prov = providers.index(c.provider) if c.provider in providers else len(providers)
        gpu = gpus.index(c.gpu) if c.gpu in gpus else len(gpus)
        return prov, gpu, c.index

    def boot(c: Candidate) -> float:
        return boot_times.get((c.provider, c.gpu), fallback_boot)

    if rule == "in_order":
        return sorted(candidates, key=lambda c: (*preference(c)[:2], c.price_per_hour, c.index))
    if rule == "fastest":
        return sorted(candidates, key=lambda c: (boot(c), c.price_per_hour, preference(c)))
    by_price = sorted(candidates, key=lambda c: (c.price_per_hour, preference(c)))
    ranked: list[Candidate] = []
    while by_price:
        top = by_price[0].price_per_hour * (1 + TIE)
        band = [c for c in by_price if c.price_per_hour <= top]
        by_price = by_price[len(band) :]
        ranked += sorted(band, key=lambda c: (boot(c), c.price_per_hour, preference(c)))
    return ranked
