"""RunPod REST v2 against the fake: offers, creates, ambiguity, errors, ownership, secrets, and
stop/start (409s, a start without a GPU, a start stuck, a stop whose answer is lost)."""

from __future__ import annotations

import time
import uuid

import pytest
import requests

from autoscaler.providers import (
    AmbiguousCreateError,
    AuthError,
    CapacityError,
    LaunchSpec,
    MachineStatus,
    NotOwnedError,
    ProviderRequestError,
    RateLimitedError,
    ResumeRefusedError,
    TransientError,
    create_on_first_offer,
)
from autoscaler.providers.base import WORKDIR_ENV
from autoscaler.providers.labels import ENV_INSTALLATION, ENV_LABEL
from autoscaler.providers.runpod import RunPodProvider
from tests.fakes.runpod_server import FakeRunPod
from tests.providers.conftest import (
    INSTALLATION,
    OTHER_INSTALLATION,
    SECRET,
    assert_no_secret,
    make_runpod,
    spec,
)

PREFS = ("NVIDIA GeForce RTX 4090", "NVIDIA RTX A5000", "NVIDIA GeForce RTX 3090")


def launch(env: dict[str, str] | None = None) -> LaunchSpec:
    return LaunchSpec.new(INSTALLATION, uuid.uuid4().hex, env or {"QUEUE": "inference"})


def names(fake: FakeRunPod) -> list[str]:
    return [p["name"] for p in fake.live_pods()]


# ---------------------------------------------------------------- offers


def test_offers_follow_preference_and_skip_no_stock_and_over_cap(fake_runpod: FakeRunPod) -> None:
    rp = make_runpod(fake_runpod, gpu_types=PREFS)
    # 4090 costs 0.69 secure: above the 0.60 cap. A5000 0.29, 3090 0.43: in preference order.
    offers = rp.find_offers(spec(max_price_per_hour=0.60))
    assert [o.offer_id for o in offers] == ["NVIDIA RTX A5000", "NVIDIA GeForce RTX 3090"]
    assert offers[0].price_per_hour == pytest.approx(0.29)
    fake_runpod.stock["NVIDIA RTX A5000"] = 0  # no capacity: catalog says NONE
    assert [o.offer_id for o in rp.find_offers(spec())] == ["NVIDIA GeForce RTX 3090"]
    # price is per GPU: two GPUs of 3090 (0.86) exceed the cap
    assert rp.find_offers(spec(gpu_count=2)) == []
    catalog = fake_runpod.calls("GET", "/v2/catalog/gpus")[-1]
    assert catalog.query["include"] == ["AVAILABILITY"] and catalog.query["product"] == ["POD"]


def test_community_cloud_prices_and_spec_gpu_by_name(fake_runpod: FakeRunPod) -> None:
    rp = make_runpod(fake_runpod, cloud_type="COMMUNITY")  # no gpu_types: the spec's gpu
    offers = rp.find_offers(spec(gpu="RTX 4090"))
    assert [(o.offer_id, o.price_per_hour) for o in offers] == [("NVIDIA GeForce RTX 4090", 0.34)]


# ---------------------------------------------------------------- create / get / list / destroy


def test_create_names_pod_with_label_and_env_then_lifecycle(fake_runpod: FakeRunPod) -> None:
    fake_runpod.boot_seconds = 0.3  # slow boot
    rp = make_runpod(fake_runpod, gpu_types=PREFS)
    lx = launch()
    m = rp.create(rp.find_offers(spec())[0], lx)
    assert m.label == lx.label and m.status is MachineStatus.STARTING
    pod = fake_runpod.pods[m.provider_instance_id]
    assert pod["name"] == lx.label
    assert pod["env"][ENV_INSTALLATION] == INSTALLATION and pod["env"][ENV_LABEL] == lx.label
    assert pod["env"]["QUEUE"] == "inference"
    assert rp.get(m.provider_instance_id).status is MachineStatus.STARTING  # type: ignore[union-attr]
    time.sleep(0.35)
    assert rp.get(m.provider_instance_id).status is MachineStatus.RUNNING  # type: ignore[union-attr]
    fake_runpod.kill(m.provider_instance_id, "ERROR")  # the machine dies
    assert rp.get(m.provider_instance_id).status is MachineStatus.DEAD  # type: ignore[union-attr]
    assert [x.provider_instance_id for x in rp.list_owned()] == [m.provider_instance_id]
    rp.destroy(m.provider_instance_id)
    assert rp.get(m.provider_instance_id) is None
    rp.destroy(m.provider_instance_id)  # already gone: success
    assert fake_runpod.pods == {}


