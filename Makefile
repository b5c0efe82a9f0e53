# brorl — the two commands first: `make demo` and `make test` (each sets up what it needs).
PY ?= python3
export PYTHONPATH := $(CURDIR)

.PHONY: setup demo test test-fast test-gpu test-compose bench bench-smoke protos clean

setup:
	@bash scripts/setup.sh

demo: setup
	@bash scripts/ensure_redis.sh
	$(PY) -m brorl.apps.cli demo

test: setup
	@bash scripts/ensure_redis.sh
	$(PY) -m ruff check .
	PY=$(PY) bash scripts/test.sh

test-fast: setup
	$(PY) -m ruff check .
	$(PY) -m pytest -q tests -m "not slow"

bench-smoke: setup
	@bash scripts/ensure_redis.sh
	$(PY) -m pytest -q -m bench tests/unit/bench

# docker-compose.yml for real on a Docker engine of the test's own (root; docs/cluster.md)
test-compose: setup
	$(PY) -m pytest -q -m docker tests/e2e/test_compose.py

test-gpu:
	$(PY) -m pytest -q tests -m gpu

bench: setup
	$(PY) bench/rollout.py
	$(PY) bench/logprob_memory.py
	$(PY) bench/reward.py

protos:
	bash scripts/gen_protos.sh

clean:
	rm -rf .cache runs .pytest_cache
