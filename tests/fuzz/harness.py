"""Hostile input generators and the runners that classify what the product does with them.

Shared by the fast fuzz tests (tests/fuzz/test_*.py) and the long run (benchmarks/fuzz.py).
Every case ends in one outcome:

- ``accepted``: a valid input, handled (exit 0);
- ``refused``: a clear refusal (ConfigError / TraceError, or exit 2 with a message);
- ``crash``: anything else (another exception, exit 1 "internal error", a traceback);
- ``hang``: the case ran past its time limit (only where a limit is armed: benchmarks).
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml
from click.testing import CliRunner
from hypothesis import strategies as st

from autoscaler.cli import main
from autoscaler.config import ConfigError, load_config
from autoscaler.config.isolation import check_broker_isolation
from autoscaler.config.summary import describe
from autoscaler.sim.trace import TraceError, load_trace
from autoscaler.vault import generate_key

NOW = datetime(2025, 3, 3, 12, 0, tzinfo=UTC)
REPO = Path(__file__).resolve().parents[2]
SIM_CONFIG = REPO / "autoscaler" / "sim" / "traces" / "sim-config.yaml"

OUTCOMES = ("accepted", "refused", "crash", "hang")


class Hang(BaseException):
    """Raised by the benchmark's alarm when a case runs past its time limit."""


@dataclass
class Tally:
    counts: dict[str, dict[str, int]] = field(default_factory=dict)
    examples: list[tuple[str, str, str]] = field(default_factory=list)

    def add(self, family: str, outcome: str, detail: str = "", case: str = "") -> None:
        fam = self.counts.setdefault(family, dict.fromkeys(OUTCOMES, 0))
        fam[outcome] += 1
        if outcome in ("crash", "hang") and len(self.examples) < 20:
            self.examples.append((family, detail[:500], case[:300]))

    def total(self, outcome: str | None = None) -> int:
        return sum(
            n for fam in self.counts.values() for o, n in fam.items() if outcome in (None, o)
        )


# ------------------------------------------------------------------------------ values

HUGE_INTS = [10**20, 10**400, -(10**30), 2**63, 10**18]
HOSTILE_STRINGS = [
    "",
    " ",
    "\t",
    "a b",
    "jobs ",
    "a\nb",
    "a\x00b",
    "a\x01b",
    "\u200b",
    "é",
    "x" * 150,
    "x" * 5000,
    "1" + "0" * 400,
    "{{",
    "*",
    "&a",
    "!!python/object:os.system",
    "\ud7ff",
]
HOSTILE_FLOATS = [1e308, -1e308, float("inf"), float("nan"), -0.0, 1e-300, 5e-324]
GOOD_DURATIONS = ["30s", "5m", "1h30m", 90, "2h", "1d", 600, "10m"]
HOSTILE_DURATIONS = [
    "0.0000001s",
    "99999999999999999999d",
    "1" + "0" * 400 + "s",
    -1,
    0,
    "5 minutes",
    "1h1h",
    "9" * 50,
    10**400,
    1e308,
]
GOOD_CRONS = ["0 8 * * 1-5", "*/15 * * * *", "30 7 * * 1-5", "0 0 L * *", "0 18 * * *"]
HOSTILE_CRONS = [
    "0 0 31 2 *",
    "0 0 30 2 *",
    "0 0 31 4 *",
    "0 0 29 2 *",
    "0 8 * * *\n",
    " 0 8 * * *",
    "0\t8 * * *",
    "61 * * * *",
    "0 0 8 * * *",
    "",
    "9" * 5000,
    "*/0 * * * *",
    "@daily",
    "0 0 1 1 0#5",
    "1-99999999999999999999 * * * *",
]
GOOD_URLS = [
    "redis://127.0.0.1:6379/0",
    "redis://:pw@127.0.0.1:6379/15",
    "amqp://guest:guest@127.0.0.1:5672//",
    "sqla+sqlite:///x.db",
    "http://prometheus:9090",
]
HOSTILE_URLS = [
    "redis://h:abc/0",
    "redis://h:99999/0",
    "redis://[::1/0",
    "not a url",
    "redis://:p@ss@h:0/0",
    "http://",
    "redis://h:-1/0",
    "redis://" + "h" * 3000,
    "redis://h:6379/0\n",
    "://",
    "redis://u:secret-pw@h:65536/0",
]
NAMES = ["jobs", "gpu", "inference", "a.b-c_d", "q:1@x/y"]
ODD_DIGITS = ["¹", "²", "³", "０", "３", "９", "٠", "٣", "۳", "३"]
"""Digits a paste or another keyboard brings: superscripts, fullwidth, Arabic-Indic (both),
Devanagari. Python's checks and parsers disagree about them (`autoscaler.digits`)."""
ODD_BLANKS = ["\u00a0", "\u2007", "\u202f", "\u200b", "\u2060", "\ufeff"]
"""No-break, figure and narrow no-break spaces; zero-width space, word joiner, BOM."""


