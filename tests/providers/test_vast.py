"""Vast.ai against the fake: live search, avoided hosts, creates, v1 paging, failure modes, and
stop/start (statuses, a start refused or stuck scheduling, a stop whose answer is lost)."""

from __future__ import annotations

import time
import uuid
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy.orm import Session, sessionmaker

from autoscaler.providers import (
    AmbiguousCreateError,
    AuthError,
    CapacityError,
    LaunchSpec,
    MachineStatus,
    NotOwnedError,
    OfferGoneError,
    ProviderError,
    RateLimitedError,
    ResumeRefusedError,
    create_on_first_offer,
)
from autoscaler.providers.labels import ENV_LAUNCH
from autoscaler.providers.vast import VastProvider, machine_status, storage_price
from autoscaler.store import avoided_hosts, retention
from autoscaler.store.db import transaction
from tests.fakes.vast_server import FakeVast
from tests.providers.conftest import (
    INSTALLATION,
    OTHER_INSTALLATION,
    VAST_SECRET,
    assert_no_secret,
    make_vast,
    spec,
)

FILTERS = {
    "countries": ("US", "CA"),
    "min_bandwidth_mbps": 200,
    "min_cuda_version": 12.1,
    "min_reliability": 0.95,
}


def launch() -> LaunchSpec:
    return LaunchSpec.new(INSTALLATION, uuid.uuid4().hex, {"QUEUE": "inference"})


def labels_at(fake: FakeVast) -> list[str | None]:
    return [i.get("label") for i in fake.instances.values()]


# ---------------------------------------------------------------- search


def test_search_finds_cheapest_verified_offer_within_filters(
    fake_vast: FakeVast, sqlite_sessions: sessionmaker[Session]
) -> None:
    vast = make_vast(fake_vast, sqlite_sessions, **FILTERS)
    offers = vast.find_offers(spec())
    # 5005 is cheaper but unverified; 5001 is in FR; 5003 has 150 Mb/s; 5004 is 0.45 in CA but
    # 5002 is 0.35; 5006 old CUDA; 5007 small disk; 5008 over cap; 5009 unreliable.
    assert [o.offer_id for o in offers] == ["5002", "5004"]
    assert offers[0].price_per_hour == 0.35 and offers[0].host_id == "102"
    body = fake_vast.searches[-1]
    assert body["order"] == [["dph_total", "asc"]]  # one entry, as the CLI sends: accepted
    assert body["verified"] == {"eq": True} and body["dph_total"] == {"lte": 0.6}
    assert body["geolocation"] == {"in": ["US", "CA"]} and body["disk_space"] == {"gte": 50}
    assert fake_vast.calls("POST", "/api/v0/bundles/")  # trailing slash, as the CLI


def test_avoided_hosts_are_excluded_persisted_and_expire(
    fake_vast: FakeVast, sqlite_sessions: sessionmaker[Session]
) -> None:
    now = [datetime(2026, 1, 1, tzinfo=UTC)]
    vast = make_vast(
        fake_vast, sqlite_sessions, clock=lambda: now[0], avoid_host_for=3600, **FILTERS
    )
    vast.avoid_host("102", "OCI runtime create failed")
    # A new provider object (another process) sees the same avoidance: it is in the database.
    other = make_vast(fake_vast, sqlite_sessions, clock=lambda: now[0], **FILTERS)
    assert [o.offer_id for o in other.find_offers(spec())] == ["5004"]
    assert fake_vast.searches[-1]["machine_id"] == {"notin": [102]}
    now[0] += timedelta(hours=2)  # expired
    assert [o.offer_id for o in other.find_offers(spec())] == ["5002", "5004"]
    assert "machine_id" not in fake_vast.searches[-1]
    with transaction(sqlite_sessions) as s:  # forgotten by retention once ended
        rule = next(r for r in retention.RULES if r.table == "avoided_hosts")
        assert retention.forget(s, rule, now[0]) == 1