def test_terminate_404_is_success(fake_runpod: FakeRunPod) -> None:
    rp = make_runpod(fake_runpod)
    rp.destroy("podnotthere")
    assert fake_runpod.calls("GET", "/v2/pods/podnotthere")


def test_unique_pod_name_per_launch(fake_runpod: FakeRunPod) -> None:
    rp = make_runpod(fake_runpod, gpu_types=PREFS)
    offer = rp.find_offers(spec())[0]
    for _ in range(3):
        rp.create(offer, launch())
    assert len(set(names(fake_runpod))) == 3


# ---------------------------------------------------------------- capacity


@pytest.mark.parametrize("status", [400, 500])
def test_capacity_refusal_moves_to_next_gpu_type(fake_runpod: FakeRunPod, status: int) -> None:
    """The catalog shows stock, the create refuses it (4xx or 5xx with the capacity detail):
    a capacity error, not an ambiguous create; the next preference is rented."""
    rp = make_runpod(fake_runpod, gpu_types=PREFS)
    offers = rp.find_offers(spec())
    fake_runpod.capacity_status = status
    fake_runpod.stock["NVIDIA RTX A5000"] = 0  # after the search: the catalog was stale
    with pytest.raises(CapacityError):
        rp.create(offers[0], launch())
    assert fake_runpod.pods == {}
    m = create_on_first_offer(rp, offers, launch())
    assert fake_runpod.pods[m.provider_instance_id]["gpu"]["id"] == "NVIDIA GeForce RTX 3090"
    assert len(fake_runpod.calls("POST", "/v2/pods")) == 3  # refused, refused, made


def test_no_capacity_anywhere(fake_runpod: FakeRunPod) -> None:
    rp = make_runpod(fake_runpod, gpu_types=PREFS)
    offers = rp.find_offers(spec())
    fake_runpod.refuse_create = True
    with pytest.raises(CapacityError, match="none of 2 offer"):
        create_on_first_offer(rp, offers, launch())
    assert fake_runpod.pods == {}


# ---------------------------------------------------------------- ambiguous creates


def test_5xx_after_create_is_found_by_name_not_duplicated(fake_runpod: FakeRunPod) -> None:
    rp = make_runpod(fake_runpod, gpu_types=PREFS)
    offers = rp.find_offers(spec())
    fake_runpod.fail_after_create = 1
    lx = launch()
    m = create_on_first_offer(rp, offers, lx)
    assert m.label == lx.label
    assert names(fake_runpod) == [lx.label]
    assert len(fake_runpod.calls("POST", "/v2/pods")) == 1


def test_timed_out_create_that_happened_is_found_and_not_duplicated(
    fake_runpod: FakeRunPod,
) -> None:
    rp = make_runpod(fake_runpod, gpu_types=PREFS)
    offers = rp.find_offers(spec())
    fake_runpod.delay_after_create = 0.6  # client read timeout is 0.3 s
    lx = launch()
    m = rp.create(offers[0], lx)
    assert m.label == lx.label
    fake_runpod.delay_after_create = 0
    # The task is redelivered and runs again: the label lookup finds the pod, nothing new.
    again = create_on_first_offer(rp, offers, lx)
    assert again.provider_instance_id == m.provider_instance_id
    assert names(fake_runpod) == [lx.label]
    assert len(fake_runpod.calls("POST", "/v2/pods")) == 1