@st.composite
def oddly_written(draw: st.DrawFn, text: str) -> str:
    """`text` with one of its numbers written as a word processor or another keyboard writes
    it: one ASCII digit replaced by another script's, or a blank put before, inside or after
    the number."""
    spots = [i for i, c in enumerate(text) if c.isascii() and c.isdigit()]
    if not spots:
        return text + draw(st.sampled_from(ODD_BLANKS))
    i = draw(st.sampled_from(spots))
    if draw(st.booleans()):
        return text[:i] + draw(st.sampled_from(ODD_DIGITS)) + text[i + 1 :]
    at = i + draw(st.sampled_from([0, 1]))
    return text[:at] + draw(st.sampled_from(ODD_BLANKS)) + text[at:]


def hostile_scalar() -> st.SearchStrategy[Any]:
    return st.one_of(
        st.sampled_from(HOSTILE_STRINGS),
        st.sampled_from(HUGE_INTS),
        st.sampled_from(HOSTILE_FLOATS),
        st.none(),
        st.booleans(),
        st.integers(),
        st.floats(),
        st.text(max_size=20),
        st.sampled_from([[], {}, [1, [2, [3]]], {"a": {"b": {}}}]),
    )


def _sometimes(
    rare: st.SearchStrategy[Any], usual: st.SearchStrategy[Any], one_in: int
) -> st.SearchStrategy[Any]:
    """`rare` about once in `one_in` draws. (Hypothesis favours the ends of an integer range,
    so the rare branch is a value from the middle.)"""
    return st.integers(0, one_in - 1).flatmap(lambda i: rare if i == one_in // 2 else usual)


def mix(good: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """Mostly good values (7 in 8), sometimes hostile ones."""
    return _sometimes(hostile_scalar(), good, 8)


def durations() -> st.SearchStrategy[Any]:
    odd = st.sampled_from([str(d) for d in GOOD_DURATIONS]).flatmap(oddly_written)
    return _sometimes(
        st.sampled_from(HOSTILE_DURATIONS) | odd, mix(st.sampled_from(GOOD_DURATIONS)), 8
    )


def counts(low: int, high: int) -> st.SearchStrategy[Any]:
    """A whole number of the block (machines, a threshold, a priority): mostly fine, sometimes
    hostile, sometimes written with another script's digit or a blank in it."""
    odd = st.integers(low, high).map(str).flatmap(oddly_written)
    return _sometimes(odd, mix(st.integers(low, high)), 8)


def names() -> st.SearchStrategy[Any]:
    hostile = st.one_of(st.sampled_from(HOSTILE_STRINGS), st.text(max_size=12), st.integers(-5, 5))
    return _sometimes(hostile, st.sampled_from(NAMES), 6)


def crons() -> st.SearchStrategy[Any]:
    hostile = st.sampled_from(HOSTILE_CRONS) | st.text(max_size=20)
    return _sometimes(hostile, st.sampled_from(GOOD_CRONS), 4)


def urls() -> st.SearchStrategy[Any]:
    odd = st.sampled_from(GOOD_URLS).flatmap(oddly_written)  # a port or a database number
    hostile = st.sampled_from(HOSTILE_URLS) | st.text(max_size=30) | odd
    return _sometimes(hostile, st.sampled_from(GOOD_URLS), 4)


def _block(required: dict[str, Any], optional: dict[str, Any]) -> st.SearchStrategy[Any]:
    base = st.fixed_dictionaries(required, optional=optional)
    unknown = st.dictionaries(
        st.sampled_from(["typo", "max_worker", "x"]), hostile_scalar(), min_size=1, max_size=1
    )
    typo = st.builds(lambda a, b: {**a, **b}, base, unknown)
    return _sometimes(typo, base, 12)


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

# ------------------------------------------------------------------------------ runners


def run_config(
    data: bytes,
    workdir: Path,
    env: Mapping[str, str] | None = None,
    broker: str = "redis://127.0.0.1:6379/15",
) -> tuple[str, str]:
    """The path `autoscaler validate` runs, in process: load, isolation check, dry run."""
    path = workdir / "fuzz.yaml"
    path.write_bytes(data)
    try:
        config = load_config(path, {}, store_readable=False)
        refusals = check_broker_isolation(config, broker, "autoscaler-control:", env or {})
        if refusals:
            raise ConfigError(refusals, str(path))
        text = describe(config, config.providers, NOW)
        if "inf" in text.split() or "$inf" in text or "nan" in text.split():
            return "crash", "the dry run prints inf/nan"
    except ConfigError as exc:
        rendered = exc.render()
        if len(rendered) > 20_000:
            return "crash", f"a refusal of {len(rendered)} characters"
        return "refused", ""
    except Hang:
        raise
    except BaseException as exc:
        return "crash", f"{type(exc).__name__}: {str(exc)[:300]}"
    return "accepted", ""


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


def run_trace(suffix: str, data: bytes, workdir: Path) -> tuple[str, str]:
    path = workdir / f"fuzz{suffix}"
    path.write_bytes(data)
    try:
        load_trace(path)
    except TraceError:
        return "refused", ""
    except Hang:
        raise
    except BaseException as exc:
        return "crash", f"{type(exc).__name__}: {str(exc)[:300]}"
    return "accepted", ""


# ------------------------------------------------------------------------------------ CLI


class CliWorld:
    """A state store and a scratch folder for CLI cases; `run` classifies one invocation."""

    def __init__(self, database_url: str | None = None) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="asg-fuzz-"))
        home = self.dir / "home"
        self.env = {
            "AUTOSCALER_HOME": str(home),
            "AUTOSCALER_DATABASE_URL": database_url or f"sqlite:///{home / 'state.db'}",
            "AUTOSCALER_VAULT_KEY": generate_key(),
            "AUTOSCALER_BROKER_URL": f"sqla+sqlite:///{home / 'broker.db'}",
            "AUTOSCALER_DEBUG": "",
        }
        self.runner = CliRunner()
        self.n = 0
        up = self.runner.invoke(main, ["db", "upgrade"], env=self.env)
        assert up.exit_code == 0, up.output
        applied = self.runner.invoke(
            main, ["apply", self.file(VALID_CONFIG.encode())], env=self.env
        )
        assert applied.exit_code == 0, applied.output
        fifo = self.dir / "fifo.yaml"
        os.mkfifo(fifo)
        self.fifo = fifo
        self.n = 0

    def file(self, data: bytes, suffix: str = ".yaml") -> str:
        self.n += 1
        p = self.dir / f"f{self.n % 50}{suffix}"
        p.write_bytes(data)
        return str(p)

    def run(
        self, args: list[str], input: bytes | None = None, env: Mapping[str, str] | None = None
    ) -> tuple[str, str]:
        try:
            result = self.runner.invoke(main, args, env={**self.env, **(env or {})}, input=input)
        except Hang:
            raise
        except BaseException as exc:
            return "crash", f"escaped the runner: {type(exc).__name__}: {exc}"
        exc = result.exception
        if exc is not None and not isinstance(exc, SystemExit):
            return "crash", f"{type(exc).__name__}: {str(exc)[:300]}"
        out = result.output
        if "Traceback" in out or "internal error" in out:
            return "crash", out[-400:]
        if result.exit_code == 0:
            return "accepted", ""
        if result.exit_code == 2:
            return "refused", ""
        return "crash", f"exit {result.exit_code}: {out[-300:]}"


