#!/bin/sh
# Start the agent as PID 1's only child: a stop of the machine (SIGTERM) reaches it, and it
# stops its worker with a warm shutdown before the machine goes.
# From `/`, with the venv's interpreter isolated (-I: no cwd, PYTHONPATH or user site on its
# path; -u for PYTHONUNBUFFERED, which -I ignores): the agent imports only what the image holds.
set -eu
cd /
exec /opt/autoscaler/venv/bin/python -I -u -m autoscaler.cli agent "$@"
