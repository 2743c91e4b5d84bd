"""Ownership invariants: only labels of this installation are ever read as ours or touched."""

from __future__ import annotations

import random
import uuid
from datetime import UTC, datetime
from pathlib import Path

import pytest
from hypothesis import HealthCheck, assume, event, given, settings
from hypothesis import strategies as st
from sqlalchemy import delete
from sqlalchemy.orm import Session, sessionmaker

from autoscaler.config.provider_options import (
    ContainerOptions,
    LocalOptions,
    MockOptions,
    RunPodOptions,
    VastOptions,
)
from autoscaler.providers import AuthError, LaunchSpec, NotOwnedError
from autoscaler.providers.labels import is_owned, make_label, parse_label
from autoscaler.providers.mock import MockProvider
from autoscaler.providers.registry import build_provider
from autoscaler.store import mock_machines
from autoscaler.store.db import transaction
from autoscaler.store.mock_machines import StoredMockMachines
from autoscaler.store.models import MockMachine
from tests.fakes.runpod_server import FakeRunPod
from tests.providers.conftest import INSTALLATION, OTHER_INSTALLATION, make_runpod

installation_ids = st.text("abcdefghijklmnopqrstuvwxyz0123456789", min_size=1, max_size=32)
launch_ids = st.from_regex(r"[A-Za-z0-9][A-Za-z0-9_]{0,20}", fullmatch=True)
T0 = datetime(2026, 3, 1, tzinfo=UTC)


WORD = "abcdefghijklmnopqrstuvwxyz0123456789"
# other installations, including ids one edit away from ours
other_ids = st.one_of(
    installation_ids.filter(lambda i: i != INSTALLATION),
    st.sampled_from([INSTALLATION[:-1], INSTALLATION + "0", "0" + INSTALLATION, INSTALLATION[1:]]),
    st.tuples(st.integers(0, len(INSTALLATION) - 1), st.sampled_from(WORD))
    .map(lambda t: INSTALLATION[: t[0]] + t[1] + INSTALLATION[t[0] + 1 :])
    .filter(lambda i: i != INSTALLATION),
)
# UTF-8 without NUL: PostgreSQL text cannot hold NUL, so no provider label can either
chars = st.characters(codec="utf-8", exclude_characters="\x00")
any_text = st.text(chars, max_size=6)
not_a_launch_char = st.sampled_from([*"- .\n\t/:@", "\u00e9", "\uff21", "\u200b"])
LOOKALIKES = [INSTALLATION.replace("0", "\uff10"), INSTALLATION.replace("a", "\u0430")]


def _near_misses(lid: str) -> list[str]:
    """Our label for `lid`, bent just enough that it is no longer a label this installation made
    (the parts are checked exactly, the case too; a dash inside a part is refused)."""
    return [
        f"ASG-{INSTALLATION}-{lid}",
        f"Asg-{INSTALLATION}-{lid}",
        f"asg-{INSTALLATION.upper()}-{lid}",
        f"asg-{INSTALLATION[0].upper()}{INSTALLATION[1:]}-{lid}",
        f"asg_{INSTALLATION}-{lid}",
        f"asg-{INSTALLATION}_{lid}",
        f"asg--{INSTALLATION}-{lid}",
        f"asg-{INSTALLATION}--{lid}",
        f"asg{INSTALLATION}-{lid}",
        f"asg-{INSTALLATION}",
        f"asg-{INSTALLATION}-",
        f"asg-{INSTALLATION}-_{lid}",
        f"asg-{INSTALLATION}-{lid}-{lid}",
        f"asg-{INSTALLATION}-{lid}-",
        f"asg-{INSTALLATION}-{lid}\n",
        f"asg-{INSTALLATION}-{lid}" + "x" * 64,  # launch id longer than 64
        *(f"asg-{look}-{lid}" for look in LOOKALIKES),  # a fullwidth 0, a Cyrillic a
        f"asg-{OTHER_INSTALLATION}-{INSTALLATION}-{lid}",
    ]


@st.composite
def labels(draw: st.DrawFn) -> tuple[str, bool, str]:
    """(label, ours?, kind). Whether a label is ours is known from how it was built, never from
    `is_owned` itself; most are well-formed labels of another installation or near misses."""
    kind = draw(
        st.sampled_from(
            [
                "ours",
                "another installation",
                "another installation",
                "prefixed",
                "suffixed",
                "bent",
                "bent",
                "hand-made",
            ]
        )
    )
    lid = draw(launch_ids)
    if kind == "ours":
        return make_label(INSTALLATION, lid), True, kind
    if kind == "another installation":
        return make_label(draw(other_ids), lid), False, kind
    if kind == "prefixed":  # cannot start with "asg-" and keep exactly two dashes
        no_dash = st.characters(codec="utf-8", exclude_characters="\x00-")
        prefix = draw(st.text(no_dash, min_size=1, max_size=6))
        return prefix + make_label(INSTALLATION, lid), False, kind
    if kind == "suffixed":  # a character no launch id may hold
        suffix = draw(any_text) + draw(not_a_launch_char) + draw(any_text)
        return make_label(INSTALLATION, lid) + suffix, False, kind
    if kind == "bent":
        return draw(st.sampled_from(_near_misses(lid))), False, kind
    name = draw(st.text(chars, min_size=1, max_size=40))
    assume(not name.startswith(f"asg-{INSTALLATION}-"))  # could be ours by chance
    return name, False, kind