def test_avoided_host_filtered_client_side_even_if_search_ignores_it(
    fake_vast: FakeVast, sqlite_sessions: sessionmaker[Session]
) -> None:
    vast = make_vast(fake_vast, sqlite_sessions, **FILTERS)
    with transaction(sqlite_sessions) as s:
        avoided_hosts.avoid(
            s, "gpu-vast", "102", "never booted", datetime.now(UTC) + timedelta(hours=1)
        )
    fake_vast.offers[5002]["machine_id"] = "102"  # a string id slips past the numeric notin
    assert [o.offer_id for o in vast.find_offers(spec())] == ["5004"]


# ---------------------------------------------------------------- create / lifecycle


def test_create_with_label_and_env_then_lifecycle(
    fake_vast: FakeVast, sqlite_sessions: sessionmaker[Session]
) -> None:
    fake_vast.boot_seconds = 0.3
    vast = make_vast(fake_vast, sqlite_sessions, **FILTERS)
    lx = launch()
    m = vast.create(vast.find_offers(spec())[0], lx)
    assert m.status is MachineStatus.STARTING and m.host_id == "102"
    put = fake_vast.calls("PUT", "/api/v0/asks/5002/")[0].body
    assert put["label"] == lx.label and put["env"][ENV_LAUNCH] == lx.launch_id  # env: object
    assert put["disk"] == 50 and put["image"] == "ghcr.io/acme/worker:1"
    got = vast.get(m.provider_instance_id)
    assert got is not None and got.status is MachineStatus.STARTING
    time.sleep(0.35)
    assert vast.get(m.provider_instance_id).status is MachineStatus.RUNNING  # type: ignore[union-attr]
    fake_vast.kill(int(m.provider_instance_id), "exited")
    assert vast.get(m.provider_instance_id).status is MachineStatus.DEAD  # type: ignore[union-attr]
    vast.destroy(m.provider_instance_id)
    assert fake_vast.instances == {}
    vast.destroy(m.provider_instance_id)  # gone: success
    assert vast.get(m.provider_instance_id) is None


def test_oci_error_reads_dead_and_host_can_be_avoided(
    fake_vast: FakeVast, sqlite_sessions: sessionmaker[Session]
) -> None:
    vast = make_vast(fake_vast, sqlite_sessions, **FILTERS)
    m = vast.create(vast.find_offers(spec())[0], launch())
    fake_vast.kill(
        int(m.provider_instance_id),
        "created",
        "OCI runtime create failed: runc create failed: unable to start container",
    )
    got = vast.get(m.provider_instance_id)
    assert got is not None and got.status is MachineStatus.DEAD
    vast.avoid_host(got.host_id or "", "OCI runtime error")
    assert "5002" not in [o.offer_id for o in vast.find_offers(spec())]
    assert fake_vast.searches[-1]["machine_id"] == {"notin": [102]}


def test_destroy_404_is_success(fake_vast: FakeVast, sqlite_sessions) -> None:
    vast = make_vast(fake_vast, sqlite_sessions)
    vast.destroy("999999")
    assert vast.get("999999") is None


# ---------------------------------------------------------------- offers that go away


@pytest.mark.parametrize("status", [404, 410])
def test_offer_gone_between_search_and_create_tries_next(
    fake_vast: FakeVast, sqlite_sessions: sessionmaker[Session], status: int
) -> None:
    vast = make_vast(fake_vast, sqlite_sessions, **FILTERS)
    fake_vast.vanish_status = status
    fake_vast.vanish_after_search = 1  # the cheapest offer is rented by someone else
    offers = vast.find_offers(spec())
    with pytest.raises(OfferGoneError):
        vast.create(offers[0], launch())
    m = create_on_first_offer(vast, offers, launch())
    assert m.host_id == "104"
    assert len(fake_vast.instances) == 1


def test_failed_create_that_returns_a_contract_destroys_it(
    fake_vast: FakeVast, sqlite_sessions: sessionmaker[Session]
) -> None:
    vast = make_vast(fake_vast, sqlite_sessions, **FILTERS)
    offers = vast.find_offers(spec())
    fake_vast.fail_with_contract = 1
    m = create_on_first_offer(vast, offers, launch())
    # the half-made instance on 5002 was destroyed, the next offer rented
    assert list(fake_vast.instances) == [int(m.provider_instance_id)]
    assert m.host_id == "104"
    assert len(fake_vast.calls("DELETE", "/api/v0/instances/")) == 1


# ---------------------------------------------------------------- ambiguous creates


