#!/usr/bin/env bash
# `duplicates` (the tool library's duplicate finder) over the project's source without the
# generated gRPC stubs in brorl/v1/, whose repeated shapes would drown the rest of the list:
# it reads a copy of the tracked and untracked-not-ignored source files minus brorl/v1/.
#   bash scripts/duplicates.sh [--most 40] [--seconds 60] ...   (its options pass through)
set -euo pipefail
cd "$(dirname "$0")/.."
command -v duplicates >/dev/null || { echo "duplicates: not on PATH" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
git ls-files -z --cached --others --exclude-standard -- \
    brorl services kernels demo bench scripts docker tests examples/node/*.js \
  | grep -zv '^brorl/v1/' \
  | xargs -0 -r cp --parents -t "$tmp" 2>/dev/null || true
duplicates --repo "$tmp" "$@"
