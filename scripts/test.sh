#!/usr/bin/env bash
# The one command that runs the tests: start the services they need (scripts/services.sh:
# PostgreSQL, Redis and RabbitMQ on loopback, where installed and not running), build the images
# (scripts/images.sh: podman, installed where missing; what is up to date is kept), then lint,
# types, and the whole suite, the images' end-to-end runs included (tests/images). Arguments go
# to pytest (e.g. `bash scripts/test.sh tests/policy -x`).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/services.sh
bash scripts/browser.sh  # the dashboard's browser tests need a headless Chromium
bash scripts/images.sh --build-only  # the worker and control-plane images (tests/images)
. .venv/bin/activate
ruff check .
mypy autoscaler celeryconfig.py
lint-imports  # the layer contracts of pyproject.toml (ARCHITECTURE.md, "Layers")
pytest -q "$@"