def test_5xx_after_create_is_found_by_label(fake_vast: FakeVast, sqlite_sessions) -> None:
    vast = make_vast(fake_vast, sqlite_sessions, **FILTERS)
    offers = vast.find_offers(spec())
    fake_vast.fail_after_create = 1
    lx = launch()
    m = create_on_first_offer(vast, offers, lx)
    assert labels_at(fake_vast) == [lx.label] and m.label == lx.label
    assert len(fake_vast.calls("PUT", "/api/v0/asks/")) == 1
    lookups = fake_vast.calls("GET", "/api/v1/instances/")
    assert any('"label":{"eq"' in q.query["select_filters"][0] for q in lookups)


@pytest.mark.parametrize("switch", ["omit_contract", "truncate_after_create"])
def test_a_create_answer_without_a_readable_contract_is_looked_up_not_retried_elsewhere(
    fake_vast: FakeVast, sqlite_sessions, switch: str
) -> None:
    """A 200 "success" without new_contract, or an answer cut off mid-body: the instance may
    exist, so the next offer must not be rented; it is found by its label."""
    vast = make_vast(fake_vast, sqlite_sessions, **FILTERS)
    offers = vast.find_offers(spec())
    assert len(offers) >= 2
    setattr(fake_vast, switch, 1)
    lx = launch()
    m = create_on_first_offer(vast, offers, lx)
    assert len(fake_vast.calls("PUT", "/api/v0/asks/")) == 1
    assert labels_at(fake_vast) == [lx.label] and m.label == lx.label
    fake_vast.spec_violations.clear()  # the broken answers are the point of this test


def test_timed_out_create_that_happened_is_found_and_not_duplicated(
    fake_vast: FakeVast, sqlite_sessions
) -> None:
    vast = make_vast(fake_vast, sqlite_sessions, **FILTERS)
    offers = vast.find_offers(spec())
    fake_vast.delay_after_create = 0.6
    lx = launch()
    m = vast.create(offers[0], lx)
    fake_vast.delay_after_create = 0
    again = create_on_first_offer(vast, offers, lx)  # a redelivered launch task
    assert again.provider_instance_id == m.provider_instance_id
    assert labels_at(fake_vast) == [lx.label]
    assert len(fake_vast.calls("PUT", "/api/v0/asks/")) == 1


def test_create_that_did_not_happen_stays_ambiguous_without_second_create(
    fake_vast: FakeVast, sqlite_sessions
) -> None:
    vast = make_vast(fake_vast, sqlite_sessions, **FILTERS)
    offers = vast.find_offers(spec())
    lx = launch()
    # the instance is made then immediately lost (destroyed by the host) before any lookup
    fake_vast.delay_after_create = 0.6
    orig = fake_vast._make_instance

    def vanishing(offer, body):  # type: ignore[no-untyped-def]
        iid = orig(offer, body)
        fake_vast.instances.pop(iid)
        return iid

    fake_vast._make_instance = vanishing  # type: ignore[method-assign]
    with pytest.raises(AmbiguousCreateError):
        create_on_first_offer(vast, offers, lx)
    assert len(fake_vast.calls("PUT", "/api/v0/asks/")) == 1


# ---------------------------------------------------------------- listing


def test_list_walks_v1_pages_and_never_uses_deprecated_v0(
    fake_vast: FakeVast, sqlite_sessions: sessionmaker[Session]
) -> None:
    for mode in ("deprecated", "empty"):
        fake_vast.v0_list_mode = mode
        vast = make_vast(fake_vast, sqlite_sessions)
        for i in range(30):
            fake_vast.add_instance(f"hand-{i}")
        fake_vast.add_instance(None)
        mine = set()
        for _ in range(32):
            lx = launch()
            fake_vast.add_instance(lx.label)
            mine.add(lx.label)
        assert {m.label for m in vast.list_owned()} == mine
        pages = fake_vast.calls("GET", "/api/v1/instances/")
        assert len(pages) >= 3 and all(p.query["limit"] == ["25"] for p in pages)
        assert not [
            r
            for r in fake_vast.requests
            if r.method == "GET" and r.path.rstrip("/") == "/api/v0/instances"
        ]
        fake_vast.instances.clear()
        fake_vast.requests.clear()


