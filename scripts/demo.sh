#!/usr/bin/env bash
# The main job on embedded defaults (SQLite, the embedded broker, no Redis, no cloud account):
# the dry run of the seed's config, then the live demo — the real control loop (Celery beat
# and worker, the server API, SQLite state, the embedded broker) scales a demo queue on this
# computer: a burst of jobs, worker agents started by the local provider, the queue emptied,
# the machines drained and destroyed, a summary. Arguments go to `autoscaler demo` (e.g.
# --short, --keep, --plain).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
. .venv/bin/activate
autoscaler db upgrade
if ! autoscaler providers list | grep -q '^gpu-vast'; then
  autoscaler providers add gpu-vast --kind vast --api-key-env VAST_API_KEY \
    --option 'countries=["US","CA"]' --option min_bandwidth_mbps=200
fi
echo "The dry run of examples/seed.yaml (nothing is rented):"
autoscaler validate examples/seed.yaml
echo
echo "The live demo: the real loop on this computer (its own folder, removed at the end)"
exec autoscaler demo "$@"
