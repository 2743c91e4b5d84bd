"""GPU autoscaler for job queues: rents RunPod and Vast.ai machines when queues fill up."""

__version__ = "0.1.0"
