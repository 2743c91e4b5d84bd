"""Config documents as the dashboard's editor shows them: YAML text, and what differs between
two versions (one line per changed leaf). Pure: no store, no web framework."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import yaml

from autoscaler.config.models import Config


def changes(old: Any, new: Any, path: str = "") -> list[str]:
    """What differs between two config documents, one line per changed leaf."""
    if isinstance(old, dict) and isinstance(new, dict):
        out: list[str] = []
        for k in sorted(set(old) | set(new), key=str):
            sub = f"{path}.{k}" if path else str(k)
            if k not in old:
                out.append(f"{sub}: added {_short(new[k])}")
            elif k not in new:
                out.append(f"{sub}: removed (was {_short(old[k])})")
            else:
                out += changes(old[k], new[k], sub)
        return out
    if old != new:
        return [f"{path or '(document)'}: {_short(old)} → {_short(new)}"]
    return []


def normal(document: Mapping[str, Any]) -> Any:
    """A stored document as `apply` stores it (defaults filled in), so a preview lists what the
    edit changes, not what an older writer left implicit."""
    try:
        return Config.model_validate(dict(document)).model_dump(mode="json")
    except Exception:  # an old document the schema no longer takes: compare it as stored
        return dict(document)


def dump(document: Mapping[str, Any]) -> str:
    return yaml.safe_dump(dict(document), sort_keys=False, allow_unicode=True)


def _short(v: Any) -> str:
    text = yaml.safe_dump(v, default_flow_style=True, width=10_000).strip()
    text = text.removesuffix("...").strip()
    return text if len(text) <= 200 else text[:199] + "…"


__all__ = ["changes", "dump", "normal"]