@st.composite
def cli_cases(draw: st.DrawFn, world: CliWorld) -> tuple[list[str], bytes | None, dict[str, str]]:
    """One hostile invocation: (args, stdin, extra environment)."""
    env: dict[str, str] = {}
    if draw(st.integers(0, 5)) == 0:
        var = draw(
            st.sampled_from(
                [
                    "AUTOSCALER_BROKER_URL",
                    "AUTOSCALER_WATCH_BROKER_URL",
                    "AUTOSCALER_DATABASE_URL",
                    "AUTOSCALER_VAULT_KEY",
                ]
            )
        )
        env[var] = draw(urls() | st.text(max_size=10)).replace("\x00", "")
    text = st.text(max_size=40) | st.sampled_from(HOSTILE_STRINGS) | st.sampled_from(NAMES)
    command = draw(st.integers(0, 15))
    stdin = None
    if command <= 3:
        target = draw(
            st.one_of(
                st.builds(lambda b: world.file(b), config_bytes()),
                st.sampled_from(
                    [
                        "/dev/null",
                        "/dev/zero",
                        str(world.dir),
                        str(world.fifo),
                        str(world.dir / "missing.yaml"),
                        "",
                        "-",
                    ]
                ),
            )
        )
        args = ["validate", target] if command <= 2 else ["apply", target, "--comment", draw(text)]
    elif command <= 6:
        args = [
            "providers",
            "add",
            draw(text),
            "--kind",
            draw(st.sampled_from(["mock", "vast", "runpod", "local", "container", "aws"])),
        ]
        for _ in range(draw(st.integers(0, 2))):
            key = draw(
                st.sampled_from(
                    [
                        "countries",
                        "price_per_hour",
                        "boot_delay",
                        "api_key_env",
                        "base_url",
                        "x",
                        "",
                    ]
                )
            )
            value = draw(
                text
                | st.sampled_from(
                    ["[" * 5000 + "]" * 5000, "9" * 5000, '["US"]', "1e999", "null", "{}"]
                )
            )
            args += ["--option", f"{key}={value}"]
        if draw(st.booleans()):
            args += [
                "--options-json",
                draw(
                    st.sampled_from(
                        [
                            '{"countries": ["US"]}',
                            "[]",
                            "{",
                            "[" * 100000,
                            '{"a": ' * 50 + "1" + "}" * 50,
                            '{"price_per_hour": 1e999}',
                            '{"boot_delay": ' + "9" * 5000 + "}",
                        ]
                    )
                ),
            ]
        if draw(st.booleans()):
            args.append("--api-key-stdin")
            stdin = draw(
                st.binary(max_size=40)
                | st.sampled_from(
                    [b"\xff\xfe\n", b"key\x00x\n", b"", b"k" * 20000 + b"\n", b"good-key\n"]
                )
            )
    elif command == 7:
        args = ["providers", draw(st.sampled_from(["list", "remove"]))]
        if args[1] == "remove":
            args.append(draw(text))
    elif command == 8:
        args = ["history"] + (["--queue", draw(text)] if draw(st.booleans()) else [])
    elif command == 9:
        args = ["vault", draw(st.sampled_from(["rotate", "generate-key"]))]
    elif command == 10:
        args = draw(st.lists(text, max_size=4))
    elif command == 12:
        args = ["scale", draw(text | st.just("jobs"))]
        args += draw(
            st.lists(
                st.sampled_from(
                    [
                        "3",
                        "0",
                        "-1",
                        "9" * 40,
                        "x",
                        "--auto",
                        "--for",
                        "2h",
                        "99999999999999999999d",
                        "1e400",
                        "",
                    ]
                )
                | st.sampled_from(["3", "2h", "30m"]).flatmap(oddly_written),
                max_size=3,
            )
        )
    elif command == 14:  # a key's id written with another script's digit, or a blank
        args = ["keys", "revoke", draw(st.sampled_from(["1", "12"]).flatmap(oddly_written))]
    elif command == 15:  # a port that is no port (a valid one would start the server)
        args = ["serve", "--bind", "127.0.0.1:" + draw(st.just("8480").flatmap(oddly_written))]
    elif command == 13:
        args = draw(st.sampled_from([["drain"], ["db", "upgrade"]]))
        args += (
            [draw(text)]
            if args == ["drain"]
            else (["--revision", draw(text)] if draw(st.booleans()) else [])
        )
    else:
        suffix, data = draw(trace_bytes())
        trace = world.file(data, suffix)
        config = draw(
            st.sampled_from([str(SIM_CONFIG)]) | st.builds(lambda b: world.file(b), config_bytes())
        )
        args = ["simulate", "--trace", trace, "--config", config]
        if draw(st.booleans()):
            args += ["--queue", draw(text)]
    return args, stdin, env