def test_5xx_before_create_is_ambiguous_and_not_retried(fake_runpod: FakeRunPod) -> None:
    rp = make_runpod(fake_runpod, gpu_types=PREFS)
    offers = rp.find_offers(spec())
    fake_runpod.fail_before_create = 1
    lx = launch()
    with pytest.raises(AmbiguousCreateError) as info:
        create_on_first_offer(rp, offers, lx)
    assert info.value.label == lx.label
    assert len(fake_runpod.calls("POST", "/v2/pods")) == 1  # never a blind second create
    assert fake_runpod.pods == {}


# ---------------------------------------------------------------- auth, rate limits, transient


def test_bad_key_is_an_auth_error_said_plainly(fake_runpod: FakeRunPod, all_logs) -> None:
    wrong = "rpa_WRONGKEY_77aa_do_not_log"
    rp = make_runpod(fake_runpod, key=wrong)
    for call in (lambda: rp.find_offers(spec()), rp.list_owned, lambda: rp.destroy("pod1")):
        with pytest.raises(AuthError, match="refused the API key") as info:
            call()
        assert_no_secret(all_logs, info.value, rp, secret=wrong)
    assert len(fake_runpod.calls("GET", "/v2/catalog/gpus")) == 1  # not retried


def test_a_short_reset_is_waited_out_on_reads_and_a_long_one_raises_at_once(
    fake_runpod: FakeRunPod,
) -> None:
    """A reset within the call's budget is slept (the read then succeeds); a longer one raises
    on the first 429, carrying the reset, so no worker sleeps through it."""
    slept: list[float] = []
    rp = make_runpod(fake_runpod, gpu_types=PREFS)
    rp._http._sleep = slept.append
    fake_runpod.rate_limit_header = '"minute";r=0;t=0.05'
    fake_runpod.rate_limit_next = 2
    assert rp.find_offers(spec())
    assert len(fake_runpod.calls("GET", "/v2/catalog/gpus")) == 3
    assert slept == [0.05, 0.05]
    fake_runpod.rate_limit_header = "limit=60, remaining=0, reset=30"
    fake_runpod.rate_limit_next = 10
    with pytest.raises(RateLimitedError, match="resets in 30s") as info:
        rp.list_owned()
    assert info.value.retry_after == 30.0
    assert len(fake_runpod.calls("GET", "/v2/pods")) == 1  # no sleep, no second attempt
    assert slept == [0.05, 0.05]


def test_rate_limited_create_is_not_retried(fake_runpod: FakeRunPod) -> None:
    rp = make_runpod(fake_runpod, gpu_types=PREFS)
    offer = rp.find_offers(spec())[0]
    fake_runpod.rate_limit_next = 1
    with pytest.raises(RateLimitedError):
        rp.create(offer, launch())
    assert len(fake_runpod.calls("POST", "/v2/pods")) == 1
    assert fake_runpod.pods == {}


def test_transient_5xx_on_reads_is_retried(fake_runpod: FakeRunPod) -> None:
    rp = make_runpod(fake_runpod)
    fake_runpod.fail_next = 2
    assert rp.list_owned() == []
    fake_runpod.fail_next = 99
    with pytest.raises(TransientError):
        rp.list_owned()
    fake_runpod.fail_next = 0


def test_unreachable_api_is_transient() -> None:
    fake = FakeRunPod(SECRET)
    fake.close()  # nothing listens there any more
    rp = make_runpod(fake)
    with pytest.raises(TransientError):
        rp.list_owned()


# ---------------------------------------------------------------- ownership


