#!/usr/bin/env bash
# The one command that runs the tests: lint, types, then the whole suite against the real
# PostgreSQL, Redis and RabbitMQ on loopback (start them first; .ci/run does).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
. .venv/bin/activate
ruff check .
mypy autoscaler celeryconfig.py
pytest -q "$@"
