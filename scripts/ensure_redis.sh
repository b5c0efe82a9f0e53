#!/usr/bin/env bash
# Make sure a Redis answers on 127.0.0.1:6379 (machines of this kind run one; start one if not).
set -euo pipefail
if python3 -c "import redis,sys; redis.Redis(socket_connect_timeout=1).ping()" 2>/dev/null; then exit 0; fi
if ! command -v redis-server >/dev/null; then echo "redis-server not installed; run scripts/setup.sh as root" >&2; exit 1; fi
echo "[redis] starting redis-server on 127.0.0.1:6379"
redis-server --port 6379 --bind 127.0.0.1 --save "" --appendonly no --daemonize yes >/dev/null
for _ in $(seq 50); do python3 -c "import redis; redis.Redis(socket_connect_timeout=1).ping()" 2>/dev/null && exit 0; sleep 0.1; done
echo "redis-server did not come up" >&2; exit 1