def test_hand_made_and_foreign_pods_are_never_touched(fake_runpod: FakeRunPod) -> None:
    hand = fake_runpod.add_pod("my-notebook")
    sneaky = fake_runpod.add_pod(f"asg-{OTHER_INSTALLATION}-abc123")  # another installation
    rp = make_runpod(fake_runpod, gpu_types=PREFS)
    offers = rp.find_offers(spec())
    mine = [create_on_first_offer(rp, offers, launch()) for _ in range(3)]
    owned = rp.list_owned()
    assert {m.provider_instance_id for m in owned} == {m.provider_instance_id for m in mine}
    assert rp.get(hand) is None and rp.get(sneaky) is None
    for pid in (hand, sneaky):
        with pytest.raises(NotOwnedError):
            rp.destroy(pid)
    for m in owned:
        rp.destroy(m.provider_instance_id)
    assert set(fake_runpod.pods) == {hand, sneaky}
    assert not fake_runpod.calls("DELETE", f"/v2/pods/{hand}")


def test_list_reads_every_pod_of_a_large_account(fake_runpod: FakeRunPod) -> None:
    rp = make_runpod(fake_runpod, gpu_types=PREFS)
    fake_runpod.stock = dict.fromkeys(fake_runpod.stock, 1000)
    for i in range(40):
        fake_runpod.add_pod(f"hand-{i}")
    offer = rp.find_offers(spec())[0]
    mine = {rp.create(offer, launch()).provider_instance_id for _ in range(30)}
    assert {m.provider_instance_id for m in rp.list_owned()} == mine


# ---------------------------------------------------------------- the fake itself


def test_fake_refuses_what_the_real_api_refuses(fake_runpod: FakeRunPod) -> None:
    """v1 field names (imageName, gpuTypeIds) are unknown to v2: 400, as live."""
    r = requests.post(
        fake_runpod.url + "/v2/pods",
        json={"name": "x", "imageName": "img", "gpuTypeIds": ["NVIDIA RTX A5000"]},
        headers={"Authorization": f"Bearer {SECRET}"},
        timeout=5,
    )
    assert r.status_code == 400
    assert r.headers["Content-Type"].startswith("application/problem+json")
    assert "imageName" in " ".join(r.json()["errors"])
    assert fake_runpod.expect_violations()
    assert fake_runpod.pods == {}


def test_no_secret_in_logs_errors_or_reprs(fake_runpod: FakeRunPod, all_logs) -> None:
    rp = make_runpod(fake_runpod, gpu_types=PREFS)
    errors: list[Exception] = []
    offers = rp.find_offers(spec())
    fake_runpod.fail_before_create = 1
    try:
        rp.create(offers[0], launch())
    except AmbiguousCreateError as exc:
        errors.append(exc)
    fake_runpod.delay_after_create = 0.6
    rp.create(offers[0], launch())
    fake_runpod.delay_after_create = 0
    fake_runpod.rate_limit_next = 10
    try:
        rp.list_owned()
    except RateLimitedError as exc:
        errors.append(exc)
    fake_runpod.rate_limit_next = 0
    fake_runpod.refuse_create = True
    try:
        rp.create(offers[0], launch())
    except CapacityError as exc:
        errors.append(exc)
    assert len(errors) == 3
    assert all_logs.records  # the logs were captured, and are clean:
    assert_no_secret(all_logs, rp, rp._http, *errors, *offers, secret=SECRET)
    # The key was really sent, so the test above could have failed.
    assert all(r.authorization == f"Bearer {SECRET}" for r in fake_runpod.requests)


def test_a_rate_limited_create_carries_runpods_reset_hint(fake_runpod: FakeRunPod) -> None:
    """RunPod's 429 has no Retry-After but an IETF `RateLimit` header (`t=12`): the loop backs
    the queue off until then, rather than guessing."""
    rp = make_runpod(fake_runpod, gpu_types=PREFS)
    offer = rp.find_offers(spec())[0]
    fake_runpod.rate_limit_next = 1
    with pytest.raises(RateLimitedError) as info:
        rp.create(offer, launch())
    assert info.value.retry_after == 12.0


