#!/usr/bin/env bash
# The whole suite (make test; CI runs it through .ci/run), as two pytest lanes side by side:
#   A: tests/unit, tests/integration and tests/e2e/recipes (one pytest process);
#   B: the rest of tests/e2e (clusters of service processes), then the compose cluster
#      (tests/e2e/test_compose.py: a Docker engine of its own, images built from Debian's
#      packages, a run trained through containers; docs/cluster.md "What the tests check").
# The service tests mostly wait for engines and processes to start and answer: run one after
# the other they left a third of the 2 cores idle. Two lanes used 70% of the cores (25:00 with
# the compose images built from a cold cache: 35.6 min of CPU); three used 83% and took 21:22
# with the same CPU, near the floor of 2 cores, and stretched every test: a sandbox test with
# a 1 s wall limit timed out there. Cheaper tests are what would make the suite faster. Every
# cluster a test starts has its own Redis namespace and free ports, so two can run at once.
# The compose test runs after B's other tests, beside the end of A (the longer lane), so that
# its image build and vLLM's start in a container overlap A rather than B's own clusters.
# The lanes' output is printed one after the other, with each lane's exit code; any failing
# fails the suite, exit code 5 (nothing collected) included.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-python3}
# the benchmarks' full smoke runs: make bench-smoke (they would take the suite past its budget).
MARKS="not bench and not docker"
for dir in tests/*/; do
  case "$dir" in tests/unit/|tests/integration/|tests/e2e/|tests/__pycache__/) ;;
    *) echo "scripts/test.sh runs tests/unit, tests/integration and tests/e2e, not $dir" >&2; exit 2 ;;
  esac
done
logs=$(mktemp -d -t brorl-tests.XXXXXX)
names=() pids=()
trap 'kill "${pids[@]}" 2>/dev/null; rm -rf "$logs"' EXIT INT TERM

lane() {  # lane NAME COMMAND...: runs the commands in order; the lane's code is the first failure's
  local name=$1; shift
  (
    rc=0
    for cmd in "$@"; do
      echo "---------- $cmd"
      bash -c "$cmd"
      code=$?
      [ "$rc" -eq 0 ] && rc=$code
    done
    exit "$rc"
  ) >"$logs/$name" 2>&1 &
  names+=("$name") pids+=($!)
}

pytest="$PY -m pytest -q --durations=10"
lane A "$pytest -m '$MARKS' tests/unit tests/integration tests/e2e/recipes"
lane B "$pytest -m '$MARKS' tests/e2e --ignore=tests/e2e/recipes" \
  "$PY -m pytest -q --durations=5 -m docker tests/e2e/test_compose.py"

status=0
summary=""
for i in "${!pids[@]}"; do
  name=${names[$i]}
  wait "${pids[$i]}"
  rc=$?
  [ "$rc" -eq 0 ] || status=1
  summary="$summary $name: exit $rc;"
  echo "========== lane $name =========="
  cat "$logs/$name"
done
echo "lanes (A: unit, integration, recipes; B: e2e, compose):$summary"
exit "$status"
