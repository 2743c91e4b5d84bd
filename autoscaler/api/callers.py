"""Who a request says it comes from, before its key is checked: what the API's fair share of
turns (`admission.py`) and of body memory (`limits.py`) is counted by.

Two levels, because a claim costs nothing to forge and an address does:

- the **address**: the client's IP (as uvicorn gives it: behind a proxy on loopback, the one
  its `X-Forwarded-For` names); an IPv6 client by its /64, the block one machine is given;
- the **claim** within that address: the launch id of a `/v1/worker/{launch_id}/…` path, else a
  digest of the bearer key (a hand-made machine's enrolment key, an operator's admin key),
  else `-` (no key: /healthz, /metrics, the dashboard's page).

A claim counts only together with its address, so naming another machine's launch id puts a
request in the namer's own address, never in the victim's.
"""

from __future__ import annotations

import hashlib
import ipaddress
from collections.abc import Iterable, MutableMapping
from typing import Any

Caller = tuple[str, str]
"""(address, claim)."""

WORKER_PREFIX = "/v1/worker/"
CLAIM_CHARS = 64
"""A launch id is at most 64 characters (`deps.LaunchId`); a longer one is cut there."""


def address_of(scope: MutableMapping[str, Any]) -> str:
    """The client's address group: an IPv4 address, an IPv6 /64, `local` (a unix socket)."""
    client = scope.get("client")
    if not client:
        return "local"
    host = str(client[0])
    try:
        ip = ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return host[:CLAIM_CHARS]
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        return str(ipaddress.IPv6Network((ip, 64), strict=False))
    return str(ip)


def claim_of(path: str, headers: Iterable[tuple[bytes, bytes]]) -> str:
    """The caller within its address: `launch:<id>`, `key:<digest>` or `-`."""
    if path.startswith(WORKER_PREFIX):
        launch = path[len(WORKER_PREFIX) :].split("/", 1)[0]
        return "launch:" + launch[:CLAIM_CHARS]
    for name, value in headers:
        if name.lower() == b"authorization":
            scheme, _, key = value.partition(b" ")
            key = key.strip()
            if scheme.lower() == b"bearer" and key:
                # a digest, not the key: nothing secret is kept in the queues
                return "key:" + hashlib.sha256(key).hexdigest()[:16]
    return "-"


def caller_of(scope: MutableMapping[str, Any]) -> Caller:
    return address_of(scope), claim_of(str(scope.get("path", "")), scope.get("headers") or ())


__all__ = ["Caller", "address_of", "caller_of", "claim_of"]
