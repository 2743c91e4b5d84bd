#!/usr/bin/env bash
# Build the worker image and the control plane's image, and run them for real.
#
#   bash scripts/images.sh               # build what changed, then the checks (tests/images)
#   bash scripts/images.sh --build-only  # build what changed (scripts/test.sh, the tests' fixture)
#   bash scripts/images.sh --base-only   # only the Debian base image
#
# Steps, each skipped when its result is already there for the same inputs:
#   1. the engine: podman (docker where that is what the machine has: ENGINE=docker); podman,
#      runc and mmdebstrap are installed with apt-get where missing, as Chromium is for the
#      dashboard's tests;
#   2. the base, unless BASE names one: a minimal Debian bookworm with python3, venv, Git and CA
#      certificates made with mmdebstrap (no base-image registry needed), imported as
#      localhost/gpu-queue-autoscaler-base:bookworm;
#   3. the wheelhouse: `pip wheel . setuptools -w wheelhouse/` with the host's pip and its
#      package-index settings; the images install from it with --no-index (an air-gapped build);
#      the dependencies' wheels are kept in ~/.cache/gpu-queue-autoscaler (IMAGES_CACHE);
#   4. the images, FROM the base: localhost/gpu-queue-autoscaler-worker:dev and
#      localhost/gpu-queue-autoscaler:dev (the control plane), labelled with a hash of their
#      inputs so an unchanged tree rebuilds nothing.
# Users build FROM a CUDA image: BASE=nvidia/cuda:<tag> with Python 3.11 (the wheelhouse is
# built for the host's Python, WHEEL_PYTHON=python3.12 picks another; the build refuses a mismatch).
# Nothing here skips: a step that cannot run fails with what to do.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
MODE=all
case "${1:-}" in
  "") ;;
  --build-only) MODE=build ;;
  --base-only) MODE=base ;;
  *) echo "images: usage: bash scripts/images.sh [--build-only|--base-only]" >&2; exit 2 ;;
esac
say() { echo "images: $*"; }
die() { echo "images: ERROR: $*" >&2; exit 1; }

BASE_TAG=localhost/gpu-queue-autoscaler-base:bookworm
WORKER_TAG=${WORKER_IMAGE:-localhost/gpu-queue-autoscaler-worker:dev}
CONTROL_TAG=${CONTROL_IMAGE:-localhost/gpu-queue-autoscaler:dev}
SOURCE_LABEL=io.gpu-queue-autoscaler.inputs

# ------------------------------------------------------------------ 1. the engine
apt_install() {
  command -v apt-get >/dev/null 2>&1 \
    || die "$* missing and no apt-get to install them: install $* (or docker) yourself"
  local sudo=
  if [ "$(id -u)" != 0 ]; then
    command -v sudo >/dev/null 2>&1 || die "installing $* needs root: apt-get install $*"
    sudo=sudo
  fi
  say "installing Debian's $*"
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -qq >/dev/null
  $sudo apt-get install -y -qq "$@" >/dev/null
}

ENGINE=${ENGINE:-}
if [ -z "$ENGINE" ]; then
  if command -v podman >/dev/null 2>&1; then ENGINE=podman
  elif command -v docker >/dev/null 2>&1 && docker info >/dev/null 2>&1; then ENGINE=docker
  else ENGINE=podman
  fi
fi
case "$ENGINE" in
  podman)
    missing=()
    command -v podman >/dev/null 2>&1 || missing+=(podman)
    command -v runc >/dev/null 2>&1 || [ -x /usr/sbin/runc ] || missing+=(runc)
    # the compose check (tests/images/test_compose_up.py): podman-compose, and service names
    # that resolve between containers (CNI's dnsname plugin)
    command -v podman-compose >/dev/null 2>&1 || missing+=(podman-compose)
    [ ! -d /usr/lib/cni ] || [ -x /usr/lib/cni/dnsname ] \
      || missing+=(golang-github-containernetworking-plugin-dnsname)
    [ ${#missing[@]} -eq 0 ] || apt_install "${missing[@]}"
    # This host's limits and cgroups (scripts/containers.conf says why); a user's own
    # CONTAINERS_CONF wins.
    export CONTAINERS_CONF=${CONTAINERS_CONF:-$ROOT/scripts/containers.conf}
    ;;
  docker) docker info >/dev/null 2>&1 || die "ENGINE=docker but no Docker engine answers" ;;
  *) die "ENGINE=$ENGINE: use podman or docker" ;;