def test_a_success_false_answer_is_never_read_as_no_instances(
    fake_vast: FakeVast, sqlite_sessions
) -> None:
    from autoscaler.providers import ProviderError

    vast = make_vast(fake_vast, sqlite_sessions)
    # Point the list at the deprecated endpoint's answer shape: it must raise, not return [].
    resp = vast._http.request("GET", "/api/v0/instances/")
    with pytest.raises(ProviderError, match="deprecated_endpoint"):
        vast._ok_json(resp, "list instances")


# ---------------------------------------------------------------- auth, rate limits


def test_bad_key_is_an_auth_error(fake_vast: FakeVast, sqlite_sessions, all_logs) -> None:
    wrong = "vast_WRONG_1234_do_not_log"
    vast = make_vast(fake_vast, sqlite_sessions, key=wrong)
    with pytest.raises(AuthError, match="refused the API key") as info:
        vast.list_owned()
    assert_no_secret(all_logs, info.value, vast, secret=wrong)


@pytest.mark.parametrize("plain", [False, True])
def test_429_without_retry_after_is_backed_off(
    fake_vast: FakeVast, sqlite_sessions, plain: bool
) -> None:
    vast = make_vast(fake_vast, sqlite_sessions, **FILTERS)
    fake_vast.rate_limit_plain_text = plain
    fake_vast.rate_limit_next = 3
    t0 = time.monotonic()
    assert vast.find_offers(spec())
    assert time.monotonic() - t0 >= 0.005 * 3  # it waited between attempts
    assert len(fake_vast.calls("POST", "/api/v0/bundles/")) == 4
    offer = vast.find_offers(spec())[0]
    fake_vast.rate_limit_plain_text = False  # asks document a JSON 429
    fake_vast.rate_limit_next = 1
    with pytest.raises(RateLimitedError):
        vast.create(offer, launch())  # a create is never retried blindly
    assert fake_vast.instances == {}


# ---------------------------------------------------------------- ownership


def test_hand_made_instances_survive_everything(
    fake_vast: FakeVast, sqlite_sessions: sessionmaker[Session]
) -> None:
    hand = fake_vast.add_instance("my dev box")
    unlabelled = fake_vast.add_instance(None)
    foreign = fake_vast.add_instance(f"asg-{OTHER_INSTALLATION}-deadbeef")
    vast = make_vast(fake_vast, sqlite_sessions, **FILTERS)
    mine = create_on_first_offer(vast, vast.find_offers(spec()), launch())
    assert [m.provider_instance_id for m in vast.list_owned()] == [mine.provider_instance_id]
    for iid in (hand, unlabelled, foreign):
        assert vast.get(str(iid)) is None
        with pytest.raises(NotOwnedError):
            vast.destroy(str(iid))
    for m in vast.list_owned():
        vast.destroy(m.provider_instance_id)
    assert set(fake_vast.instances) == {hand, unlabelled, foreign}


def test_no_secret_in_logs_errors_or_reprs(fake_vast: FakeVast, sqlite_sessions, all_logs) -> None:
    vast = make_vast(fake_vast, sqlite_sessions, **FILTERS)
    errors: list[Exception] = []
    offers = vast.find_offers(spec())
    fake_vast.vanish.add(5002)
    try:
        vast.create(offers[0], launch())
    except CapacityError as exc:
        errors.append(exc)
    fake_vast.rate_limit_next = 10
    try:
        vast.list_owned()
    except RateLimitedError as exc:
        errors.append(exc)
    fake_vast.rate_limit_next = 0
    fake_vast.delay_after_create = 0.6
    vast.create(offers[1], launch())
    assert len(errors) == 2
    assert_no_secret(all_logs, vast, vast._http, *errors, secret=VAST_SECRET)
    assert all(r.authorization == f"Bearer {VAST_SECRET}" for r in fake_vast.requests)


# ---------------------------------------------------------------- stop / start (warm pools)


def running_instance(fake: FakeVast, sessions: sessionmaker[Session]) -> tuple[VastProvider, str]:
    vast = make_vast(fake, sessions, **FILTERS)
    m = vast.create(vast.find_offers(spec())[0], launch())
    assert vast.get(m.provider_instance_id).status is MachineStatus.RUNNING  # type: ignore[union-attr]
    return vast, m.provider_instance_id


