"""Vast.ai interruptible (bid) instances against the fake, over real HTTP: bid offers searched
with `type: bid` and priced at our bid, offers whose minimum bid is above ours skipped, the
create sends the bid as `price`, an outbid instance reads STOPPED with `raw_status` "outbid"
(and may run again by itself), and the on-demand path is untouched."""

from __future__ import annotations

import time
import uuid
from typing import Any

import pytest
from sqlalchemy.orm import Session, sessionmaker

from autoscaler.providers import (
    LaunchSpec,
    MachineStatus,
    Offer,
    OfferGoneError,
    create_on_first_offer,
)
from autoscaler.providers.vast import VastProvider, machine_status, raw_status
from tests.fakes.vast_server import FakeVast
from tests.providers.conftest import INSTALLATION, make_vast, spec

FILTERS: dict[str, Any] = {
    "countries": ("US", "CA"),
    "min_bandwidth_mbps": 200,
    "min_cuda_version": 12.1,
    "min_reliability": 0.95,
}
DETAIL_KEYS = {"host_id", "geolocation", "reliability", "cuda_max_good", "inet_down", "disk_space"}


def launch() -> LaunchSpec:
    return LaunchSpec.new(INSTALLATION, uuid.uuid4().hex, {"QUEUE": "inference"})


def vast_at(fake: FakeVast, sessions: sessionmaker[Session]) -> VastProvider:
    return make_vast(fake, sessions, **FILTERS)


def bid_instance(
    fake: FakeVast, sessions: sessionmaker[Session], bid: float = 0.30
) -> tuple[VastProvider, str]:
    """An interruptible instance of ours, running (the fake boots at once)."""
    vast = vast_at(fake, sessions)
    machine = vast.create(vast.find_bid_offers(spec(), bid)[0], launch())
    got = vast.get(machine.provider_instance_id)
    assert got is not None and got.status is MachineStatus.RUNNING
    return vast, machine.provider_instance_id


# ---------------------------------------------------------------- search


def test_bid_offers_are_searched_as_bids_and_priced_at_the_bid(
    fake_vast: FakeVast, sqlite_sessions: sessionmaker[Session]
) -> None:
    vast = vast_at(fake_vast, sqlite_sessions)
    offers = vast.find_bid_offers(spec(), 0.30)
    # The on-demand filters still hold (5002 and 5004 pass them), both minimum bids under 0.30;
    # the lowest minimum bid first.
    assert [o.offer_id for o in offers] == ["5002", "5004"]
    assert all(o.price_per_hour == 0.30 for o in offers)
    first = offers[0]
    assert first.host_id == "102" and first.gpu == "RTX 4090" and first.gpu_count == 1
    assert first.details["interruptible"] is True and first.details["bid"] == 0.30
    assert first.details["min_bid"] == 0.17 and offers[1].details["min_bid"] == 0.23
    assert set(first.details) >= DETAIL_KEYS
    body = fake_vast.searches[-1]
    assert body["type"] == "bid" and body["min_bid"] == {"lte": 0.30}
    assert body["order"] == [["min_bid", "asc"]] and "dph_total" not in body
    assert body["verified"] == {"eq": True} and body["geolocation"] == {"in": ["US", "CA"]}
    assert body["disk_space"] == {"gte": 50} and body["allocated_storage"] == 50


def test_offers_whose_minimum_bid_is_above_ours_are_skipped(
    fake_vast: FakeVast, sqlite_sessions: sessionmaker[Session]
) -> None:
    vast = vast_at(fake_vast, sqlite_sessions)
    assert [o.offer_id for o in vast.find_bid_offers(spec(), 0.20)] == ["5002"]  # 5004: 0.23
    # Client side too, when the answer holds more than asked (the market moved since).
    fake_vast.ignore_search_filters = {"min_bid"}
    fake_vast.offers[5002]["min_bid"] = 0.21
    assert vast.find_bid_offers(spec(), 0.20) == []
    assert [o.offer_id for o in vast.find_bid_offers(spec(), 0.22)] == ["5002"]
    # an offer that does not say its minimum bid cannot be bid on blindly
    del fake_vast.offers[5002]["min_bid"]
    assert [o.offer_id for o in vast.find_bid_offers(spec(), 0.25)] == ["5004"]


@pytest.mark.parametrize("bid", [0.61, 0.0, -0.1, 0.0001, float("nan"), True])
def test_a_bid_vast_would_refuse_or_above_the_cap_searches_nothing(
    fake_vast: FakeVast, sqlite_sessions: sessionmaker[Session], bid: float
) -> None:
    vast = vast_at(fake_vast, sqlite_sessions)
    with pytest.raises(ValueError, match="bid"):
        vast.find_bid_offers(spec(max_price_per_hour=0.60), bid)
    assert fake_vast.searches == []


