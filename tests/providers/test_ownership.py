"""Ownership invariants: only labels of this installation are ever read as ours or touched."""

from __future__ import annotations

import random
import uuid
from datetime import UTC, datetime
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import delete
from sqlalchemy.orm import Session, sessionmaker

from autoscaler.config.models import LocalProvider as LocalConfig
from autoscaler.config.models import MockProvider as MockConfig
from autoscaler.config.models import RunPodProvider as RunPodConfig
from autoscaler.config.models import VastProvider as VastConfig
from autoscaler.providers import AuthError, Launch, NotOwnedError
from autoscaler.providers.labels import is_owned, make_label, parse_label
from autoscaler.providers.mock import MockProvider
from autoscaler.providers.registry import build_provider
from autoscaler.store import mock_machines
from autoscaler.store.db import transaction
from autoscaler.store.models import MockMachine
from tests.fakes.runpod_server import FakeRunPod
from tests.providers.conftest import INSTALLATION, make_runpod

installation_ids = st.text("abcdefghijklmnopqrstuvwxyz0123456789", min_size=1, max_size=32)
launch_ids = st.from_regex(r"[A-Za-z0-9][A-Za-z0-9_]{0,20}", fullmatch=True)
T0 = datetime(2026, 3, 1, tzinfo=UTC)


@given(installation_ids, launch_ids)
def test_label_round_trips(inst: str, lid: str) -> None:
    parsed = parse_label(make_label(inst, lid))
    assert parsed is not None and (parsed.installation_id, parsed.launch_id) == (inst, lid)


@given(installation_ids, installation_ids, launch_ids)
def test_a_label_belongs_to_exactly_one_installation(a: str, b: str, lid: str) -> None:
    assert is_owned(make_label(a, lid), b) == (a == b)


@given(st.text(max_size=80))
def test_arbitrary_names_are_never_ours_unless_they_carry_our_id(name: str) -> None:
    if is_owned(name, INSTALLATION):
        assert name.startswith(f"asg-{INSTALLATION}-")


def test_launch_refuses_foreign_labels() -> None:
    with pytest.raises(ValueError):
        Launch(label="my-notebook")
    with pytest.raises(ValueError):
        make_label("has-dash", "x")
    with pytest.raises(ValueError):
        make_label(INSTALLATION, "a-b")  # would make the label ambiguous


label_strategy = st.one_of(
    launch_ids.map(lambda lid: make_label(INSTALLATION, lid)),  # ours
    st.tuples(installation_ids, launch_ids).map(lambda t: make_label(*t)),  # anyone's
    # hand-made (PostgreSQL text cannot hold NUL, so no provider label can either)
    st.text(st.characters(exclude_characters="\x00"), min_size=1, max_size=40),
    st.sampled_from(
        [
            f"asg-{INSTALLATION}",
            f"asg-{INSTALLATION}-",
            f"ASG-{INSTALLATION}-x",
            f"asg-{INSTALLATION}-x-y",
            f" asg-{INSTALLATION}-x",
        ]
    ),
)


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(st.lists(label_strategy, max_size=8, unique=True))
def test_mock_list_owned_never_returns_a_foreign_label(
    sessions: sessionmaker[Session], labels: list[str]
) -> None:
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
        MockConfig(kind="mock"),
        INSTALLATION,
        sessions,
        rng=random.Random(0),
        clock=lambda: T0,
    )
    owned = p.list_owned()
    assert all(is_owned(m.label, INSTALLATION) for m in owned)
    assert sorted(m.label for m in owned) == sorted(
        lab for lab in labels if is_owned(lab, INSTALLATION)
    )
    for m in owned:
        p.destroy(m.provider_instance_id)
    with transaction(sessions) as s:
        left = {r.label for r in mock_machines.list_live(s, provider)}
    assert left == {lab for lab in labels if not is_owned(lab, INSTALLATION)}


@settings(
    max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(st.lists(label_strategy, max_size=6))
def test_runpod_list_owned_never_returns_a_foreign_pod(
    fake_runpod: FakeRunPod, labels: list[str]
) -> None:
    fake_runpod.pods.clear()
    ids = {fake_runpod.add_pod(label): label for label in labels}
    rp = make_runpod(fake_runpod)
    owned = rp.list_owned()
    assert all(is_owned(m.label, INSTALLATION) for m in owned)
    assert {m.provider_instance_id for m in owned} == {
        pid for pid, lab in ids.items() if is_owned(lab, INSTALLATION)
    }
    for pid, lab in ids.items():
        if not is_owned(lab, INSTALLATION):
            with pytest.raises(NotOwnedError):
                rp.destroy(pid)


def test_registry_builds_each_kind(sqlite_sessions: sessionmaker[Session], tmp_path: Path) -> None:
    kw = {"installation_id": INSTALLATION, "sessions": sqlite_sessions}
    rp = build_provider("r", RunPodConfig(kind="runpod"), credential="k-secret-1", **kw)
    vast = build_provider("v", VastConfig(kind="vast"), credential="k-secret-2", **kw)
    mock = build_provider("m", MockConfig(kind="mock"), credential=None, **kw)
    loc = build_provider("l", LocalConfig(kind="local"), credential=None, state_dir=tmp_path, **kw)
    assert [p.kind for p in (rp, vast, mock, loc)] == ["runpod", "vast", "mock", "local"]
    assert "k-secret" not in repr(rp) + repr(vast) + str(vars(rp)) + str(vars(vast))
    with pytest.raises(AuthError, match="no API key"):
        build_provider("r", RunPodConfig(kind="runpod"), credential=None, **kw)
    with pytest.raises(ValueError, match="state directory"):
        build_provider("l", LocalConfig(kind="local"), credential=None, **kw)
