#!/usr/bin/env bash
# The one command that runs the tests: start the services they need (scripts/services.sh:
# PostgreSQL, Redis and RabbitMQ on loopback, where installed and not running), build the images
# (scripts/images.sh: podman, installed where missing; what is up to date is kept), then lint,
# types, and the whole suite, the images' end-to-end runs included (tests/images). Arguments go
# to pytest and run it alone (e.g. `bash scripts/test.sh tests/policy -x`).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/services.sh
bash scripts/browser.sh  # the dashboard's browser tests need a headless Chromium
bash scripts/images.sh --build-only  # the worker and control-plane images (tests/images)
. .venv/bin/activate
ruff check .
ruff format --check .  # one layout: a diff that only reformats never hides a change
mypy autoscaler celeryconfig.py
lint-imports  # the layer contracts of pyproject.toml (ARCHITECTURE.md, "Layers")
# dead code: functions, methods and classes nothing calls ([tool.vulture] in pyproject.toml)
dead=$(vulture | grep -E "unused (function|method|class|property)" || true)
if [ -n "$dead" ]; then
  printf 'dead code: delete it, or name what calls it in scripts/vulture_allow.py\n%s\n' "$dead"
  exit 1
fi
if [ "$#" -gt 0 ]; then
  exec pytest -q "$@"
fi
# The whole suite: three pytest workers on the two cores (most tests wait on servers, not on
# the CPU), a module per worker, the container engine's tests on one (tests/conftest.py). The API
# fuzz runs alone afterwards: schemathesis's per-operation tests collapse into one under xdist.
pytest -q -n 3 --dist loadgroup --ignore=tests/api/test_api_fuzz.py
pytest -q tests/api/test_api_fuzz.py
