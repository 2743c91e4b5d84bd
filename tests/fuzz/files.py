"""The files the product reads, as hostile bytes: config files (a grammar of the config, raw
YAML attacks, mutations of a valid config) and job traces.

Apart from the runners (`harness`) and the CLI cases (`clicases`), which feed on them.
"""

from __future__ import annotations

from typing import Any

import yaml
from hypothesis import strategies as st

from tests.fuzz.values import (
    counts,
    crons,
    durations,
    hostile_scalar,
    mix,
    names,
    sometimes,
    urls,
)


def _block(required: dict[str, Any], optional: dict[str, Any]) -> st.SearchStrategy[Any]:
    base = st.fixed_dictionaries(required, optional=optional)
    unknown = st.dictionaries(
        st.sampled_from(["typo", "max_worker", "x"]), hostile_scalar(), min_size=1, max_size=1
    )
    typo = st.builds(lambda a, b: {**a, **b}, base, unknown)
    return sometimes(typo, base, 12)


def triggers_up() -> st.SearchStrategy[Any]:
    ints = counts(0, 50)
    return st.one_of(
        st.just({"trigger": "no_workers"}),
        _block({"trigger": st.just("queue_depth")}, {"threshold": ints, "target_per_worker": ints}),
        _block({"trigger": st.just("latency"), "max_latency": durations()}, {}),
        _block(
            {"trigger": st.just("metric"), "query": mix(st.just("up"))},
            {
                "url": urls(),
                "url_env": mix(st.just("PROM_URL")),
                "threshold": ints,
                "target_per_worker": ints,
                "timeout": durations(),
            },
        ),
        _block(
            {
                "trigger": st.just("schedule"),
                "cron": crons(),
                "workers": ints,
                "duration": durations(),
            },
            {
                "timezone": mix(
                    st.sampled_from(
                        ["UTC", "Europe/Paris", "Mars/Olympus", "../../etc/passwd", "x" * 300]
                    )
                )
            },
        ),
        st.fixed_dictionaries({"trigger": mix(st.sampled_from(["cpu", "idel"]))}),
    )


def triggers_down() -> st.SearchStrategy[Any]:
    return st.one_of(
        _block({"trigger": st.just("idle"), "timeout": durations()}, {}),
        _block(
            {"trigger": st.just("schedule"), "cron": crons()}, {"timezone": mix(st.just("UTC"))}
        ),
    )


def instance() -> st.SearchStrategy[Any]:
    return _block(
        {
            "gpu": mix(st.just("RTX 4090")),
            "max_price_per_hour": mix(st.sampled_from([0.6, 1, 2.5, 0.01])),
        },
        {
            "gpu_count": counts(1, 16),
            "disk_gb": mix(st.sampled_from([50, 10**18])),
            "image": mix(st.just("img:latest")),
        },
    )


def metrics_block() -> st.SearchStrategy[Any]:
    return _block(
        {},
        {
            "source": mix(st.sampled_from(["celery", "asynq", "redis-list", "redis-stream"])),
            "url": urls(),
            "url_env": mix(st.just("WATCHED")),
            "queue": mix(st.just("q")),
            "sep": mix(st.sampled_from(["\x06\x16", ":"])),
            "priority_steps": mix(st.lists(counts(-5, 300), max_size=5)),
            "global_keyprefix": mix(st.sampled_from(["", "autoscaler-control:"])),
            "management_url": urls(),
            "timeout": durations(),
            "stale_after": durations(),
        },
    )


def autoscale(provider_names: list[str]) -> st.SearchStrategy[Any]:
    return _block(
        {
            "provider": mix(st.sampled_from(provider_names or ["gpu"])),
            "max_workers": counts(0, 20),
            "instance": instance(),
        },
        {
            "enabled": mix(st.booleans()),
            "min_workers": counts(0, 5),
            "priority": counts(-5, 5),
            "scale_up": mix(st.lists(triggers_up(), max_size=3)),
            "scale_down": mix(st.lists(triggers_down(), max_size=2)),
            "poll_interval": durations(),
            "boot_timeout": durations(),
        },
    )


