"""A queue naming several acceptable GPUs: each provider searches for every one, by its own
identifier from the GPU table (`config.gpus`), and its own filters still narrow the offers."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.orm import Session, sessionmaker

from autoscaler.config.gpus import canonical
from autoscaler.config.provider_options import LocalOptions, MockOptions
from autoscaler.providers.local import LocalProvider
from autoscaler.providers.mock import MockProvider
from autoscaler.providers.runpod import runpod_ids
from autoscaler.providers.vast import vast_names
from autoscaler.store.mock_machines import StoredMockMachines
from tests.containers.engine import Engine
from tests.fakes.runpod_server import DEFAULT_GPUS, FakeRunPod
from tests.fakes.vast_server import FakeVast, default_offers
from tests.providers.conftest import (
    INSTALLATION,
    SECRET,
    VAST_SECRET,
    make_container,
    make_runpod,
    make_vast,
    spec,
)

# ---------------------------------------------------------------- RunPod


def test_runpod_offers_every_gpu_of_the_queue_in_preference_order(
    fake_runpod: FakeRunPod,
) -> None:
    rp = make_runpod(fake_runpod)  # no gpu_types: the queue's GPUs
    # 3090 costs 0.43 secure, A5000 0.29: the order written wins, not the price.
    offers = rp.find_offers(spec(gpu=["rtx_3090", "RTX A5000"]))
    assert [o.offer_id for o in offers] == ["NVIDIA GeForce RTX 3090", "NVIDIA RTX A5000"]
    assert [canonical(o.gpu) for o in offers] == ["RTX 3090", "RTX A5000"]
    offers = rp.find_offers(spec(gpu=["NVIDIA RTX A5000", "RTX 3090"]))
    assert [o.offer_id for o in offers] == ["NVIDIA RTX A5000", "NVIDIA GeForce RTX 3090"]
    # The table's name finds RunPod's id even where RunPod displays another name ("A100 PCIe").
    (a100,) = rp.find_offers(spec(gpu=["A100 80GB", "H100 SXM"], max_price_per_hour=2.0))
    assert a100.offer_id == "NVIDIA A100 80GB PCIe"


def test_runpod_skips_what_it_does_not_offer_and_what_the_cap_or_stock_rule_out(
    fake_runpod: FakeRunPod,
) -> None:
    rp = make_runpod(fake_runpod)
    # GTX 1080 Ti: Vast lists it, RunPod does not; 4090: 0.69 secure, above the cap.
    offers = rp.find_offers(spec(gpu=["GTX 1080 Ti", "RTX 4090", "RTX 3090"]))
    assert [o.offer_id for o in offers] == ["NVIDIA GeForce RTX 3090"]
    fake_runpod.stock["NVIDIA GeForce RTX 3090"] = 0
    assert rp.find_offers(spec(gpu=["GTX 1080 Ti", "RTX 4090", "RTX 3090"])) == []


def test_runpod_gpu_types_still_win_over_the_queues_gpus(fake_runpod: FakeRunPod) -> None:
    rp = make_runpod(fake_runpod, gpu_types=("NVIDIA RTX A5000",))
    offers = rp.find_offers(spec(gpu=["RTX 3090", "RTX 4090"]))
    assert [o.offer_id for o in offers] == ["NVIDIA RTX A5000"]
    # gpu_types may be written as the table's names too; one GPU twice is one offer.
    rp = make_runpod(fake_runpod, gpu_types=("A100 80GB", "rtx_3090", "NVIDIA GeForce RTX 3090"))
    offers = rp.find_offers(spec(gpu="RTX A5000", max_price_per_hour=2.0))
    assert [o.offer_id for o in offers] == ["NVIDIA A100 80GB PCIe", "NVIDIA GeForce RTX 3090"]


@contextmanager
def runpod_with(gpus: list[dict[str, Any]]) -> Iterator[FakeRunPod]:
    fake = FakeRunPod(SECRET, gpus)
    try:
        yield fake
    finally:
        fake.close()
    assert fake.spec_violations == [], fake.spec_violations


def test_runpod_takes_a_gpu_the_table_does_not_know_as_written() -> None:
    new = {"id": "NVIDIA Z9000", "name": "Z9000", "memory": 96, "secure": 0.5, "community": 0.4}
    with runpod_with([*DEFAULT_GPUS, new]) as fake:
        rp = make_runpod(fake)
        offers = rp.find_offers(spec(gpu=["NVIDIA Z9000", "RTX 3090"]))
        assert [o.offer_id for o in offers] == ["NVIDIA Z9000", "NVIDIA GeForce RTX 3090"]
    assert runpod_ids(("Z9000", "rtx 3090", "RTX_3090", "GTX 1080 Ti")) == [
        "Z9000",
        "NVIDIA GeForce RTX 3090",
    ]


# ---------------------------------------------------------------- Vast


def market() -> list[dict[str, Any]]:
    """The fake's 4090s, two of them turned into a 3090 and an A100 PCIE."""
    offers = default_offers()
    for o, name in ((offers[1], "RTX 3090"), (offers[3], "A100 PCIE")):  # 5002, 5004
        o["gpu_name"] = name
    return offers