@given(installation_ids, launch_ids)
def test_label_round_trips(inst: str, lid: str) -> None:
    parsed = parse_label(make_label(inst, lid))
    assert parsed is not None and (parsed.installation_id, parsed.launch_id) == (inst, lid)


@given(installation_ids, installation_ids, launch_ids)
def test_a_label_belongs_to_exactly_one_installation(a: str, b: str, lid: str) -> None:
    assert is_owned(make_label(a, lid), b) == (a == b)


@settings(max_examples=300)
@given(labels())
def test_only_our_exact_labels_are_ours(case: tuple[str, bool, str]) -> None:
    label, ours, kind = case
    event(kind)  # `pytest --hypothesis-show-statistics` shows the mix
    assert is_owned(label, INSTALLATION) == ours, (label, kind)
    parsed = parse_label(label)
    if ours:
        assert parsed is not None and parsed.installation_id == INSTALLATION
    elif kind == "another installation":
        assert parsed is not None and parsed.installation_id != INSTALLATION


def test_launch_refuses_foreign_labels() -> None:
    with pytest.raises(ValueError):
        LaunchSpec(label="my-notebook")
    with pytest.raises(ValueError):
        make_label("has-dash", "x")
    with pytest.raises(ValueError):
        make_label(INSTALLATION, "a-b")  # would make the label ambiguous


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(st.lists(labels(), max_size=8, unique_by=lambda c: c[0]))
def test_mock_list_owned_never_returns_a_foreign_label(
    sessions: sessionmaker[Session], cases: list[tuple[str, bool, str]]
) -> None:
    labels = [label for label, _, _ in cases]
    ours = {label for label, mine, _ in cases if mine}
    provider = f"p{uuid.uuid4().hex[:8]}"  # a fresh provider name per example
    with transaction(sessions) as s:
        s.execute(delete(MockMachine))  # labels are unique table-wide: start each example empty
        for label in labels:
            mock_machines.insert(
                s,
                provider=provider,
                label=f"{label}",
                env={},
                gpu="g",
                price_per_hour=0.1,
                boots_at=T0,
                will_fail=False,
                now=T0,
            )
    p = MockProvider(
        provider,
        MockOptions(kind="mock"),
        INSTALLATION,
        StoredMockMachines(sessions),
        rng=random.Random(0),
        clock=lambda: T0,
    )
    owned = p.list_owned()
    assert sorted(m.label for m in owned) == sorted(ours)
    for m in owned:
        p.destroy(m.provider_instance_id)
    with transaction(sessions) as s:
        left = {r.label for r in mock_machines.list_live(s, provider)}
    assert left == set(labels) - ours


@settings(
    max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(st.lists(labels(), max_size=6))
def test_runpod_list_owned_never_returns_a_foreign_pod(
    fake_runpod: FakeRunPod, cases: list[tuple[str, bool, str]]
) -> None:
    fake_runpod.pods.clear()
    mine = {fake_runpod.add_pod(label): ours for label, ours, _ in cases}
    rp = make_runpod(fake_runpod)
    owned = rp.list_owned()
    assert {m.provider_instance_id for m in owned} == {pid for pid, ours in mine.items() if ours}
    for pid, ours in mine.items():
        if not ours:
            with pytest.raises(NotOwnedError):
                rp.destroy(pid)


def test_registry_builds_each_kind(sqlite_sessions: sessionmaker[Session], tmp_path: Path) -> None:
    kw = {"installation_id": INSTALLATION, "sessions": sqlite_sessions}
    rp = build_provider("r", RunPodOptions(kind="runpod"), credential="k-secret-1", **kw)
    vast = build_provider("v", VastOptions(kind="vast"), credential="k-secret-2", **kw)
    mock = build_provider("m", MockOptions(kind="mock"), credential=None, **kw)
    loc = build_provider("l", LocalOptions(kind="local"), credential=None, state_dir=tmp_path, **kw)
    box = build_provider("c", ContainerOptions(kind="container", gpus=0), credential=None, **kw)
    kinds = [p.kind for p in (rp, vast, mock, loc, box)]
    assert kinds == ["runpod", "vast", "mock", "local", "container"]
    assert "k-secret" not in repr(rp) + repr(vast) + str(vars(rp)) + str(vars(vast))
    with pytest.raises(AuthError, match="no API key"):
        build_provider("r", RunPodOptions(kind="runpod"), credential=None, **kw)
    with pytest.raises(ValueError, match="state directory"):
        build_provider("l", LocalOptions(kind="local"), credential=None, **kw)