# ---------------------------------------------------------------- stop / start (warm pools)


def running_pod(fake: FakeRunPod, **cfg: object) -> tuple[RunPodProvider, str]:
    rp = make_runpod(fake, gpu_types=PREFS, **cfg)
    m = rp.create(rp.find_offers(spec())[0], launch())
    assert rp.get(m.provider_instance_id).status is MachineStatus.RUNNING  # type: ignore[union-attr]
    return rp, m.provider_instance_id


def actions(fake: FakeRunPod, pod_id: str) -> list[object]:
    return [r.body for r in fake.calls("POST", f"/v2/pods/{pod_id}/action")]


def test_stop_and_start_are_pod_actions_and_exited_reads_stopped(fake_runpod: FakeRunPod) -> None:
    rp, pod = running_pod(fake_runpod)
    gpu = fake_runpod.pods[pod]["gpu"]["id"]
    stock = fake_runpod.stock[gpu]
    rp.stop(pod)
    assert actions(fake_runpod, pod) == [{"action": "stop"}]
    got = rp.get(pod)
    assert got is not None and got.status is MachineStatus.STOPPED and got.raw_status == "EXITED"
    assert fake_runpod.pods[pod]["actions"] == ["start", "terminate"]
    assert fake_runpod.stock[gpu] == stock + 1  # a stopped pod holds no GPU
    rp.stop(pod)  # stopped already: nothing is sent
    assert len(actions(fake_runpod, pod)) == 1
    fake_runpod.boot_seconds = 60.0
    rp.start(pod)
    assert actions(fake_runpod, pod)[-1] == {"action": "start"}
    assert rp.get(pod).status is MachineStatus.STARTING  # type: ignore[union-attr]
    assert fake_runpod.stock[gpu] == stock
    rp.start(pod)  # starting already: success, nothing is sent
    assert len(actions(fake_runpod, pod)) == 2
    fake_runpod.boot_seconds = 0.0
    assert rp.get(pod).status is MachineStatus.RUNNING  # type: ignore[union-attr]


def test_error_reads_dead_and_is_never_resumed(fake_runpod: FakeRunPod) -> None:
    rp, pod = running_pod(fake_runpod)
    fake_runpod.kill(pod, "ERROR")
    assert rp.get(pod).status is MachineStatus.DEAD  # type: ignore[union-attr]
    rp.stop(pod)  # nothing runs: success, nothing sent
    with pytest.raises(ResumeRefusedError, match="ERROR"):
        rp.start(pod)
    assert actions(fake_runpod, pod) == []


def test_a_409_is_settled_by_reading_the_pod(fake_runpod: FakeRunPod) -> None:
    """The pod changed between our read and our action (another process stopped or started
    it): the 409 is not an error when the pod is where we wanted it."""
    rp, pod = running_pod(fake_runpod)
    stale = dict(fake_runpod.pods[pod])  # what we read: RUNNING
    real = rp._get_pod
    reads = iter([stale])
    rp._get_pod = lambda pod_id: next(reads, None) or real(pod_id)  # type: ignore[method-assign]
    fake_runpod.kill(pod, "EXITED")  # stopped meanwhile
    rp.stop(pod)
    assert actions(fake_runpod, pod) == [{"action": "stop"}]  # answered 409
    assert rp.get(pod).status is MachineStatus.STOPPED  # type: ignore[union-attr]
    stale = dict(fake_runpod.pods[pod])  # EXITED
    reads = iter([stale])
    with fake_runpod.lock:  # started meanwhile
        fake_runpod._start(fake_runpod.pods[pod])
    rp.start(pod)
    assert actions(fake_runpod, pod)[-1] == {"action": "start"}  # answered 409
    assert rp.get(pod).status is MachineStatus.RUNNING  # type: ignore[union-attr]


