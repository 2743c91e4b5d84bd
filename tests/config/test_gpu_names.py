"""The GPU table: every spelling of a GPU finds it, unknown names get did-you-mean, and a config
asking RunPod or Vast for a GPU the table does not know is refused where it says so."""

from __future__ import annotations

import textwrap

import pytest
from hypothesis import given
from hypothesis import strategies as st

from autoscaler.config import ConfigError, Refusal, load_config_text
from autoscaler.config.gpus import GPUS, Gpu, _key, canonical, lookup, suggest
from autoscaler.config.provider_options import VastOptions

# ---------------------------------------------------------------- the table


@pytest.mark.parametrize(
    "spelling",
    [
        "RTX 4090",
        "rtx 4090",
        "rtx_4090",
        "RTX4090",
        "rtx-4090",
        "NVIDIA GeForce RTX 4090",
        "nvidia_geforce_rtx_4090",
        "  RTX  4090 ",
    ],
)
def test_every_spelling_of_the_4090_finds_it(spelling: str) -> None:
    gpu = lookup(spelling)
    assert gpu == Gpu("RTX 4090", "NVIDIA GeForce RTX 4090", "RTX 4090", 24)


@pytest.mark.parametrize(
    ("spelling", "name", "runpod", "vast"),
    [
        ("A100 80GB", "A100 80GB", "NVIDIA A100 80GB PCIe", "A100 PCIE"),
        ("A100_PCIE", "A100 80GB", "NVIDIA A100 80GB PCIe", "A100 PCIE"),  # Vast's CLI spelling
        ("A100 PCIe", "A100 80GB", "NVIDIA A100 80GB PCIe", "A100 PCIE"),  # RunPod's display
        ("NVIDIA A100-SXM4-80GB", "A100 SXM", "NVIDIA A100-SXM4-80GB", "A100 SXM4"),
        ("H100_SXM", "H100 SXM", "NVIDIA H100 80GB HBM3", "H100 SXM"),
        ("nvidia h100 80gb hbm3", "H100 SXM", "NVIDIA H100 80GB HBM3", "H100 SXM"),
        ("l40s", "L40S", "NVIDIA L40S", "L40S"),
        ("RTX_6000Ada", "RTX 6000 Ada", "NVIDIA RTX 6000 Ada Generation", "RTX 6000Ada"),
        ("RTX 4080S", "RTX 4080 SUPER", "NVIDIA GeForce RTX 4080 SUPER", "RTX 4080S"),
        ("H200", "H200 SXM", "NVIDIA H200", "H200"),
        ("B300", "B300", "NVIDIA B300 SXM6 AC", None),  # RunPod only
        ("gtx_1080_ti", "GTX 1080 Ti", None, "GTX 1080 Ti"),  # Vast only
    ],
)
def test_lookup_maps_to_each_providers_identifier(
    spelling: str, name: str, runpod: str | None, vast: str | None
) -> None:
    gpu = lookup(spelling)
    assert gpu is not None
    assert (gpu.name, gpu.runpod, gpu.vast) == (name, runpod, vast)


@pytest.mark.parametrize("unknown", ["RTX 4009", "A100", "", "NVIDIA", "rtx 40 90 ti super"])
def test_unknown_names_find_nothing_and_canonical_leaves_them_as_written(unknown: str) -> None:
    assert lookup(unknown) is None
    assert canonical(unknown) == unknown


def test_canonical_compares_offers_of_different_providers_by_gpu() -> None:
    runpod_offer, vast_offer = "NVIDIA GeForce RTX 4090", "RTX 4090"
    assert canonical(runpod_offer) == canonical(vast_offer) == "RTX 4090"
    assert canonical("NVIDIA A100 80GB PCIe") == canonical("A100 PCIE") == "A100 80GB"
    assert canonical("A100 SXM4") != canonical("A100 PCIE")


def test_suggestions_are_table_names_closest_first() -> None:
    assert suggest("RTX 4009")[0] == "RTX 4090"
    assert suggest("rtx4900")[0] == "RTX 4090"
    assert set(suggest("H100")) == {"H100 SXM", "H100 NVL", "H100 PCIe"}
    assert "A100 80GB" in suggest("A100") and "A100 SXM" in suggest("A100")
    assert suggest("L40s ") == ["L40S", "L40", "L4"]  # a known name is its own first suggestion
    assert len(suggest("RTX 30", n=5)) == 5
    assert suggest("zzzz") == []
    names = {g.name for g in GPUS}
    assert all(s in names for q in ("4090", "a10", "tesla", "quadro x") for s in suggest(q))


def test_no_two_gpus_share_a_spelling_and_names_are_unique() -> None:
    owner: dict[str, str] = {}
    for gpu in GPUS:
        for spelling in (gpu.name, gpu.runpod, gpu.vast):
            if spelling is not None:
                assert owner.setdefault(_key(spelling), gpu.name) == gpu.name, spelling
    assert len({g.name for g in GPUS}) == len(GPUS)
    assert all(g.runpod or g.vast for g in GPUS)
    assert all(g.memory_gb is None or 1 <= g.memory_gb <= 1024 for g in GPUS)


@given(st.sampled_from(GPUS), st.sampled_from(["name", "runpod", "vast"]), st.data())
def test_every_spelling_of_every_entry_looks_up_to_it(gpu: Gpu, field: str, data) -> None:
    spelling = getattr(gpu, field)
    if spelling is None:
        return
    # The same spelling, re-cased and with its spaces turned into '_', '-' or nothing.
    seps = data.draw(st.lists(st.sampled_from([" ", "_", "-", "", "  "]), min_size=10, max_size=10))
    cased = data.draw(st.sampled_from([str.lower, str.upper, str.title, str]))
    parts = cased(spelling).split(" ")
    written = parts[0] + "".join(s + p for s, p in zip(seps, parts[1:], strict=False))
    assert lookup(written) == gpu
    assert canonical(written) == gpu.name


