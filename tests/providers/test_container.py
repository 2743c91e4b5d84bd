"""The container provider against a real Podman engine (its Docker-compatible API on a socket
of this session's): containers made, found, stopped and removed for real.

Each test uses fresh installation ids (`installations`): the engine's storage is shared with
whatever else runs podman here, and teardown removes every container labelled for them.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable
from functools import partial
from pathlib import Path

import pytest

from autoscaler.access.credentials import validate_provider
from autoscaler.config import ConfigError
from autoscaler.config.provider_options import ContainerOptions
from autoscaler.providers import (
    AuthError,
    CapacityError,
    LaunchSpec,
    MachineStatus,
    NotOwnedError,
    Offer,
    ProviderRequestError,
    ResumeRefusedError,
    TransientError,
    create_on_first_offer,
)
from autoscaler.providers.container import ContainerProvider
from autoscaler.providers.container_spec import GPU_IDS_KEY, LABEL_KEY
from tests.containers import engine as kit
from tests.containers.engine import Engine
from tests.providers.conftest import assert_no_secret, make_container, spec

TOKEN = "wtk_SECRET_9c1f0e77b2a4_worker_token"
Fresh = Callable[[], str]


def launch(installation: str, **env: str) -> LaunchSpec:
    base = {"AUTOSCALER_QUEUE": "inference", "AUTOSCALER_WORKER_TOKEN": TOKEN}
    return LaunchSpec.new(installation, uuid.uuid4().hex, {**base, **env})


def inspect(container_id: str) -> dict:  # type: ignore[type-arg]
    return json.loads(kit.podman("inspect", container_id).stdout)[0]  # type: ignore[no-any-return]


def labelled(label: str) -> list[str]:
    return kit.container_ids(f"label={LABEL_KEY}={label}")


def test_create_get_list_and_destroy_for_real(podman_engine: Engine, installations: Fresh) -> None:
    inst = installations()
    p = make_container(podman_engine, inst, price_per_hour=0.25)
    offers = p.find_offers(spec(image=podman_engine.image))
    assert len(offers) == 1 and offers[0].price_per_hour == 0.25
    host = json.loads(kit.podman("info", "--format", "json").stdout)["host"]["hostname"]
    assert offers[0].host_id == host
    lx = launch(inst)
    m = p.create(offers[0], lx)
    assert m.status is MachineStatus.RUNNING and m.label == lx.label and m.host_id == host
    seen = inspect(m.provider_instance_id)
    assert seen["Name"].lstrip("/") == lx.label  # named after the launch, and labelled with it
    assert seen["Config"]["Labels"][LABEL_KEY] == lx.label
    assert seen["HostConfig"]["RestartPolicy"]["Name"] in ("no", "")
    assert seen["HostConfig"]["NetworkMode"] == "bridge"  # never the host's own network
    other = make_container(podman_engine, inst)  # another process, same installation
    assert [x.provider_instance_id for x in other.list_owned()] == [m.provider_instance_id]
    got = other.get(m.provider_instance_id)
    assert got is not None and got.status is MachineStatus.RUNNING and got.price_per_hour == 0.25
    assert other.find_by_label(lx.label) == got
    other.destroy(m.provider_instance_id)
    assert labelled(lx.label) == []
    assert p.get(m.provider_instance_id) is None and p.list_owned() == []
    assert p.find_by_label(lx.label) is None
    p.destroy(m.provider_instance_id)  # already gone: success


def test_a_second_create_for_one_launch_returns_the_first_container(
    podman_engine: Engine, installations: Fresh
) -> None:
    inst = installations()
    p = make_container(podman_engine, inst, max_machines=3)
    offer = p.find_offers(spec(image=podman_engine.image))[0]
    lx = launch(inst)
    first = create_on_first_offer(p, [offer], lx)
    assert create_on_first_offer(p, [offer], lx) == first
    assert p.create(offer, lx) == first
    # A create that does not see the first one (a race): the engine refuses the taken name
    # (Podman: 500, Docker: 409) and the container with our label is returned.
    real, calls = p._labelled, []

    def blind(label: str) -> dict | None:  # type: ignore[type-arg]
        calls.append(label)
        return None if len(calls) == 1 else real(label)  # the first lookup misses it

    p._labelled = blind  # type: ignore[method-assign]
    try:
        missed = p._create(offer, lx)
    finally:
        p._labelled = real  # type: ignore[method-assign]
    assert missed.provider_instance_id == first.provider_instance_id
    assert labelled(lx.label) == [first.provider_instance_id]


def test_the_container_gets_the_launch_environment_and_nothing_of_ours(
    podman_engine: Engine, installations: Fresh, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AUTOSCALER_VAULT_KEY", "vault-SECRET-must-not-leak")
    monkeypatch.setenv("RUNPOD_API_KEY", "rpa-SECRET-must-not-leak")
    monkeypatch.setenv("HTTP_PROXY", "http://proxy-SECRET-must-not-leak:3128")
    inst = installations()
    p = make_container(podman_engine, inst)
    lx = launch(inst)
    m = p.create(p.find_offers(spec(image=podman_engine.image))[0], lx)
    config_env = dict(e.split("=", 1) for e in inspect(m.provider_instance_id)["Config"]["Env"])
    running = kit.podman("exec", m.provider_instance_id, "env").stdout
    image_env = inspect_image_env(podman_engine.image)
    for key, value in lx.env.items():
        assert config_env[key] == value and f"{key}={value}" in running
    engine_adds = {"PATH", "HOME", "HOSTNAME", "TERM", "container"}
    assert set(config_env) - set(lx.env) <= engine_adds | set(image_env), config_env
    assert "SECRET-must-not-leak" not in json.dumps(config_env) + running


def inspect_image_env(image: str) -> dict[str, str]:
    seen = json.loads(kit.podman("image", "inspect", image).stdout)[0]
    return dict(e.split("=", 1) for e in (seen.get("Config", {}).get("Env") or []))


def test_hand_made_containers_are_never_listed_nor_touched(
    podman_engine: Engine, installations: Fresh
) -> None:
    inst, foreign = installations(), installations()
    p = make_container(podman_engine, inst)
    plain = kit.run_by_hand(podman_engine.image, f"hand-{uuid.uuid4().hex[:10]}")
    foreign_label = f"asg-{foreign}-{uuid.uuid4().hex}"
    theirs = kit.run_by_hand(
        podman_engine.image, f"theirs-{uuid.uuid4().hex[:10]}", labels={LABEL_KEY: foreign_label}
    )
    mine = p.create(p.find_offers(spec(image=podman_engine.image))[0], launch(inst))
    assert [m.provider_instance_id for m in p.list_owned()] == [mine.provider_instance_id]
    for cid in (plain, theirs):
        assert p.get(cid) is None
        with pytest.raises(NotOwnedError):
            p.destroy(cid)
        with pytest.raises(NotOwnedError):
            p.stop(cid)
        with pytest.raises(NotOwnedError):
            p.start(cid)
        assert inspect(cid)["State"]["Status"] == "running"
    assert p.find_by_label(foreign_label) is None
    p.destroy("hand-made name with spaces")  # not a container id: nothing happens
    assert p.get("../../etc") is None


def test_destroy_kills_a_container_that_ignores_sigterm_after_the_grace(
    podman_engine: Engine, installations: Fresh
) -> None:
    inst = installations()
    stubborn = make_container(
        podman_engine, inst, grace=1.0, command="trap '' TERM; sleep infinity & wait"
    )
    m = stubborn.create(stubborn.find_offers(spec(image=podman_engine.image))[0], launch(inst))
    t0 = time.monotonic()
    stubborn.destroy(m.provider_instance_id)
    assert 1.0 <= time.monotonic() - t0 < 10
    assert stubborn.get(m.provider_instance_id) is None
    # One that stops on SIGTERM goes at once, whatever the grace.
    polite = make_container(podman_engine, inst, grace=20.0)
    m = polite.create(polite.find_offers(spec(image=podman_engine.image))[0], launch(inst))
    t0 = time.monotonic()
    polite.destroy(m.provider_instance_id)
    assert time.monotonic() - t0 < 10 and polite.get(m.provider_instance_id) is None


def test_stop_and_start_keep_the_containers_files(
    podman_engine: Engine, installations: Fresh
) -> None:
    inst = installations()
    p = make_container(podman_engine, inst)
    assert p.can_stop
    m = p.create(p.find_offers(spec(image=podman_engine.image))[0], launch(inst))
    kit.podman("exec", m.provider_instance_id, "sh", "-c", "echo kept > /tmp/warm")
    p.stop(m.provider_instance_id)
    stopped = p.get(m.provider_instance_id)
    assert stopped is not None and stopped.status is MachineStatus.STOPPED
    assert stopped.storage_price_per_hour == 0.0
    p.start(m.provider_instance_id)
    started = p.get(m.provider_instance_id)
    assert started is not None and started.status is MachineStatus.RUNNING
    assert kit.podman("exec", m.provider_instance_id, "cat", "/tmp/warm").stdout == "kept\n"
    p.destroy(m.provider_instance_id)
    p.stop(m.provider_instance_id)  # gone: not running, as asked
    with pytest.raises(ResumeRefusedError, match="does not exist"):
        p.start(m.provider_instance_id)


def test_paused_reads_stopped_is_resumed_by_start_and_stopped_by_stop(
    podman_engine: Engine, installations: Fresh
) -> None:
    """A paused container keeps everything and `start` thaws it: STOPPED (a pause we did not
    make is the caller's to judge). A stop thaws it first, or its SIGTERM would wait."""
    inst = installations()
    p = make_container(podman_engine, inst, grace=20.0)
    m = p.create(p.find_offers(spec(image=podman_engine.image))[0], launch(inst))
    kit.podman("pause", m.provider_instance_id)
    got = p.get(m.provider_instance_id)
    assert got is not None and got.status is MachineStatus.STOPPED and got.raw_status == "paused"
    p.start(m.provider_instance_id)
    assert p.get(m.provider_instance_id).status is MachineStatus.RUNNING  # type: ignore[union-attr]
    kit.podman("pause", m.provider_instance_id)
    t0 = time.monotonic()
    p.stop(m.provider_instance_id)
    assert time.monotonic() - t0 < 15  # thawed, so SIGTERM ended it before the 20 s grace
    got = p.get(m.provider_instance_id)
    assert got is not None and got.status is MachineStatus.STOPPED and got.raw_status != "paused"
    p.destroy(m.provider_instance_id)
    assert p.get(m.provider_instance_id) is None


def test_a_gpu_request_the_engine_drops_is_refused_and_leaves_nothing(
    podman_engine: Engine, installations: Fresh, all_logs: pytest.LogCaptureFixture
) -> None:
    """This engine has no GPU, and Podman's Docker-compatible API accepts a GPU request and
    ignores it: the container would run without its GPU. It is removed, and the error says so."""
    inst = installations()
    p = make_container(podman_engine, inst, gpus=1, gpu="RTX 4090")
    (offer,) = p.find_offers(spec(image=podman_engine.image))
    assert offer.gpu_count == 1 and offer.details["gpus"] == "1 of 1 free"
    lx = launch(inst)
    with pytest.raises(ProviderRequestError) as info:
        create_on_first_offer(p, [offer], lx)
    text = str(info.value)
    assert "GPU request" in text and "removed" in text and "gpus: 0" in text
    assert labelled(lx.label) == [] and p.list_owned() == []
    assert_no_secret(all_logs, info.value, secret=TOKEN)


def test_gpus_0_runs_without_gpus_and_says_so(podman_engine: Engine, installations: Fresh) -> None:
    inst = installations()
    p = make_container(podman_engine, inst, gpus=0)
    (offer,) = p.find_offers(spec(image=podman_engine.image, gpu_count=2))
    assert offer.gpu_count == 0 and "no GPU is asked" in offer.details["gpus"]
    m = p.create(offer, launch(inst))
    assert not inspect(m.provider_instance_id)["HostConfig"].get("DeviceRequests")


def test_a_container_the_engine_cannot_start_is_removed(
    podman_engine: Engine, installations: Fresh, all_logs: pytest.LogCaptureFixture
) -> None:
    inst = installations()
    # Without an init process the runtime itself runs the command, and refuses at start.
    p = make_container(podman_engine, inst, command=["/no/such/program"], init=False)
    lx = launch(inst)
    with pytest.raises(ProviderRequestError, match="the container was removed") as info:
        p.create(p.find_offers(spec(image=podman_engine.image))[0], lx)
    assert labelled(lx.label) == []
    assert_no_secret(all_logs, info.value, secret=TOKEN)


def test_capacity_machines_gpus_model_and_price(
    podman_engine: Engine, installations: Fresh
) -> None:
    inst = installations()
    p = make_container(podman_engine, inst, max_machines=1, price_per_hour=0.5)
    want = spec(image=podman_engine.image)
    (offer,) = p.find_offers(want)
    assert p.find_offers(spec(image=podman_engine.image, max_price_per_hour=0.4)) == []
    m = p.create(offer, launch(inst))
    assert p.find_offers(want) == []  # max_machines reached: no offer
    with pytest.raises(CapacityError, match="max_machines"):
        p.create(offer, launch(inst))  # a stale offer
    p.destroy(m.provider_instance_id)
    assert len(p.find_offers(want)) == 1
    # GPUs held by our live containers (GPU ids in their label) are not offered again.
    q = make_container(podman_engine, inst, gpus=2, gpu="RTX 4090", max_machines=4)
    kit.run_by_hand(
        podman_engine.image,
        f"holder-{uuid.uuid4().hex[:8]}",
        labels={LABEL_KEY: f"asg-{inst}-{uuid.uuid4().hex}", GPU_IDS_KEY: "0"},
    )
    assert q.find_offers(spec(image=podman_engine.image, gpu_count=2)) == []
    (one,) = q.find_offers(spec(image=podman_engine.image, gpu_count=1))
    assert one.details["gpus"] == "1 of 2 free"
    assert q.find_offers(spec(image=podman_engine.image, gpu="A100 80GB")) == []
    assert q.find_offers(spec(image=podman_engine.image, gpu="rtx  4090", gpu_count=1))
    assert q.find_offers(spec(image=podman_engine.image, gpu_count=3)) == []


def test_a_start_whose_gpu_another_container_of_ours_took_is_refused(
    podman_engine: Engine, installations: Fresh
) -> None:
    """Stopped, a container holds no GPU; if another of ours got its GPU meanwhile, starting it
    would share the GPU: refused as a resume (the caller destroys it), nothing started."""
    inst = installations()
    p = make_container(podman_engine, inst, gpus=1, gpu="RTX 4090", grace=0.0)
    stopped = kit.run_by_hand(
        podman_engine.image,
        f"warm-{uuid.uuid4().hex[:8]}",
        labels={LABEL_KEY: f"asg-{inst}-{uuid.uuid4().hex}", GPU_IDS_KEY: "0"},
    )
    p.stop(stopped)
    assert p.get(stopped).status is MachineStatus.STOPPED  # type: ignore[union-attr]
    kit.run_by_hand(  # the GPU's new holder
        podman_engine.image,
        f"holder-{uuid.uuid4().hex[:8]}",
        labels={LABEL_KEY: f"asg-{inst}-{uuid.uuid4().hex}", GPU_IDS_KEY: "0"},
    )
    with pytest.raises(ResumeRefusedError, match="GPU 0 is held"):
        p.start(stopped)
    assert p.get(stopped).status is MachineStatus.STOPPED  # type: ignore[union-attr]


def test_the_later_of_two_racing_creates_backs_off(
    podman_engine: Engine, installations: Fresh
) -> None:
    """Two workers launching on one engine both saw room for one more container: the one the
    engine created second removes itself."""
    inst = installations()
    p = make_container(podman_engine, inst, max_machines=1)
    offer = p.find_offers(spec(image=podman_engine.image))[0]
    first = p.create(offer, launch(inst))
    real = p._owned
    calls = {"n": 0}

    def blind() -> list[dict]:  # type: ignore[type-arg]
        calls["n"] += 1
        return [] if calls["n"] == 1 else real()  # the capacity check misses the first

    p._owned = blind  # type: ignore[method-assign]
    late = launch(inst)
    with pytest.raises(CapacityError, match="backed off"):
        p.create(offer, late)
    p._owned = real  # type: ignore[method-assign]
    assert labelled(late.label) == []
    assert [m.provider_instance_id for m in p.list_owned()] == [first.provider_instance_id]


def test_a_missing_image_is_refused_naming_it(
    podman_engine: Engine, installations: Fresh, all_logs: pytest.LogCaptureFixture
) -> None:
    inst = installations()
    p = make_container(podman_engine, inst)
    image = f"localhost/no-such-image-{uuid.uuid4().hex[:8]}:1"
    lx = launch(inst)
    with pytest.raises(ProviderRequestError) as info:
        create_on_first_offer(p, p.find_offers(spec(image=image)), lx)
    assert image in str(info.value) and "build" in str(info.value) and "pull" in str(info.value)
    assert labelled(lx.label) == []
    assert_no_secret(all_logs, info.value, secret=TOKEN)


def test_an_unreachable_engine_is_a_transient_error(tmp_path: Path, installations: Fresh) -> None:
    inst = installations()
    lx = LaunchSpec.new(inst, "l1", {"AUTOSCALER_WORKER_TOKEN": TOKEN})
    certs = kit.make_certificates(tmp_path)
    tls = {
        "ca_cert": str(certs["ca"]),
        "client_cert": str(certs["client_cert"]),
        "client_key": str(certs["client_key"]),
    }
    for url, options in ((f"unix://{tmp_path}/none.sock", {}), ("tcp://127.0.0.1:9", {"tls": tls})):
        config = ContainerOptions.model_validate(
            {"kind": "container", "url": url, "gpus": 0, **options}
        )
        p = ContainerProvider("gpu-box", config, inst, timeout=2.0)
        offer = Offer(p.name, "container:x", "RTX 4090", 1, 0.0, spec())
        calls: list[Callable[[], object]] = [
            partial(p.find_offers, spec()),
            p.list_owned,
            partial(p.get, "abc"),
            partial(p.destroy, "abc"),
            partial(p.create, offer, lx),
        ]
        for call in calls:
            with pytest.raises(TransientError, match="did not answer") as info:
                call()
            assert url.split("://")[1] in str(info.value) and TOKEN not in str(info.value)


def test_an_engine_api_over_the_network_needs_tls() -> None:
    with pytest.raises(ConfigError) as info:
        validate_provider("gpu-box", "container", {"url": "tcp://10.1.2.3:2375", "gpus": 1})
    text = info.value.render()
    assert "gpu-box" in text and "without TLS" in text and "root" in text and "tls" in text
    for url in ("tcp://127.0.0.1:2375", "tcp://localhost:2375", "tcp://[::1]:2375"):
        with pytest.raises(ConfigError, match="even on loopback"):  # any container reaches it
            validate_provider("gpu-box", "container", {"url": url, "gpus": 1})
    tls = {"ca_cert": "/etc/e/ca.pem", "client_cert": "/etc/e/c.pem", "client_key": "/etc/e/k.pem"}
    validate_provider("gpu-box", "container", {"url": "tcp://10.1.2.3:2376", "gpus": 1, "tls": tls})
    for bad in (
        {"url": "tcp://10.1.2.3:2376", "gpus": 1, "tls": {**tls, "client_key": "k.pem"}},
        {"url": "unix:///run/podman/podman.sock", "gpus": 1, "tls": tls},
        {"url": "unix://podman.sock", "gpus": 1},
        {"url": "http://10.1.2.3:2375", "gpus": 1},
        {"gpus": -1},
        {"gpus": 1, "max_machines": 0},
        {"gpus": 1, "command": []},
        {"gpus": 1, "network": "host; rm"},
        {"gpus": 1, "network": "host"},
        {"gpus": 1, "unsafe_host_network": True},
        {},
    ):
        with pytest.raises(ConfigError):
            validate_provider("gpu-box", "container", bad)
    # DOCKER_HOST, when the options name no url, is held to the same rule.
    config = ContainerOptions.model_validate({"kind": "container", "gpus": 0})
    with pytest.raises(ProviderRequestError, match="without verified TLS"):
        ContainerProvider("gpu-box", config, "inst", environ={"DOCKER_HOST": "tcp://10.1.2.3:2375"})
    with pytest.raises(ProviderRequestError, match="even on loopback"):
        ContainerProvider("gpu-box", config, "inst", environ={"DOCKER_HOST": "tcp://127.0.0.1:1"})
    socket_url = "unix:///run/podman/podman.sock"
    assert ContainerProvider(
        "gpu-box", config, "inst", environ={"DOCKER_HOST": socket_url}
    ).url == (socket_url)
    assert ContainerProvider("gpu-box", config, "inst", environ={}).url.startswith("unix://")
    with_tls = ContainerOptions.model_validate(
        {"kind": "container", "gpus": 0, "url": "tcp://10.1.2.3:2376", "tls": tls}
    )
    with pytest.raises(ProviderRequestError, match=r"tls\.ca_cert '/etc/e/ca\.pem' cannot be read"):
        ContainerProvider("gpu-box", with_tls, "inst")


def test_an_engine_behind_mutual_tls_is_reached_with_the_tls_block(
    podman_engine: Engine, installations: Fresh, tmp_path: Path
) -> None:
    """As `dockerd --tlsverify` serves it: the engine's certificate is verified against
    tls.ca_cert, and the engine asks for ours. A wrong CA or an untrusted certificate is an
    AuthError (tell the operator), not a retry."""
    certs = kit.make_certificates(tmp_path)
    tls = {
        "ca_cert": str(certs["ca"]),
        "client_cert": str(certs["client_cert"]),
        "client_key": str(certs["client_key"]),
    }
    inst = installations()
    with kit.tls_front(podman_engine.url, certs) as url:
        p = make_container(podman_engine, inst, url=url, tls=tls)
        m = p.create(p.find_offers(spec(image=podman_engine.image))[0], launch(inst))
        assert [x.provider_instance_id for x in p.list_owned()] == [m.provider_instance_id]
        p.destroy(m.provider_instance_id)
        assert p.get(m.provider_instance_id) is None
        untrusted = {
            **tls,
            "client_cert": str(certs["server_cert"]),
            "client_key": str(certs["server_key"]),
        }
        for bad in ({**tls, "ca_cert": str(certs["other_ca"])}, untrusted):
            q = make_container(podman_engine, inst, url=url, tls=bad)
            with pytest.raises(AuthError, match="TLS handshake"):
                q.list_owned()
