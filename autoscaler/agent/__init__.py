"""The worker agent (`autoscaler agent`): what runs on a machine, rented or hand-made."""