def states(fake: FakeVast, iid: str) -> list[object]:
    return [r.body for r in fake.calls("PUT", f"/api/v0/instances/{iid}/")]


def test_stop_and_start_set_the_instances_state(
    fake_vast: FakeVast, sqlite_sessions: sessionmaker[Session]
) -> None:
    vast, iid = running_instance(fake_vast, sqlite_sessions)
    vast.stop(iid)
    assert states(fake_vast, iid) == [{"state": "stopped"}]
    got = vast.get(iid)
    assert got is not None and got.status is MachineStatus.STOPPED
    # Vast's own $/h for the 50 GB disk (storage_total_cost), not a guess of ours
    assert got.storage_price_per_hour == pytest.approx(0.15 * 50 / 720, abs=1e-6)
    vast.stop(iid)  # stopped already: nothing sent
    assert len(states(fake_vast, iid)) == 1
    fake_vast.boot_seconds = 60.0
    vast.start(iid)
    assert states(fake_vast, iid)[-1] == {"state": "running"}
    assert vast.get(iid).status is MachineStatus.STARTING  # type: ignore[union-attr]
    vast.start(iid)  # starting already: nothing sent
    assert len(states(fake_vast, iid)) == 2
    fake_vast.boot_seconds = 0.0
    assert vast.get(iid).status is MachineStatus.RUNNING  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("fields", "want"),
    [
        ({"actual_status": "stopped", "intended_status": "stopped"}, MachineStatus.STOPPED),
        ({"actual_status": "exited", "intended_status": "stopped"}, MachineStatus.STOPPED),
        ({"actual_status": "running", "intended_status": "stopped"}, MachineStatus.RUNNING),
        ({"actual_status": "exited", "intended_status": "running"}, MachineStatus.DEAD),
        ({"actual_status": "stopped", "intended_status": "running"}, MachineStatus.STARTING),
        ({"actual_status": "scheduling", "intended_status": "running"}, MachineStatus.STARTING),
        ({"actual_status": "offline", "intended_status": "stopped"}, MachineStatus.DEAD),
        ({"actual_status": "unknown", "intended_status": "running"}, MachineStatus.DEAD),
        ({"actual_status": "loading", "intended_status": "running"}, MachineStatus.STARTING),
        ({"actual_status": "frozen", "intended_status": "frozen"}, MachineStatus.DEAD),
        (
            {"actual_status": "created", "intended_status": "stopped", "status_msg": "OCI runtime"},
            MachineStatus.DEAD,
        ),
    ],
)
def test_status_mapping(fields: dict[str, str], want: MachineStatus) -> None:
    """What we asked (`intended_status`) decides between a stop of ours and a crash: Vast shows
    a stopped container as `exited` too, and `exited` while running is intended never runs."""
    assert machine_status(fields) is want


def test_storage_price_from_the_per_gb_month_price_when_vast_gives_no_total() -> None:
    assert storage_price({"storage_cost": 0.2, "disk_space": 73.0}) == pytest.approx(0.02)
    assert storage_price({"storage_total_cost": 0.0031, "storage_cost": 9.9}) == 0.0031
    assert storage_price({"dph_total": 0.4}) is None


def test_a_stop_shown_as_exited_reads_stopped_and_resumes(
    fake_vast: FakeVast, sqlite_sessions: sessionmaker[Session]
) -> None:
    fake_vast.stopped_actual_status = "exited"
    vast, iid = running_instance(fake_vast, sqlite_sessions)
    vast.stop(iid)
    assert vast.get(iid).status is MachineStatus.STOPPED  # type: ignore[union-attr]
    vast.start(iid)
    assert vast.get(iid).status is MachineStatus.RUNNING  # type: ignore[union-attr]


def test_a_start_the_machine_cannot_serve_is_refused_and_it_stays_stopped(
    fake_vast: FakeVast, sqlite_sessions: sessionmaker[Session]
) -> None:
    vast, iid = running_instance(fake_vast, sqlite_sessions)
    vast.stop(iid)
    fake_vast.resume_without_gpu = True
    with pytest.raises(ResumeRefusedError, match="unavailable"):
        vast.start(iid)
    assert vast.get(iid).status is MachineStatus.STOPPED  # type: ignore[union-attr]


