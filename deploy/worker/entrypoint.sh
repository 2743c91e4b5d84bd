#!/bin/sh
# Start the agent as PID 1's only child: a stop of the machine (SIGTERM) reaches it, and it
# stops its worker with a warm shutdown before the machine goes.
set -eu
exec autoscaler agent "$@"
