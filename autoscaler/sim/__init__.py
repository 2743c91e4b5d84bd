"""Replay a job trace on a virtual clock through the same decide() the control loop uses."""