def test_a_start_stuck_scheduling_is_accepted_and_reads_starting(
    fake_vast: FakeVast, sqlite_sessions: sessionmaker[Session]
) -> None:
    vast, iid = running_instance(fake_vast, sqlite_sessions)  # boot_seconds 0: runs at once
    vast.stop(iid)
    fake_vast.start_stuck_scheduling = True
    vast.start(iid)  # not an error: the caller's resume_timeout ends the wait
    for _ in range(3):
        assert vast.get(iid).status is MachineStatus.STARTING  # type: ignore[union-attr]
    assert fake_vast.instances[int(iid)]["actual_status"] == "stopped"
    vast.start(iid)  # waiting already: nothing sent
    assert len(states(fake_vast, iid)) == 2
    vast.stop(iid)
    assert vast.get(iid).status is MachineStatus.STOPPED  # type: ignore[union-attr]


@pytest.mark.parametrize("lost", ["timeout", "500"])
def test_a_stop_whose_answer_is_lost_but_happened_is_success(
    fake_vast: FakeVast, sqlite_sessions: sessionmaker[Session], lost: str
) -> None:
    vast, iid = running_instance(fake_vast, sqlite_sessions)
    fake_vast.stop_times_out_but_happens = True
    fake_vast.lost_answer = lost
    fake_vast.lost_answer_delay = 5.0  # far past the client's 0.3 s read timeout
    t0 = time.monotonic()
    vast.stop(iid)  # retried (a state PUT is idempotent): the retry is answered at once
    assert time.monotonic() - t0 < fake_vast.lost_answer_delay
    assert states(fake_vast, iid) == [{"state": "stopped"}] * 2
    assert vast.get(iid).status is MachineStatus.STOPPED  # type: ignore[union-attr]


def test_a_refused_state_change_is_an_error_and_changes_nothing(
    fake_vast: FakeVast, sqlite_sessions: sessionmaker[Session]
) -> None:
    """`success: false` is never read as done."""
    vast, iid = running_instance(fake_vast, sqlite_sessions)
    fake_vast.refuse_state_change = ("maintenance", "the machine is in maintenance mode")
    with pytest.raises(ProviderError, match="maintenance mode"):
        vast.stop(iid)
    assert vast.get(iid).status is MachineStatus.RUNNING  # type: ignore[union-attr]
    fake_vast.refuse_state_change = None
    vast.stop(iid)
    fake_vast.refuse_state_change = ("maintenance", "the machine is in maintenance mode")
    with pytest.raises(ProviderError, match="maintenance mode") as info:
        vast.start(iid)
    assert not isinstance(info.value, ResumeRefusedError)  # a reason to retry, not to destroy
    assert vast.get(iid).status is MachineStatus.STOPPED  # type: ignore[union-attr]


def test_a_dead_or_gone_instance_is_not_resumed(
    fake_vast: FakeVast, sqlite_sessions: sessionmaker[Session]
) -> None:
    vast, iid = running_instance(fake_vast, sqlite_sessions)
    vast.stop(iid)
    fake_vast.kill(int(iid), "offline")
    with pytest.raises(ResumeRefusedError, match="dead"):
        vast.start(iid)
    assert states(fake_vast, iid) == [{"state": "stopped"}]
    fake_vast.instances.pop(int(iid))  # gone behind our back
    vast.stop(iid)
    with pytest.raises(ResumeRefusedError, match="gone"):
        vast.start(iid)


def test_stop_and_start_of_instances_not_ours_send_nothing(
    fake_vast: FakeVast, sqlite_sessions: sessionmaker[Session]
) -> None:
    vast = make_vast(fake_vast, sqlite_sessions)
    hand = fake_vast.add_instance("my-notebook")
    sneaky = fake_vast.add_instance(f"asg-{OTHER_INSTALLATION}-abc123")
    for iid in (hand, sneaky):
        for call in (vast.stop, vast.start):
            with pytest.raises(NotOwnedError):
                call(str(iid))
        assert not fake_vast.calls("PUT", f"/api/v0/instances/{iid}/")
        assert fake_vast.instances[iid]["intended_status"] == "running"
