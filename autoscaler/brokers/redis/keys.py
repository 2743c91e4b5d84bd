"""kombu's key layout on Redis for one broker: the lists of a queue's priority steps, the
unacked hash and its index, the binding tables (`broker_transport_options`: `global_keyprefix`,
`sep`, `priority_steps`), and the layout a `metrics:` block describes."""

from __future__ import annotations

from dataclasses import dataclass

from autoscaler.config.metrics_sources import CelerySource

DEFAULT_SEP = "\x06\x16"
DEFAULT_PRIORITY_STEPS = (0, 3, 6, 9)
BINDING_PREFIX = "_kombu.binding."


@dataclass(frozen=True)
class CeleryRedisLayout:
    """kombu's Redis key layout for one broker (its transport options)."""

    global_keyprefix: str = ""
    sep: str = DEFAULT_SEP
    priority_steps: tuple[int, ...] = DEFAULT_PRIORITY_STEPS
    unacked_key: str = "unacked"
    unacked_index_key: str = "unacked_index"

    @property
    def steps(self) -> list[int]:
        return sorted(set(self.priority_steps)) or [0]

    def keys(self, queue: str) -> list[str]:
        """Every list kombu may push `queue`'s messages to, highest priority first."""
        base = self.global_keyprefix + queue
        return [base + suffix for suffix in self.suffixes]

    @property
    def suffixes(self) -> list[str]:
        return [f"{self.sep}{step}" if step else "" for step in self.steps]

    @property
    def unacked(self) -> str:
        return f"{self.global_keyprefix}{self.unacked_key}"

    @property
    def unacked_index(self) -> str:
        """kombu's sorted set of unacked delivery tags, scored by their delivery time."""
        return f"{self.global_keyprefix}{self.unacked_index_key}"

    def binding_key(self, exchange: str) -> str:
        return f"{self.global_keyprefix}{BINDING_PREFIX}{exchange}"

    def transport_options(self) -> dict[str, object]:
        """The `broker_transport_options` a Celery app needs to use this layout."""
        opts: dict[str, object] = {"sep": self.sep, "priority_steps": list(self.steps)}
        if self.global_keyprefix:
            opts["global_keyprefix"] = self.global_keyprefix
        return opts


def redis_layout(source: CelerySource) -> CeleryRedisLayout:
    """kombu's Redis key layout a `metrics:` block describes."""
    return CeleryRedisLayout(
        global_keyprefix=source.global_keyprefix,
        sep=source.sep,
        priority_steps=source.priority_steps,
    )
