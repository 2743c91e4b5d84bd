"""A hostile machine on remote control: it listens to the broadcasts it may hear and streams
replies into the reply lists of whoever asked (with the request's ticket, with another ticket,
or with none), the way kombu's own worker answers, for as long as it runs.

Used by the remote-control tests and the loop's flood test; it speaks to the broker with
whatever URL it is given (a machine's own ACL user in the security tests).
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Mapping
from typing import Any

from kombu import Connection, Exchange, Producer
from kombu.pidbox import Mailbox


class ReplyFlood:
    """Answer every broadcast heard on `url` with `replies_per_request` replies (one every
    `every` seconds to each asker), each naming
    `ghosts` workers that claim `queues`; `ticket`: "same" (the request's), "other", "none".
    `hostname`: its node name (a machine's ACL opens only `<its label>@*.celery.pidbox`)."""

    def __init__(
        self,
        url: str,
        *,
        transport_options: Mapping[str, Any] | None = None,
        queues: tuple[str, ...] = ("q",),
        ghosts: int = 5,
        ticket: str = "same",
        replies_per_request: int = 200,
        every: float = 0.01,
        hostname: str = "flood@evil",
    ) -> None:
        self.url = url
        self.options = dict(transport_options or {})
        self.queues = queues
        self.ghosts = ghosts
        self.ticket = ticket
        self.replies_per_request = replies_per_request
        self.every = every
        self.hostname = hostname
        self.heard = 0
        self.sent = 0
        self.errors: list[str] = []
        self._askers: dict[tuple[str, str], list[Any]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="reply-flood", daemon=True)

    def __enter__(self) -> ReplyFlood:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)

    @property
    def running(self) -> bool:
        return self._thread.is_alive() and not self._stop.is_set()

    def reply(self, name: str) -> dict[str, Any]:
        """What a worker answers to `active_queues` (and, read as a list, to the others)."""
        return {name: [{"name": q, "exchange": {"name": q, "type": "direct"}} for q in self.queues]}

    def _run(self) -> None:
        try:
            with Connection(self.url, transport_options=self.options) as conn:
                mailbox = Mailbox("celery", type="fanout", accept=["json"])(conn)
                node = mailbox.Node(self.hostname, channel=conn.default_channel, handlers={})
                node.listen(callback=lambda body, message: self._heard(body))
                producer = Producer(conn.default_channel)
                while not self._stop.is_set():
                    with contextlib.suppress(socket.timeout, TimeoutError):
                        conn.drain_events(timeout=max(self.every, 0.001))
                    self._answer_all(producer)
        except Exception as exc:  # the test reads it
            self.errors.append(f"{type(exc).__name__}: {exc}")

    def _heard(self, request: Any) -> None:
        """Every asker (a loop process's reply list) is answered from now on, with the ticket
        of its newest request, `replies_per_request` times from that request on."""
        reply_to = request.get("reply_to") if isinstance(request, dict) else None
        if not isinstance(reply_to, dict) or "routing_key" not in reply_to:
            return
        self.heard += 1
        key = (str(reply_to.get("exchange")), str(reply_to["routing_key"]))
        self._askers[key] = [request.get("ticket"), self.replies_per_request]

    def _answer_all(self, producer: Producer) -> None:
        """One reply to every asker still owed some: kombu restarted a collection's timeout
        on any message in its reply list, whatever its ticket."""
        for (exchange, routing_key), owed in list(self._askers.items()):
            if owed[1] <= 0:
                continue
            owed[1] -= 1
            i = self.sent
            ticket = {"same": owed[0], "other": "not-your-ticket", "none": None}[self.ticket]
            with contextlib.suppress(Exception):  # a reply list already gone
                producer.publish(
                    self.reply(f"ghost-{i % self.ghosts}@evil-{i % self.ghosts}"),
                    exchange=Exchange(exchange, type="direct", durable=False),
                    routing_key=routing_key,
                    headers={} if self.ticket == "none" else {"ticket": ticket},
                    serializer="json",
                    retry=False,
                )
                self.sent += 1
