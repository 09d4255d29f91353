#!/usr/bin/env bash
# Prints the path of a random llama2.c model of Llama-3.2-1B's shape (dim
# 2048, 16 layers, 32/8 heads, vocab 128256, 8192 positions), made once with
# tandem-make-random-model into $TMPDIR (5 GB) and reused after: the benches'
# `--model 1b` (tools/bench_kv_ttft/run.sh, tools/bench_services.sh).
# Usage: tools/model/random_1b.sh BUILD_DIR
set -euo pipefail
model="${TMPDIR:-/tmp}/tandem-random-1b.bin"
if [ ! -s "$model" ]; then
  echo "making $model (Llama-3.2-1B's shape, random weights)" >&2
  "$1/tools/model/tandem-make-random-model" --out "$model.tmp" --dim 2048 \
    --hidden-dim 8192 --layers 16 --heads 32 --kv-heads 8 --vocab 128256 --seq-len 8192 >&2
  mv "$model.tmp" "$model"
fi
echo "$model"
