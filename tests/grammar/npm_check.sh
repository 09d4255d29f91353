#!/usr/bin/env bash
# CTest grammar_npm_check (README.md here): installs ajv and json-schema-faker
# pinned in node/package-lock.json with `npm ci` into BUILD/grammar_npm, then
# has json-schema-faker write documents the grammar must accept, and ajv
# check the documents the grammar's token masks write, and gbnf (llama.cpp's
# GBNF) give its verdict on texts of EBNF grammars as ours does. Fails (never skips)
# without node or the registry: CI has both.
# Needs /usr/bin/python3 (Debian's; its json module is the reference for
# disable_any_whitespace).
# Usage: npm_check.sh BUILD_DIR SOURCE_DIR SHARED_DIR CHECK_BINARY GBNF_CHECK_BINARY
set -euo pipefail
build="$1"
src="$2/tests/grammar"
shared="$3"
check="$4"
gbnf_check="$5"
work="$build/grammar_npm"
mkdir -p "$work"
if ! cmp -s "$src/node/package-lock.json" "$work/package-lock.json" || [ ! -d "$work/node_modules/gbnf" ]; then
  cp "$src/node/package.json" "$src/node/package-lock.json" "$work/"
  (cd "$work" && npm ci --silent --no-audit --no-fund)
fi
cp "$src/node/check.mjs" "$src/node/gbnf.mjs" "$work/"
node "$work/check.mjs" instances "$src/data/schemas.json" "$work/instances.jsonl"
# The same documents as Python's json.dumps writes them, which is what
# xgrammar's any_whitespace=False (vLLM's disable_any_whitespace) holds: ", "
# and ": " (dumps), and with (",", ":") separators (tight), which it refuses.
# A number keeps the text JSON.stringify gave it (Python's repr of a float
# writes 1e-05 where JavaScript writes 0.00001, and a bounded number may
# have no exponent): it goes through dumps as a marked string.
/usr/bin/python3 - "$work/instances.jsonl" "$work/dumps.jsonl" <<'PY'
import json, re, sys
mark = re.compile(r'"\\u0000(.*?)\\u0000"')
def dumps(doc, **kw):
    return mark.sub(lambda m: m.group(1), json.dumps(doc, ensure_ascii=False, **kw))
with open(sys.argv[1]) as src, open(sys.argv[2], "w") as out:
    for line in src:
        j = json.loads(line)
        doc = json.loads(j["doc"], parse_float=lambda s: "\0" + s + "\0")
        out.write(json.dumps({"schema": j["schema"], "dumps": dumps(doc),
                              "tight": dumps(doc, separators=(",", ":"))}) + "\n")
PY
"$check" "$src/data/schemas.json" "$work/instances.jsonl" "$work/dumps.jsonl" \
  "$shared/models/tokenizer.bin" "$work/walks.jsonl"
node "$work/check.mjs" validate "$src/data/schemas.json" "$work/walks.jsonl"
"$gbnf_check" "$src/data/grammars.json" "$shared/models/tokenizer.bin" "$work/verdicts.jsonl"
node "$work/gbnf.mjs" "$src/data/grammars.json" "$work/verdicts.jsonl"
