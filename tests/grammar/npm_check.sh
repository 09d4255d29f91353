#!/usr/bin/env bash
# CTest grammar_npm_check (README.md here): installs ajv and json-schema-faker
# pinned in node/package-lock.json with `npm ci` into BUILD/grammar_npm, then
# has json-schema-faker write documents the grammar must accept, and ajv
# check the documents the grammar's token masks write. Fails (never skips)
# without node or the registry: CI has both.
# Usage: npm_check.sh BUILD_DIR SOURCE_DIR SHARED_DIR CHECK_BINARY
set -euo pipefail
build="$1"
src="$2/tests/grammar"
shared="$3"
check="$4"
work="$build/grammar_npm"
mkdir -p "$work"
if ! cmp -s "$src/node/package-lock.json" "$work/package-lock.json" || [ ! -d "$work/node_modules/ajv" ]; then
  cp "$src/node/package.json" "$src/node/package-lock.json" "$work/"
  (cd "$work" && npm ci --silent --no-audit --no-fund)
fi
cp "$src/node/check.mjs" "$work/"
node "$work/check.mjs" instances "$src/data/schemas.json" "$work/instances.jsonl"
"$check" "$src/data/schemas.json" "$work/instances.jsonl" "$shared/models/tokenizer.bin" "$work/walks.jsonl"
node "$work/check.mjs" validate "$src/data/schemas.json" "$work/walks.jsonl"
