#!/usr/bin/env bash
# The headless Chromium the dashboard's browser tests drive (tests/dashboard): Debian's chromium
# and chromium-driver, installed with apt-get where missing (needs root, as in CI; sudo is used
# when not root). Quiet and safe to re-run: nothing happens when Chromium is already there.
# Another Chromium can be used by setting CHROMIUM to its path.
set -euo pipefail
CHROMIUM=${CHROMIUM:-/usr/bin/chromium}
[ -x "$CHROMIUM" ] && exit 0
if [ "$CHROMIUM" != /usr/bin/chromium ]; then
  echo "browser: ERROR: CHROMIUM=$CHROMIUM is not an executable file" >&2
  exit 1
fi
if ! command -v apt-get >/dev/null 2>&1; then
  echo "browser: ERROR: no Chromium at $CHROMIUM and no apt-get to install it: install" \
    "Chromium and set CHROMIUM to its path" >&2
  exit 1
fi
SUDO=
if [ "$(id -u)" != 0 ]; then
  if command -v sudo >/dev/null 2>&1; then SUDO=sudo; else
    echo "browser: ERROR: installing Chromium needs root: apt-get install chromium" \
      "chromium-driver" >&2
    exit 1
  fi
fi
echo "browser: installing Debian's chromium and chromium-driver"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq >/dev/null
$SUDO apt-get install -y -qq chromium chromium-driver >/dev/null
[ -x "$CHROMIUM" ] || { echo "browser: ERROR: $CHROMIUM still missing after apt-get" >&2; exit 1; }
