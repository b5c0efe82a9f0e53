#!/usr/bin/env bash
# The whole suite (make test; CI runs it through .ci/run), as two pytest processes side by side:
#   A: tests/unit, tests/integration and tests/e2e/recipes;
#   B: the rest of tests/e2e (clusters of service processes), then the compose cluster
#      (tests/e2e/test_compose.py: a Docker engine of its own, images built from Debian's
#      packages, a run trained through containers; docs/cluster.md "What the tests check").
# The service tests mostly wait for engines and processes to start and answer: run one after
# the other they left a third of the 2 cores idle (22 min, of which the unit tests 4). Every
# cluster a test starts has its own Redis namespace and free ports, so two can run at once.
# B's output (and compose's) is printed first, then A's. Any failing fails the suite, exit
# code 5 (nothing collected) included.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-python3}
# the benchmarks' full smoke runs: make bench-smoke (they would take the suite past its budget).
# The compose test runs after B's other tests, beside the end of A (the longer lane), so that its
# image build and vLLM's start in a container overlap A rather than B's own clusters.
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
$PY -m pytest -q --durations=5 -m docker tests/e2e/test_compose.py
c_rc=$?
wait "$a_pid"
a_rc=$?
echo "========== tests/unit + tests/integration + tests/e2e/recipes =========="
cat "$a_log"
echo "A (unit, integration, recipes): exit $a_rc; B (e2e): exit $b_rc; compose: exit $c_rc"
[ "$a_rc" -eq 0 ] && [ "$b_rc" -eq 0 ] && [ "$c_rc" -eq 0 ]