def provider() -> st.SearchStrategy[Any]:
    return st.one_of(
        _block(
            {"kind": st.just("mock")},
            {
                "boot_delay": durations(),
                "price_per_hour": mix(st.sampled_from([0.4, 0.0, 2.0])),
                "boot_failure_rate": mix(st.sampled_from([0.0, 0.5])),
            },
        ),
        _block(
            {"kind": st.just("vast")},
            {
                "countries": mix(st.lists(st.just("US"))),
                "min_cuda_version": mix(st.just(12.1)),
                "base_url": urls(),
                "api_key_env": mix(st.just("VAST_API_KEY")),
            },
        ),
        _block(
            {"kind": st.just("runpod")},
            {
                "gpu_types": mix(st.lists(st.just("RTX"))),
                "cloud_type": mix(st.sampled_from(["SECURE", "HOME"])),
            },
        ),
        _block({"kind": st.just("local")}, {"command": mix(st.just("sleep 1"))}),
        _block(
            {"kind": st.just("container"), "gpus": counts(0, 8)},
            {
                "url": mix(
                    st.sampled_from(
                        [
                            "unix:///run/podman/podman.sock",
                            "tcp://127.0.0.1:2375",
                            "tcp://10.0.0.7:2375",  # refused: no TLS over the network
                        ]
                    )
                ),
                "max_machines": counts(0, 4),
                "command": mix(st.sampled_from([["sleep", "1"], "sleep 1", []])),
                "network": mix(st.sampled_from(["host", "bridge", "no such"])),
            },
        ),
        st.fixed_dictionaries({"kind": mix(st.just("aws"))}),
    )


@st.composite
def config_docs(draw: st.DrawFn) -> Any:
    provs = draw(st.dictionaries(names(), provider(), max_size=2))
    pnames = [p for p in provs if isinstance(p, str)]
    queues = draw(
        st.dictionaries(
            names(),
            _block({}, {"autoscale": autoscale(pnames), "metrics": metrics_block()}),
            min_size=0 if draw(st.integers(0, 9)) == 5 else 1,
            max_size=2,
        )
    )
    top = draw(
        _block(
            {},
            {
                "poll_interval": durations(),
                "boot_timeout": durations(),
                "heartbeat_timeout": durations(),
                "drain_timeout": durations(),
                "backoff": _block(
                    {}, {"base": durations(), "cap": durations(), "jitter": mix(st.just(0.2))}
                ),
                "limits": _block(
                    {},
                    {
                        "max_machines": counts(0, 10),
                        "max_price_per_hour": mix(st.sampled_from([0, 3.5])),
                    },
                ),
            },
        )
    )
    doc: dict[Any, Any] = {**top, "queues": queues}
    if provs or draw(st.booleans()):
        doc["providers"] = provs
    if draw(st.integers(0, 19)) == 7:
        return draw(hostile_scalar())  # not even a mapping
    return doc


def _dump(doc: Any) -> str:
    try:
        return yaml.safe_dump(doc, allow_unicode=True)
    except yaml.YAMLError:
        return yaml.safe_dump(repr(doc))


def _bomb(levels: int, width: int) -> str:
    lines = [f"a0: &a0 [{', '.join(['x'] * width)}]"]
    for i in range(1, levels):
        lines.append(f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * width)}]")
    lines.append(f"queues: [{', '.join([f'*a{levels - 1}'] * width)}]")
    return "\n".join(lines) + "\n"