# ---------------------------------------------------------------- create


def test_the_create_sends_the_bid_and_the_instance_is_listed_as_a_bid(
    fake_vast: FakeVast, sqlite_sessions: sessionmaker[Session]
) -> None:
    vast = vast_at(fake_vast, sqlite_sessions)
    lx = launch()
    m = vast.create(vast.find_bid_offers(spec(), 0.30)[0], lx)
    assert m.status is MachineStatus.STARTING and m.price_per_hour == 0.30 and m.host_id == "102"
    put = fake_vast.calls("PUT", "/api/v0/asks/5002/")[0].body
    assert put["price"] == 0.30 and put["cancel_unavail"] is True
    assert put["label"] == lx.label and put["disk"] == 50
    inst = fake_vast.instances[int(m.provider_instance_id)]
    assert inst["is_bid"] is True and inst["dph_total"] == 0.30 and inst["min_bid"] == 0.17
    listed = vast.list_owned()
    assert [(x.provider_instance_id, x.price_per_hour) for x in listed] == [
        (m.provider_instance_id, 0.30)
    ]
    assert listed[0].status is MachineStatus.RUNNING and listed[0].raw_status == "running"


def test_a_bid_under_the_live_minimum_is_refused_and_the_next_offer_is_tried(
    fake_vast: FakeVast, sqlite_sessions: sessionmaker[Session]
) -> None:
    vast = vast_at(fake_vast, sqlite_sessions)
    offers = vast.find_bid_offers(spec(), 0.25)
    assert [o.offer_id for o in offers] == ["5002", "5004"]
    fake_vast.offers[5002]["min_bid"] = 0.27  # outbid between search and create
    with pytest.raises(OfferGoneError, match="no_such_ask"):
        vast.create(offers[0], launch())
    assert fake_vast.instances == {}  # nothing made, nothing to destroy
    m = create_on_first_offer(vast, offers, launch())
    assert fake_vast.instances[int(m.provider_instance_id)]["machine_id"] == 104
    assert fake_vast.calls("PUT", "/api/v0/asks/5004/")[-1].body["price"] == 0.25


def test_an_offer_marked_interruptible_without_a_usable_bid_is_not_rented(
    fake_vast: FakeVast, sqlite_sessions: sessionmaker[Session]
) -> None:
    vast = vast_at(fake_vast, sqlite_sessions)
    good = vast.find_bid_offers(spec(), 0.30)[0]
    for details in ({**good.details, "bid": None}, {**good.details, "bid": 0.9}):
        bad = Offer(
            good.provider, good.offer_id, good.gpu, good.gpu_count, 0.30, good.spec, details=details
        )
        with pytest.raises(ValueError, match="bid"):
            vast.create(bad, launch())
    assert fake_vast.calls("PUT", "/api/v0/asks/") == []


# ---------------------------------------------------------------- outbid


@pytest.mark.parametrize(
    ("intended", "actual"),
    [("stopped", "stopped"), ("running", "stopped"), ("running", "exited")],
)
def test_an_outbid_instance_reads_stopped_outbid_and_may_run_again_by_itself(
    fake_vast: FakeVast, sqlite_sessions: sessionmaker[Session], intended: str, actual: str
) -> None:
    vast, iid = bid_instance(fake_vast, sqlite_sessions)
    fake_vast.outbid(int(iid), intended=intended, actual=actual, winning_bid=0.35)
    got = vast.get(iid)
    assert got is not None and got.status is MachineStatus.STOPPED
    assert got.raw_status == "outbid"
    assert got.storage_price_per_hour == pytest.approx(0.15 * 50 / 720, abs=1e-6)  # disk kept
    listed = vast.list_owned()
    assert [(x.status, x.raw_status) for x in listed] == [(MachineStatus.STOPPED, "outbid")]
    assert vast.find_by_label(got.label).raw_status == "outbid"  # type: ignore[union-attr]
    fake_vast.boot_seconds = 0.2
    fake_vast.resume_outbid(int(iid))
    assert vast.get(iid).status is MachineStatus.STARTING  # type: ignore[union-attr]
    time.sleep(0.25)
    again = vast.get(iid)
    assert again is not None and again.status is MachineStatus.RUNNING
    assert again.raw_status == "running"
    vast.destroy(iid)  # an outbid instance is destroyed like any other
    assert fake_vast.instances == {}


