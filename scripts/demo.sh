#!/usr/bin/env bash
# The main job on embedded defaults (SQLite under ./.autoscaler, no Redis, no cloud account):
# migrate the state store, register the seed's provider, and print the dry run of the seed's
# config and of the full example, then replay a day of jobs through the same decision code and
# compare its cost with two baselines.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
. .venv/bin/activate
autoscaler db upgrade
if ! autoscaler providers list | grep -q '^gpu-vast'; then
  autoscaler providers add gpu-vast --kind vast --api-key-env VAST_API_KEY \
    --option 'countries=["US","CA"]' --option min_bandwidth_mbps=200
fi
autoscaler providers list
echo
autoscaler validate examples/seed.yaml
echo
autoscaler validate examples/full.yaml
echo
echo "Cost of one simulated day (autoscaler/sim/traces/diurnal.csv): our policy vs two baselines" \
  "vs the lower bound"
autoscaler simulate --trace autoscaler/sim/traces/diurnal.csv \
  --config autoscaler/sim/traces/sim-config.yaml