def test_the_fake_answers_409_for_an_action_not_allowed(fake_runpod: FakeRunPod) -> None:
    _, pod = running_pod(fake_runpod)
    url = f"{fake_runpod.url}/v2/pods/{pod}/action"
    auth = {"Authorization": f"Bearer {SECRET}"}
    r = requests.post(url, json={"action": "start"}, headers=auth, timeout=5)
    assert r.status_code == 409
    assert r.headers["Content-Type"].startswith("application/problem+json")
    r = requests.post(url, json={"action": "stop"}, headers=auth, timeout=5)
    assert r.status_code == 200 and r.json()["status"] == "EXITED"
    r = requests.post(url, json={"action": "stop"}, headers=auth, timeout=5)
    assert r.status_code == 409
    r = requests.post(url, json={"action": "hibernate"}, headers=auth, timeout=5)
    assert r.status_code == 400 and fake_runpod.expect_violations()  # not in the spec's enum


@pytest.mark.parametrize("how", ["switch", "stock"])
def test_a_start_without_a_gpu_is_stopped_again_and_refused(
    fake_runpod: FakeRunPod, how: str
) -> None:
    """RunPod starts a pod whose GPU was rented meanwhile with none: our worker must not run
    there. The pod is stopped again (no GPU-less worker takes jobs) and the resume refused."""
    rp, pod = running_pod(fake_runpod)
    rp.stop(pod)
    if how == "switch":
        fake_runpod.resume_without_gpu = True
    else:  # someone else rented the host's GPU
        fake_runpod.stock[fake_runpod.pods[pod]["gpu"]["id"]] = 0
    with pytest.raises(ResumeRefusedError, match="without a GPU"):
        rp.start(pod)
    assert [a["action"] for a in actions(fake_runpod, pod)] == ["stop", "start", "stop"]  # type: ignore[index]
    got = rp.get(pod)
    assert got is not None and got.status is MachineStatus.STOPPED
    assert "gpu" not in fake_runpod.pods[pod]


def test_a_running_pod_without_a_gpu_reads_dead(fake_runpod: FakeRunPod) -> None:
    """Had the stop-again failed (or a start come from elsewhere), a GPU-less pod is not
    capacity: DEAD, for the caller to destroy."""
    rp, pod = running_pod(fake_runpod)
    rp.stop(pod)
    fake_runpod.resume_without_gpu = True
    with fake_runpod.lock:
        fake_runpod._start(fake_runpod.pods[pod])
    assert rp.get(pod).status is MachineStatus.DEAD  # type: ignore[union-attr]


def test_a_start_stuck_scheduling_is_accepted_and_stays_starting(fake_runpod: FakeRunPod) -> None:
    rp, pod = running_pod(fake_runpod)  # boot_seconds 0: an unstuck start runs at once
    rp.stop(pod)
    fake_runpod.start_stuck_scheduling = True
    rp.start(pod)  # not an error now: the caller's resume_timeout ends the wait
    for _ in range(3):
        assert rp.get(pod).status is MachineStatus.STARTING  # type: ignore[union-attr]
    rp.stop(pod)  # and a stuck one can still be stopped (or destroyed)
    assert rp.get(pod).status is MachineStatus.STOPPED  # type: ignore[union-attr]


@pytest.mark.parametrize("lost", ["timeout", "500"])
def test_a_stop_whose_answer_is_lost_but_happened_is_success(
    fake_runpod: FakeRunPod, lost: str
) -> None:
    rp, pod = running_pod(fake_runpod)
    fake_runpod.stop_times_out_but_happens = True
    fake_runpod.lost_answer = lost
    fake_runpod.lost_answer_delay = 5.0  # far past the client's 0.3 s read timeout
    t0 = time.monotonic()
    rp.stop(pod)
    assert time.monotonic() - t0 < fake_runpod.lost_answer_delay  # the read timeout, not more
    assert len(actions(fake_runpod, pod)) == 1  # read back, never sent blind again
    assert rp.get(pod).status is MachineStatus.STOPPED  # type: ignore[union-attr]