@contextmanager
def vast_with(offers: list[dict[str, Any]]) -> Iterator[FakeVast]:
    fake = FakeVast(VAST_SECRET, offers)
    try:
        yield fake
    finally:
        fake.close()
    assert fake.spec_violations == [], fake.spec_violations


def test_vast_searches_every_gpu_of_the_queue_with_in(
    sqlite_sessions: sessionmaker[Session],
) -> None:
    with vast_with(market()) as fake:
        vast = make_vast(fake, sqlite_sessions)
        offers = vast.find_offers(spec(gpu=["NVIDIA GeForce RTX 3090", "rtx_4090"]))
        assert fake.searches[-1]["gpu_name"] == {"in": ["RTX 3090", "RTX 4090"]}
        # Cheapest first across both (placement ranks GPUs by canonical name); no A100.
        assert {o.gpu for o in offers} == {"RTX 3090", "RTX 4090"}
        # 5004 is the A100; 5005 unverified, 5007 small disk, 5008 over the cap.
        assert [o.offer_id for o in offers] == ["5001", "5002", "5003", "5006", "5009"]


def test_vast_one_gpu_is_eq_by_vasts_own_name(sqlite_sessions: sessionmaker[Session]) -> None:
    with vast_with(market()) as fake:
        vast = make_vast(fake, sqlite_sessions)
        offers = vast.find_offers(spec(gpu="A100 80GB", max_price_per_hour=1.0))
        assert fake.searches[-1]["gpu_name"] == {"eq": "A100 PCIE"}
        assert [(o.offer_id, o.gpu) for o in offers] == [("5004", "A100 PCIE")]


def test_vast_filters_still_narrow_a_search_of_several_gpus(
    sqlite_sessions: sessionmaker[Session],
) -> None:
    with vast_with(market()) as fake:
        vast = make_vast(fake, sqlite_sessions, countries=("US",), min_bandwidth_mbps=200)
        offers = vast.find_offers(spec(gpu=["RTX 3090", "A100 80GB", "RTX 4090"]))
        body = fake.searches[-1]
        assert body["gpu_name"] == {"in": ["RTX 3090", "A100 PCIE", "RTX 4090"]}
        assert body["geolocation"] == {"in": ["US"]} and body["inet_down"] == {"gte": 200}
        # 5001 FR, 5003 150 Mb/s, 5004 CA, 5005 unverified, 5007 small disk, 5008 over cap.
        assert [o.offer_id for o in offers] == ["5002", "5006", "5009"]


def test_vast_leaves_out_what_it_does_not_list(sqlite_sessions: sessionmaker[Session]) -> None:
    with vast_with(market()) as fake:
        vast = make_vast(fake, sqlite_sessions)
        assert vast.find_offers(spec(gpu=["B300", "MI300X"])) == []  # RunPod's alone
        assert fake.searches == []  # nothing to search for: not asked
        vast.find_offers(spec(gpu=["B300", "RTX 3090"]))
        assert fake.searches[-1]["gpu_name"] == {"eq": "RTX 3090"}
    assert vast_names(("Z9000", "RTX_3090", "NVIDIA GeForce RTX 3090", "B300")) == [
        "Z9000",
        "RTX 3090",
    ]


# ---------------------------------------------------------------- mock, local, container


def test_mock_and_local_offer_the_first_gpu_of_any_names(
    sqlite_sessions: sessionmaker[Session], tmp_path: Path
) -> None:
    mock = MockProvider(
        "demo",
        MockOptions.model_validate({"kind": "mock"}),
        INSTALLATION,
        StoredMockMachines(sqlite_sessions),
    )
    (offer,) = mock.find_offers(spec(gpu=["Imaginary 9", "RTX 4090"]))
    assert (offer.gpu, offer.offer_id) == ("Imaginary 9", "mock:Imaginary 9")
    local = LocalProvider(
        "here", LocalOptions.model_validate({"kind": "local"}), INSTALLATION, tmp_path
    )
    (offer,) = local.find_offers(spec(gpu=["my laptop's GPU", "RTX 4090"]))
    assert offer.gpu == "my laptop's GPU"


def test_container_offers_its_gpu_when_any_of_the_queues_matches(
    podman_engine: Engine, installations: Callable[[], str]
) -> None:
    image = podman_engine.image
    box = make_container(podman_engine, installations(), gpus=1, gpu="NVIDIA GeForce RTX 4090")
    (offer,) = box.find_offers(spec(image=image, gpu=["A100 80GB", "rtx_4090"]))
    assert offer.gpu == "NVIDIA GeForce RTX 4090"  # its declared GPU, as the engine has it
    assert box.find_offers(spec(image=image, gpu=["A100 80GB", "H100 SXM"])) == []
    rig = make_container(podman_engine, installations(), gpus=1, gpu="Team Rig 1")
    assert rig.find_offers(spec(image=image, gpu=["RTX 4090", "team  rig 1"]))
    assert rig.find_offers(spec(image=image, gpu=["RTX 4090"])) == []


@pytest.mark.parametrize("gpu", ["RTX 4090", ("RTX 3090", "RTX 4090")])
def test_the_spec_reads_one_gpu_or_several(gpu: str | tuple[str, ...]) -> None:
    assert spec(gpu=gpu).gpus[-1] == "RTX 4090"