def test_an_on_demand_instance_cannot_be_outbid(
    fake_vast: FakeVast, sqlite_sessions: sessionmaker[Session]
) -> None:
    vast = vast_at(fake_vast, sqlite_sessions)
    m = vast.create(vast.find_offers(spec())[0], launch())
    with pytest.raises(ValueError, match="on demand"):
        fake_vast.outbid(int(m.provider_instance_id))


BID = {"is_bid": True}


@pytest.mark.parametrize(
    ("fields", "want", "raw"),
    [
        # outbid, as dstack saw it: everything "stopped"
        (
            {
                **BID,
                "actual_status": "stopped",
                "cur_state": "stopped",
                "intended_status": "stopped",
            },
            MachineStatus.STOPPED,
            "outbid",
        ),
        # outbid, paused while running is intended (not a start waiting for its GPU)
        (
            {
                **BID,
                "actual_status": "stopped",
                "cur_state": "stopped",
                "intended_status": "running",
            },
            MachineStatus.STOPPED,
            "outbid",
        ),
        (
            {
                **BID,
                "actual_status": "exited",
                "cur_state": "stopped",
                "intended_status": "running",
            },
            MachineStatus.STOPPED,
            "outbid",
        ),
        (
            {**BID, "actual_status": None, "cur_state": "stopped", "intended_status": "running"},
            MachineStatus.STOPPED,
            "outbid",
        ),
        # an interruptible that crashed keeps its GPU: dead, as on demand
        (
            {
                **BID,
                "actual_status": "exited",
                "cur_state": "running",
                "intended_status": "running",
            },
            MachineStatus.DEAD,
            "exited",
        ),
        (
            {**BID, "actual_status": "running", "cur_state": "running"},
            MachineStatus.RUNNING,
            "running",
        ),
        (
            {**BID, "actual_status": "loading", "cur_state": "running"},
            MachineStatus.STARTING,
            "loading",
        ),
        # a host gone or an OCI error is dead, interruptible or not
        (
            {**BID, "actual_status": "offline", "cur_state": "stopped"},
            MachineStatus.DEAD,
            "offline",
        ),
        (
            {
                **BID,
                "actual_status": "stopped",
                "cur_state": "stopped",
                "status_msg": "OCI runtime",
            },
            MachineStatus.DEAD,
            "stopped",
        ),
        # on demand, the same fields read as before: a start waiting for its GPU
        (
            {
                "is_bid": False,
                "actual_status": "stopped",
                "cur_state": "stopped",
                "intended_status": "running",
            },
            MachineStatus.STARTING,
            "stopped",
        ),
        (
            {"actual_status": "exited", "cur_state": "stopped", "intended_status": "running"},
            MachineStatus.DEAD,
            "exited",
        ),
    ],
)
def test_status_mapping_of_interruptible_instances(
    fields: dict[str, object], want: MachineStatus, raw: str
) -> None:
    assert machine_status(fields) is want
    assert raw_status(fields) == raw


# ---------------------------------------------------------------- on demand unchanged


def test_the_on_demand_path_sends_what_it_always_sent(
    fake_vast: FakeVast, sqlite_sessions: sessionmaker[Session]
) -> None:
    vast = vast_at(fake_vast, sqlite_sessions)
    offers = vast.find_offers(spec())
    assert [(o.offer_id, o.price_per_hour) for o in offers] == [("5002", 0.35), ("5004", 0.45)]
    assert set(offers[0].details) == DETAIL_KEYS  # nothing interruptible about it
    body = fake_vast.searches[-1]
    assert "type" not in body and "min_bid" not in body
    assert body["order"] == [["dph_total", "asc"]] and body["dph_total"] == {"lte": 0.6}
    m = vast.create(offers[0], launch())
    put = fake_vast.calls("PUT", "/api/v0/asks/5002/")[0].body
    assert "price" not in put and put["cancel_unavail"] is True
    assert set(put) == {"client_id", "image", "disk", "label", "env", "runtype", "cancel_unavail"}
    assert fake_vast.instances[int(m.provider_instance_id)]["is_bid"] is False
    got = vast.get(m.provider_instance_id)
    assert got is not None and got.price_per_hour == 0.35 and got.raw_status == "running"
    vast.stop(m.provider_instance_id)
    stopped = vast.get(m.provider_instance_id)
    assert stopped is not None and stopped.status is MachineStatus.STOPPED
    assert stopped.raw_status == "stopped"  # no "outbid" on demand