esac
"$ENGINE" info >/dev/null 2>&1 || die "$ENGINE cannot run here: \`$ENGINE info\` fails"

image_label() {  # the inputs hash an image was built from, empty when there is no such image
  "$ENGINE" image inspect --format "{{ index .Config.Labels \"$SOURCE_LABEL\" }}" "$1" \
    2>/dev/null || true
}

# ------------------------------------------------------------------ 2. the base
if [ -z "${BASE:-}" ]; then
  BASE=$BASE_TAG
  if ! "$ENGINE" image inspect "$BASE" >/dev/null 2>&1; then
    command -v mmdebstrap >/dev/null 2>&1 || apt_install mmdebstrap
    say "making the Debian base $BASE with mmdebstrap"
    tmp=$(mktemp -d)
    trap 'rm -rf "$tmp"' EXIT
    mmdebstrap --quiet --variant=minbase \
      --include=python3,python3-venv,git,ca-certificates,passwd \
      bookworm "$tmp/rootfs.tar"
    "$ENGINE" import --quiet "$tmp/rootfs.tar" "$BASE" >/dev/null
    rm -rf "$tmp"
    trap - EXIT
  fi
  # a container of it runs here (limits, cgroups, runtime): the checks need no less
  "$ENGINE" run --rm --network host "$BASE" python3 -c "print('ok')" >/dev/null \
    || die "a container of $BASE does not run with $ENGINE here (see the lines above)"
fi
[ "$MODE" = base ] && { say "base ready: $BASE"; exit 0; }

