"""`python -m autoscaler.cli`: the command the agents and the demo start as a subprocess."""

from autoscaler.cli import main

# The name its usage lines have always shown (it was the basename of autoscaler/cli.py).
main(prog_name="cli.py")
