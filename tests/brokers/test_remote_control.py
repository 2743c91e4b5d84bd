"""Remote control that a machine cannot hold open nor answer for others (`BoundedMailbox`).

A hostile machine (tests/security/flood.py) hears the probe's broadcast and streams replies
into its reply list: with kombu's own collection each reply restarted the timeout, so the probe
waited for as long as the stream lasted, and replies without the request's ticket counted as
answers. Real Redis, a real kombu listener and producer."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from autoscaler.brokers.remote_control import BoundedMailbox
from autoscaler.brokers.workers import CeleryWorkerProbe
from tests.conftest import REDIS_URL
from tests.security.flood import ReplyFlood


@pytest.fixture
def probe(prefix) -> Iterator[CeleryWorkerProbe]:
    p = CeleryWorkerProbe(
        f"{REDIS_URL}/0", transport_options={"global_keyprefix": prefix}, timeout=2.0
    )
    yield p
    p.close()


def _flood(prefix: str, **kw) -> ReplyFlood:
    return ReplyFlood(f"{REDIS_URL}/0", transport_options={"global_keyprefix": prefix}, **kw)


def _heard(flood: ReplyFlood, probe: CeleryWorkerProbe) -> dict[str, tuple[str, ...]]:
    """Poll until the flood answered during a collection (it hears the first broadcast late
    on a loaded machine); returns what that collection counted."""
    for _ in range(5):
        before = flood.sent
        seen = probe.poll()
        if flood.sent > before:
            return seen
    raise AssertionError(f"the flood never answered: {flood.errors}")


@pytest.mark.filterwarnings("ignore::celery.exceptions.DuplicateNodenameWarning")  # the ghosts
def test_a_stream_of_replies_does_not_hold_the_collection_open(prefix, probe):
    # one reply every 50 ms for 10 s per request: kombu waited for the whole stream
    with _flood(prefix, replies_per_request=200, every=0.05) as flood:
        seen = _heard(flood, probe)
        assert flood.running and flood.sent < 200  # the collection ended, the stream did not
        assert sorted(seen) == [f"ghost-{i}@evil-{i}" for i in range(5)]  # same ticket: heard
    assert not flood.errors


@pytest.mark.parametrize("ticket", ["none", "other"])
def test_replies_without_the_requests_ticket_count_for_nothing(prefix, probe, ticket):
    with _flood(prefix, ticket=ticket, replies_per_request=400, every=0.005) as flood:
        assert _heard(flood, probe) == {}
    assert not flood.errors


def test_a_collection_reads_a_bounded_number_of_messages(prefix, probe, monkeypatch):
    monkeypatch.setattr(BoundedMailbox, "max_messages", 20)
    with _flood(prefix, replies_per_request=200, every=0.0) as flood:
        for _ in range(5):
            before = flood.sent
            replies = probe._app.control.broadcast("active_queues", reply=True, timeout=10)
            if flood.sent > before:
                break
        assert flood.running
        assert len(replies) == 20  # the cap, not the 200 sent nor the 10 s timeout
    assert not flood.errors
