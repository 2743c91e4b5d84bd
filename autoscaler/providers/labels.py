"""The ownership marker: every machine we create is named ``asg-<installation_id>-<launch_id>``.

The installation id is random per installation (see ``store/installation.py``), so two
installations sharing one provider account never read or destroy each other's machines, and a
machine made by hand (any other name) is never ours. The same marker is also put into the
machine's environment (``ENV_*`` below) so the agent on the machine knows who it speaks for.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

PREFIX = "asg"
INSTALLATION_RE = re.compile(r"^[a-z0-9]{1,32}$")
LAUNCH_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_]{0,63}$")
_LABEL_RE = re.compile(r"^asg-([a-z0-9]{1,32})-([A-Za-z0-9][A-Za-z0-9_]{0,63})$")

ENV_INSTALLATION = "AUTOSCALER_INSTALLATION_ID"
ENV_LAUNCH = "AUTOSCALER_LAUNCH_ID"
ENV_LABEL = "AUTOSCALER_LABEL"


@dataclass(frozen=True)
class ParsedLabel:
    installation_id: str
    launch_id: str


def make_label(installation_id: str, launch_id: str) -> str:
    """The label for one launch. Both parts are restricted so the label parses back unambiguously
    (no dash inside either part) and fits every provider's name field."""
    if not INSTALLATION_RE.fullmatch(installation_id):
        raise ValueError(
            f"installation id {installation_id!r} must be 1-32 lowercase letters or digits"
        )
    if not LAUNCH_RE.fullmatch(launch_id):
        raise ValueError(
            f"launch id {launch_id!r} must be 1-64 letters, digits or '_' (starting with a "
            "letter or digit); use e.g. uuid.uuid4().hex"
        )
    return f"{PREFIX}-{installation_id}-{launch_id}"


def parse_label(label: str | None) -> ParsedLabel | None:
    """The parts of one of our labels, or None for anything else (hand-made, empty, None)."""
    if not label:
        return None
    m = _LABEL_RE.fullmatch(label)
    if m is None:
        return None
    return ParsedLabel(installation_id=m.group(1), launch_id=m.group(2))


def is_owned(label: str | None, installation_id: str) -> bool:
    """True only for a label this installation made."""
    parsed = parse_label(label)
    return parsed is not None and parsed.installation_id == installation_id


def marker_env(installation_id: str, launch_id: str) -> dict[str, str]:
    """The environment variables every machine carries beside its label."""
    return {
        ENV_INSTALLATION: installation_id,
        ENV_LAUNCH: launch_id,
        ENV_LABEL: make_label(installation_id, launch_id),
    }
