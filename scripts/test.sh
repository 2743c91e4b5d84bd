#!/usr/bin/env bash
# The one command that runs the tests: start the services they need (scripts/services.sh:
# PostgreSQL, Redis and RabbitMQ on loopback, where installed and not running), then lint, types,
# and the whole suite. Arguments go to pytest (e.g. `bash scripts/test.sh tests/policy -x`).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/services.sh
bash scripts/browser.sh  # the dashboard's browser tests need a headless Chromium
. .venv/bin/activate
ruff check .
mypy autoscaler celeryconfig.py
lint-imports  # the layer contracts of pyproject.toml (ARCHITECTURE.md, "Layers")
pytest -q "$@"