# ------------------------------------------------------------------ 3. the wheelhouse
[ -x .venv/bin/python ] || bash scripts/setup.sh
PY=${WHEEL_PYTHON:-$ROOT/.venv/bin/python}
host_py=$("$PY" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
base_py=$("$ENGINE" run --rm --network host --entrypoint python3 "$BASE" \
  -c 'import sys; print("%d.%d" % sys.version_info[:2])') \
  || die "$BASE has no python3: build FROM an image with Python 3.11+"
[ "$host_py" = "$base_py" ] \
  || die "the base has Python $base_py but the wheelhouse would be built for $host_py: set" \
    "WHEEL_PYTHON to a python$base_py on this host, or pick a BASE with Python $host_py"
pip_wheel() {  # pip wheel ARGS..., quiet unless it fails
  local log
  log=$(mktemp)
  "$PY" -m pip wheel --disable-pip-version-check -w wheelhouse "$@" >"$log" 2>&1 \
    || { tail -n 30 "$log" >&2; rm -f "$log"; die "pip wheel $* failed"; }
  rm -f "$log"
}
# The dependencies' wheels depend on pyproject.toml, the host's Python and the base's own
# Python: kept under that key in the user's cache too, so a fresh clone builds none again.
base_id=$("$ENGINE" image inspect --format '{{.Id}}' "$BASE" | sed 's/^sha256://' | cut -c1-12)
key=$(cat pyproject.toml | sha1sum | cut -c1-12)-py$host_py-$base_id
deps_stamp=wheelhouse/.deps-$key
cache=${IMAGES_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gpu-queue-autoscaler}/wheelhouse-$key
if [ ! -f "$deps_stamp" ] && [ -f "$cache/.deps-$key" ]; then
  say "the dependencies' wheels from $cache"
  rm -rf wheelhouse
  mkdir -p wheelhouse
  cp -a "$cache/." wheelhouse/
fi
if [ ! -f "$deps_stamp" ]; then
  say "building the wheelhouse (the project's dependencies and setuptools, for Python $host_py)"
  rm -rf wheelhouse
  mkdir -p wheelhouse
  pip_wheel . setuptools
  # Markers can differ within one minor version (redis wants async-timeout below Python
  # 3.11.3): resolve in the base itself, offline, and add what its Python asks for.
  for _ in 1 2 3 4 5 6 7 8; do
    if out=$("$ENGINE" run --rm --network none -v "$ROOT/wheelhouse:/wheelhouse:ro" \
        --entrypoint /bin/sh "$BASE" -c 'python3 -m venv /tmp/v && /tmp/v/bin/pip install \
        --disable-pip-version-check --no-index --find-links /wheelhouse --dry-run --quiet \
        gpu-queue-autoscaler setuptools' 2>&1); then
      touch "$deps_stamp"
      break
    fi
    want=$(printf '%s\n' "$out" | sed -n 's/.*No matching distribution found for \([^;]*\).*/\1/p' \
      | head -n 1)
    [ -n "$want" ] || { printf '%s\n' "$out" >&2; die "the base cannot install the wheelhouse"; }
    say "adding $want for the base's Python"
    pip_wheel --no-deps "$want"
  done
  [ -f "$deps_stamp" ] || die "the wheelhouse is still incomplete for the base's Python"
  mkdir -p "$(dirname "$cache")"
  rm -rf "$cache.tmp"
  cp -a wheelhouse "$cache.tmp"
  rm -f "$cache.tmp"/gpu_queue_autoscaler-*.whl  # the project's own: built from its sources
  rm -rf "$cache"
  mv "$cache.tmp" "$cache"
fi
rm -rf build  # setuptools' scratch folder from the wheel above

# ------------------------------------------------------------------ 4. the images
inputs=$(
  {
    echo "base=$BASE $("$ENGINE" image inspect --format '{{.Id}}' "$BASE" 2>/dev/null || true)"
    find autoscaler migrations deploy/worker deploy/control-plane wheelhouse -type f \
      ! -name '*.pyc' ! -path '*/__pycache__/*' ! -name 'gpu_queue_autoscaler-*' -print0 \
      | sort -z | xargs -0 sha1sum
    sha1sum pyproject.toml celeryconfig.py alembic.ini .dockerignore
  } | sha1sum | cut -c1-16
)
fresh_wheel=
build() {  # TAG DOCKERFILE
  if [ "$(image_label "$1")" = "$inputs" ]; then
    say "$1 is up to date"
    return
  fi
  if [ -z "$fresh_wheel" ]; then  # the project's own wheel, from the sources hashed above
    rm -f wheelhouse/gpu_queue_autoscaler-*.whl
    pip_wheel --no-deps .
    rm -rf build
    fresh_wheel=1
  fi
  say "building $1"
  # podman: the Docker image format, which keeps HEALTHCHECK (OCI's has no field for it)
  local format=()
  [ "$ENGINE" = podman ] && format=(--format docker)
  "$ENGINE" build "${format[@]}" --quiet --network host --build-arg "BASE=$BASE" \
    --label "$SOURCE_LABEL=$inputs" -f "$2" -t "$1" . >/dev/null
  # the image this one replaced, untagged now: ours (by its label), so it goes
  "$ENGINE" image prune --force --filter "label=$SOURCE_LABEL" >/dev/null
}
build "$WORKER_TAG" deploy/worker/Dockerfile
build "$CONTROL_TAG" deploy/control-plane/Dockerfile
say "built $WORKER_TAG and $CONTROL_TAG (FROM $BASE)"
[ "$MODE" = build ] && exit 0

# ------------------------------------------------------------------ the checks
. .venv/bin/activate
exec pytest -q -p no:cacheprovider tests/images
