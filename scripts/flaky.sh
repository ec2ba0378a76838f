#!/usr/bin/env bash
# Finds flaky tests: runs ctest RUNS times in a row over an already built tree
# and counts the failures of each test (a test that fails in some runs and
# passes in others is flaky; one that always fails is broken).
#
#   scripts/flaky.sh [RUNS] [ctest arguments...]
#   scripts/flaky.sh 20 -j2 -LE 'slow|e2e'        # the suite minus the long tests, 20 times
#   scripts/flaky.sh 200 -R '^server_shutdown_test$'
#
# env BUILD_DIR (build). Each run's output goes to $LOG_DIR/run-N.log (a
# temporary folder, printed; kept when something failed). Exit 1 if any run
# failed. Not run by CI (its time limit); run it after touching threads,
# sockets or timing.
set -uo pipefail
cd "$(dirname "$0")/.."
RUNS="${1:-20}"
shift || true
BUILD_DIR="${BUILD_DIR:-build}"
LOG_DIR="$(mktemp -d /tmp/bonsai_flaky.XXXXXX)"
declare -A fails=()
bad_runs=0
start=$SECONDS
for i in $(seq 1 "$RUNS"); do
  log="$LOG_DIR/run-$i.log"
  if ctest --test-dir "$BUILD_DIR" --output-on-failure "$@" >"$log" 2>&1; then
    continue
  fi
  bad_runs=$((bad_runs + 1))
  # ctest's summary lists each failed test as "  <n> - <name> (Failed|Timeout|...)".
  while read -r name; do
    fails[$name]=$(( ${fails[$name]:-0} + 1 ))
  done < <(sed -n 's/^[[:space:]]*[0-9]\+ - \([^ ]*\) (.*)$/\1/p' "$log")
  echo "flaky: run $i failed: $(sed -n 's/^[[:space:]]*[0-9]\+ - \([^ ]*\) (.*)$/\1/p' "$log" | tr '\n' ' ')"
done
echo "flaky: $RUNS runs in $((SECONDS - start)) s, $bad_runs failed"
for name in "${!fails[@]}"; do echo "flaky: $name failed ${fails[$name]} of $RUNS runs"; done
if [ "$bad_runs" -gt 0 ]; then
  echo "flaky: logs in $LOG_DIR"
  exit 1
fi
rm -rf "$LOG_DIR"