def test_a_stop_that_did_not_happen_is_transient_and_leaves_it_running(
    fake_runpod: FakeRunPod,
) -> None:
    rp, pod = running_pod(fake_runpod)
    real = rp._http.request

    def refuse_actions(method: str, path: str, **kw: object):  # type: ignore[no-untyped-def]
        if path.endswith("/action"):
            fake_runpod.fail_next = 1  # a 503 before anything happens
        return real(method, path, **kw)  # type: ignore[arg-type]

    rp._http.request = refuse_actions  # type: ignore[method-assign]
    with pytest.raises(TransientError, match="not confirmed"):
        rp.stop(pod)
    assert rp.get(pod).status is MachineStatus.RUNNING  # type: ignore[union-attr]


def test_stop_and_start_of_pods_not_ours_send_nothing(fake_runpod: FakeRunPod) -> None:
    rp = make_runpod(fake_runpod)
    hand = fake_runpod.add_pod("my-notebook")
    fake_runpod.kill(hand, "EXITED")
    sneaky = fake_runpod.add_pod(f"asg-{OTHER_INSTALLATION}-abc123")
    for pod in (hand, sneaky):
        for call in (rp.stop, rp.start):
            with pytest.raises(NotOwnedError):
                call(pod)
    assert not fake_runpod.calls("POST", f"/v2/pods/{hand}/action")
    assert not fake_runpod.calls("POST", f"/v2/pods/{sneaky}/action")
    fake_runpod.live_pods()  # booted by now
    assert fake_runpod.pods[hand]["status"] == "EXITED"
    assert fake_runpod.pods[sneaky]["status"] == "RUNNING"


def test_a_volume_disk_keeps_the_agents_work_folder_and_prices_the_stopped_pod(
    fake_runpod: FakeRunPod,
) -> None:
    rp, pod = running_pod(fake_runpod, volume_gb=40, volume_mount_path="/data")
    body = fake_runpod.calls("POST", "/v2/pods")[-1].body
    assert body["mounts"] == {"persistent": {"size": 40, "path": "/data"}}
    assert body["env"][WORKDIR_ENV] == "/data/autoscaler"
    rp.stop(pod)
    got = rp.get(pod)
    assert got is not None and got.price_per_hour == 0.0  # RunPod's cost of an EXITED pod
    assert got.storage_price_per_hour == pytest.approx(40 * 0.20 / 730, abs=1e-6)
    known = rp.config.known_storage_price(spec())  # what `validate` says the pool costs
    assert known is not None and got.storage_price_per_hour == known[0]
    bare, other = running_pod(fake_runpod)  # no volume: nothing kept, nothing billed
    body = fake_runpod.calls("POST", "/v2/pods")[-1].body
    assert "mounts" not in body and WORKDIR_ENV not in body["env"]
    assert bare.get(other).storage_price_per_hour == 0.0  # type: ignore[union-attr]


def test_a_volume_below_runpods_floor_is_refused_by_the_config_and_by_runpod(
    fake_runpod: FakeRunPod,
) -> None:
    """The spec's persistent mount is 10 GB at least: the config refuses a smaller one with its
    fix, and a create that carried one anyway (a config stored before the check) is RunPod's
    400, nothing rented."""
    with pytest.raises(ValueError, match="smallest volume is 10 GB; set volume_gb to 0"):
        make_runpod(fake_runpod, gpu_types=PREFS, volume_gb=5)
    rp = make_runpod(fake_runpod, gpu_types=PREFS, volume_gb=10)
    rp.config = rp.config.model_copy(update={"volume_gb": 5})  # past the check
    with pytest.raises(ProviderRequestError, match="HTTP 400"):
        rp.create(rp.find_offers(spec())[0], launch())
    assert fake_runpod.expect_violations() and fake_runpod.pods == {}
