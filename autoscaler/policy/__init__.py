"""PURE decision core: triggers, decide(), backoff and schedule maths. No I/O, no clock reads."""

from autoscaler.policy.decide import decide
from autoscaler.policy.plan import Drain, Launch, Plan, QueuePlan, Wait
from autoscaler.policy.snapshot import BackoffState, Machine, QueueMetrics, QueueSnapshot, Snapshot

__all__ = [
    "BackoffState",
    "Drain",
    "Launch",
    "Machine",
    "Plan",
    "QueueMetrics",
    "QueuePlan",
    "QueueSnapshot",
    "Snapshot",
    "Wait",
    "decide",
]