RAW_TEXTS = [
    lambda n: "queues: " + "[" * n + "]" * n,
    lambda n: "queues: " + "{a: " * n + "1" + "}" * n,
    lambda n: "".join(" " * i + "a:\n" for i in range(n)) + " " * n + "a: 1\n",
    lambda n: _bomb(2 + n % 8, 2 + n % 9),
    lambda n: "queues: &q {jobs: *q}\n",
    lambda n: "queues:\n  a: {}\nqueues:\n  b: {}\n",
    lambda n: "max_workers: 1" + "0" * n + "\n",
    lambda n: "queues:\n\tjobs: {}\n",
    lambda n: "".join(f"k{i}: {i}\n" for i in range(n * 10)),
    lambda n: "%YAML 1.1\n---\nqueues: {}\n---\nqueues: {}\n",
    lambda n: "!!python/object/apply:os.system ['true']\n",
    lambda n: "? [a, b]\n: 1\n",
    lambda n: "queues: !!binary aGVsbG8=\n",
    lambda n: "a: 2025-01-01\nqueues: {x: {autoscale: {provider: 2025-01-01}}}\n",
]


@st.composite
def config_bytes(draw: st.DrawFn) -> bytes:
    """A config file's bytes: the grammar, hostile raw texts, mutations, or random bytes."""
    kind = draw(st.integers(0, 9))
    if kind <= 4:
        return _dump(draw(config_docs())).encode("utf-8", "surrogatepass")
    if kind <= 6:
        maker = draw(st.sampled_from(RAW_TEXTS))
        return maker(draw(st.integers(1, 600))).encode()
    if kind <= 8:  # mutate a valid config
        text = bytearray(VALID_CONFIG.encode())
        for _ in range(draw(st.integers(1, 4))):
            at = draw(st.integers(0, len(text)))
            chunk = draw(
                st.binary(max_size=4)
                | st.sampled_from(
                    [b"\xff", b"&a ", b"*a", b"[", b"\t", b"\n  ", b":", b"\x00", b"9" * 40]
                )
            )
            text[at : at + draw(st.integers(0, 3))] = chunk
        return bytes(text)
    return draw(st.binary(max_size=200))


VALID_CONFIG = """\
providers:
  gpu: {kind: mock, boot_delay: 20s, price_per_hour: 0.4}
queues:
  jobs:
    metrics: {url: "redis://127.0.0.1:6379/0"}
    autoscale:
      provider: gpu
      max_workers: 4
      scale_up:
        - {trigger: queue_depth, threshold: 5}
        - {trigger: schedule, cron: "0 8 * * 1-5", workers: 1, duration: 1h}
      scale_down: [{trigger: idle, timeout: 10m}]
      instance: {gpu: "RTX 4090", max_price_per_hour: 0.6}
"""


@st.composite
def trace_bytes(draw: st.DrawFn) -> tuple[str, bytes]:
    suffix = draw(st.sampled_from([".csv", ".jsonl"]))
    num = st.one_of(
        st.floats(allow_nan=True, allow_infinity=True).map(repr),
        st.integers(-10, 10**6).map(str),
        st.sampled_from(
            [
                "1e12",
                "9" * 400,
                "9" * 5000,
                "true",
                "null",
                "",
                '"5"',
                "-0",
                "1e999",
                "[" * 3000 + "]" * 3000,
                "{}",
                "NaN",
                "0x10",
            ]
        ),
    )
    rows = draw(st.lists(st.tuples(num, num), max_size=8))
    if suffix == ".csv":
        header = draw(
            st.sampled_from(
                [
                    "arrival_s,runtime_s",
                    "arrival_s,runtime_s,queue",
                    "runtime_s",
                    "",
                    "arrival_s;runtime_s",
                ]
            )
        )
        body = header + "\n" + "".join(f"{a},{r}\n" for a, r in rows)
    else:
        body = "".join(f'{{"arrival_s": {a}, "runtime_s": {r}}}\n' for a, r in rows)
    data = body.encode()
    if draw(st.integers(0, 4)) == 0:
        at = draw(st.integers(0, len(data)))
        data = (
            data[:at]
            + draw(
                st.binary(max_size=6) | st.sampled_from([b"\xff", b"\x00", b'"', b"1" * 200_000])
            )
            + data[at:]
        )
    return suffix, data
