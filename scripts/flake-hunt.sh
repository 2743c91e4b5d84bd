#!/usr/bin/env bash
# Hunt flaky tests the way a shared CI machine would find them: clone the committed main into a
# fresh temporary folder, run the README's test command there (scripts/test.sh) with one core kept
# busy by a CPU hog, and repeat N times. Prints each run's outcome and its failures, and a summary;
# exits non-zero when any run failed. Each run starts from a clean clone, so a missing install step
# or a test that depends on the working tree shows up too.
#
#   bash scripts/flake-hunt.sh 5            # five runs of the whole suite
#   bash scripts/flake-hunt.sh 3 tests/api  # arguments after N go to pytest, as with test.sh
#
# FLAKE_HUNT_DIR keeps the clones and logs there (default: a new temporary folder, kept for
# reading the logs afterwards). FLAKE_HUNT_HOGS sets how many CPU hogs run (default 1).
set -uo pipefail
cd "$(dirname "$0")/.."

runs=${1:-5}
shift || true
case "$runs" in '' | *[!0-9]*) echo "usage: $0 N [pytest args...]" >&2; exit 2 ;; esac
repo=$(pwd)
root=${FLAKE_HUNT_DIR:-$(mktemp -d -t flake-hunt.XXXXXX)}
mkdir -p "$root"
hogs=${FLAKE_HUNT_HOGS:-1}
commit=$(git rev-parse --short HEAD)
echo "flake-hunt: $runs run(s) of main@$commit, $hogs CPU hog(s), logs in $root"

hog_pids=()
stop_hogs() {
  for pid in "${hog_pids[@]}"; do kill "$pid" 2>/dev/null; done
  hog_pids=()
}
trap stop_hogs EXIT

failed_runs=0
for ((i = 1; i <= runs; i++)); do
  clone="$root/run-$i"
  rm -rf "$clone"
  git clone -q "$repo" "$clone"
  for ((h = 0; h < hogs; h++)); do
    (while :; do :; done) &
    hog_pids+=($!)
  done
  start=$(date +%s)
  (cd "$clone" && CI=true bash scripts/test.sh "$@") >"$root/run-$i.log" 2>&1 </dev/null
  rc=$?
  stop_hogs
  took=$(($(date +%s) - start))
  summary=$(grep -E '^(=+ )?[0-9]+ (passed|failed)|[0-9]+ (passed|failed).* in [0-9.]+s' "$root/run-$i.log" | tail -1)
  if [ "$rc" -eq 0 ]; then
    echo "run $i: ok in ${took}s: $summary"
  else
    failed_runs=$((failed_runs + 1))
    echo "run $i: FAILED (exit $rc) in ${took}s: ${summary:-see $root/run-$i.log}"
    grep -E '^(FAILED|ERROR) ' "$root/run-$i.log" | sed 's/^/    /'
  fi
  # The clone's virtualenv is the largest part; keep the log, drop the rest.
  rm -rf "$clone"
done
echo "flake-hunt: $((runs - failed_runs)) of $runs run(s) passed (main@$commit)"
[ "$failed_runs" -eq 0 ]
