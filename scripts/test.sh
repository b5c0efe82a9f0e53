#!/usr/bin/env bash
# The whole suite (make test; CI runs it through .ci/run). Two pytest processes run side by side:
# tests/unit, and the tests that start services (tests/integration, tests/e2e), which spend most
# of their time waiting for engines and processes to come up and answer; serially the suite left
# about a third of the 2 cores idle. The unit run's output is printed after the services' run.
# Either run failing fails the suite, exit code 5 (nothing collected) included.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-python3}
MARKS="not bench"  # the benchmarks' full smoke runs: make bench-smoke
for dir in tests/*/; do
  case "$dir" in tests/unit/|tests/integration/|tests/e2e/|tests/__pycache__/) ;;
    *) echo "scripts/test.sh runs tests/unit, tests/integration and tests/e2e, not $dir" >&2; exit 2 ;;
  esac
done
unit_log=$(mktemp -t brorl-unit-tests.XXXXXX)
$PY -m pytest -q --durations=10 -m "$MARKS" tests/unit >"$unit_log" 2>&1 &
unit_pid=$!
trap 'kill "$unit_pid" 2>/dev/null; rm -f "$unit_log"' EXIT INT TERM
$PY -m pytest -q --durations=15 -m "$MARKS" tests/integration tests/e2e
services_rc=$?
wait "$unit_pid"
unit_rc=$?
echo "==================== tests/unit ===================="
cat "$unit_log"
echo "tests/unit: exit $unit_rc; tests/integration + tests/e2e: exit $services_rc"
[ "$unit_rc" -eq 0 ] && [ "$services_rc" -eq 0 ]
