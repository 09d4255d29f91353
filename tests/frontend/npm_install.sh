#!/usr/bin/env bash
# CTest fixture of the frontend tests (frontend_npm): installs the npm
# `openai` client pinned in node/package-lock.json with `npm ci` into
# BUILD/frontend_npm, beside the scripts that use it. Fails (never skips)
# without node or the registry: CI has both.
# Usage: npm_install.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
build="$1"
src="$2/tests/frontend/node"
work="$build/frontend_npm"
mkdir -p "$work"
if ! cmp -s "$src/package-lock.json" "$work/package-lock.json" || [ ! -d "$work/node_modules/openai" ]; then
  cp "$src/package.json" "$src/package-lock.json" "$work/"
  (cd "$work" && npm ci --silent --no-audit --no-fund)
fi
cp "$src"/*.mjs "$work/"
echo "frontend_npm: openai $(node -p "require('$work/node_modules/openai/package.json').version") in $work"
