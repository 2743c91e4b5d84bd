"""Whole CLI invocations, hostile ones: a scratch state store to run them on (`CliWorld`, which
classifies each run) and their generator (`cli_cases`).

Apart from the runners of files (`harness`) because they need a store, a vault key and a fifo.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping
from pathlib import Path

from click.testing import CliRunner
from hypothesis import strategies as st

from autoscaler.cli import main
from autoscaler.vault import generate_key
from tests.fuzz.files import VALID_CONFIG, config_bytes, trace_bytes
from tests.fuzz.harness import SIM_CONFIG, Hang, oddly_written
from tests.fuzz.values import HOSTILE_STRINGS, NAMES, urls

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