# ---------------------------------------------------------------- the loader's refusal


PROVIDERS = """\
providers:
  gpu-runpod: {kind: runpod, api_key_env: RUNPOD_API_KEY}
  gpu-vast: {kind: vast, api_key_env: VAST_API_KEY}
  sandbox: {kind: mock}
  desk: {kind: local}
  box: {kind: container, gpus: 1, gpu: "Team's own RTX 4090 rig"}
"""


def config(provider: str, gpu: str, extra: str = "") -> str:
    queue = textwrap.dedent(
        f"""\
        queues:
          inference:
            autoscale:
              provider: {provider}
              max_workers: 2
              scale_up: [{{trigger: no_workers}}]
              scale_down: [{{trigger: idle, timeout: 10m}}]
              instance: {{gpu: {gpu}, max_price_per_hour: 0.60}}
        """
    )
    return PROVIDERS + extra + queue


def refusals(text: str) -> list[Refusal]:
    with pytest.raises(ConfigError) as exc:
        load_config_text(text, "gpus.yaml")
    return exc.value.refusals


@pytest.mark.parametrize(("provider", "kind"), [("gpu-runpod", "runpod"), ("gpu-vast", "vast")])
def test_an_unknown_gpu_is_refused_for_runpod_and_vast(provider: str, kind: str) -> None:
    (refusal,) = refusals(config(provider, '"RTX 4009"'))
    assert refusal.path == "queues.inference.autoscale.instance.gpu"
    assert "unknown GPU 'RTX 4009'" in refusal.cause
    assert f"'{provider}' ({kind})" in refusal.cause
    assert "autoscaler/config/gpus.py" in refusal.cause
    assert refusal.fix.startswith("did you mean 'RTX 4090'")
    assert "RunPod's GPU id or Vast's gpu_name" in refusal.fix


def test_each_unknown_gpu_of_a_list_is_refused_and_known_spellings_pass() -> None:
    text = config("gpu-vast", '["rtx_4090", "NVIDIA A100 80GB PCIe", "H100 SMX", "Tesla T4"]')
    (refusal,) = refusals(text)
    assert "unknown GPU 'H100 SMX'" in refusal.cause
    assert "'H100 SXM'" in refusal.fix
    both = config("gpu-runpod", '["RTX 4009", "A100 80G"]')
    assert [r.cause.split(" (")[0] for r in refusals(both)] == [
        "unknown GPU 'RTX 4009'",
        "unknown GPU 'A100 80G'",
    ]


def test_a_name_with_nothing_close_says_where_the_table_is() -> None:
    (refusal,) = refusals(config("gpu-runpod", '"quantum abacus"'))
    assert "did you mean" not in refusal.fix
    assert "autoscaler/config/gpus.py" in refusal.cause


@pytest.mark.parametrize("provider", ["sandbox", "desk", "box"])
def test_mock_local_and_container_take_any_name(provider: str) -> None:
    loaded = load_config_text(config(provider, '"Team\'s own RTX 4090 rig"'), "gpus.yaml")
    assert loaded.queues["inference"].autoscale is not None


def test_a_registered_provider_is_judged_by_its_kind() -> None:
    text = config("gpu-stored", '"RTX 4009"').replace(PROVIDERS, "providers: {}\n")
    registered = {"gpu-stored": VastOptions(kind="vast")}
    with pytest.raises(ConfigError) as exc:
        load_config_text(text, "gpus.yaml", registered)
    (refusal,) = exc.value.refusals
    assert "'gpu-stored' (vast)" in refusal.cause
    ok = config("gpu-stored", '"RTX 4090"').replace(PROVIDERS, "providers: {}\n")
    assert load_config_text(ok, "gpus.yaml", registered).queues["inference"].autoscale


def test_runpod_gpu_types_are_checked_too() -> None:
    extra = (
        "  picky:\n"
        "    kind: runpod\n"
        '    gpu_types: ["NVIDIA GeForce RTX 4090", "A100 80GB", "NVIDIA RTX A5001", "rtx_3090"]\n'
    )
    text = config("gpu-runpod", '"RTX 4090"').replace("queues:", extra + "queues:")
    (refusal,) = refusals(text)
    assert refusal.path == "providers.picky.gpu_types"
    assert "unknown GPU 'NVIDIA RTX A5001'" in refusal.cause
    assert "RunPod provider 'picky'" in refusal.cause
    assert refusal.fix.startswith("did you mean 'RTX A5000'")
    vast_only = text.replace('"rtx_3090"', '"GTX 1080 Ti"')
    (refusal,) = refusals(vast_only.replace("NVIDIA RTX A5001", "NVIDIA RTX A5000"))
    assert refusal.path == "providers.picky.gpu_types"
    assert refusal.cause.startswith("RunPod does not offer 'GTX 1080 Ti'")
    assert "remove it from gpu_types" in refusal.fix


def test_the_refusals_are_what_validate_prints() -> None:
    with pytest.raises(ConfigError) as exc:
        load_config_text(config("gpu-runpod", '"RTX 4009"'), "gpus.yaml")
    rendered = exc.value.render()
    assert "queues.inference.autoscale.instance.gpu: unknown GPU 'RTX 4009'" in rendered
    assert "fix: did you mean 'RTX 4090'" in rendered
