#!/usr/bin/env bash
# The whole suite (make test; CI runs it through .ci/run), as two pytest processes side by side:
#   A: tests/unit, tests/integration and tests/e2e/recipes;
#   B: the rest of tests/e2e (clusters of service processes).
# The service tests mostly wait for engines and processes to start and answer: run one after
# the other they left a third of the 2 cores idle (22 min, of which the unit tests 4). Every
# cluster a test starts has its own Redis namespace and free ports, so two can run at once.
# B's output is printed first, then A's. Either failing fails the suite, exit code 5 (nothing
# collected) included.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-python3}
# the benchmarks' full smoke runs: make bench-smoke; the compose cluster (a Docker engine, images
# and a run through containers, 3 min with cached images on a quiet machine, 13 beside this
# suite): make test-compose — both would take the suite past its 20 minutes
MARKS="not bench and not docker"
for dir in tests/*/; do
  case "$dir" in tests/unit/|tests/integration/|tests/e2e/|tests/__pycache__/) ;;
    *) echo "scripts/test.sh runs tests/unit, tests/integration and tests/e2e, not $dir" >&2; exit 2 ;;
  esac
done
a_log=$(mktemp -t brorl-tests-a.XXXXXX)
$PY -m pytest -q --durations=10 -m "$MARKS" tests/unit tests/integration tests/e2e/recipes \
  >"$a_log" 2>&1 &
a_pid=$!
trap 'kill "$a_pid" 2>/dev/null; rm -f "$a_log"' EXIT INT TERM
$PY -m pytest -q --durations=10 -m "$MARKS" tests/e2e --ignore=tests/e2e/recipes
b_rc=$?
wait "$a_pid"
a_rc=$?
echo "========== tests/unit + tests/integration + tests/e2e/recipes =========="
cat "$a_log"
echo "A (unit, integration, recipes): exit $a_rc; B (e2e): exit $b_rc"
[ "$a_rc" -eq 0 ] && [ "$b_rc" -eq 0 ]
