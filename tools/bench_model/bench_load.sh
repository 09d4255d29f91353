#!/usr/bin/env bash
# Peak host RSS and load time of a 1B-shaped bf16 Hugging Face checkpoint
# (Llama 3.2 1B's shape: dim 2048, FFN 8192, 16 layers, 32 heads, 8 KV heads,
# vocabulary 128256, tied) against its size on disk, for the worker's mapped
# load and for the fp32 host load. Writes the checkpoint once (about 5 GB of
# llama2.c .bin and 2.5 GB of safetensors) under $TANDEM_BENCH_DIR
# (default /tmp/tandem-bench-load).
# Usage: tools/bench_model/bench_load.sh [BUILD_DIR]
set -euo pipefail
build="${1:-build}"
dir="${TANDEM_BENCH_DIR:-/tmp/tandem-bench-load}"
mkdir -p "$dir"
if [ ! -f "$dir/hf/config.json" ]; then
  "$build/tools/model/tandem-make-random-model" --out "$dir/1b.bin" --dim 2048 --hidden-dim 8192 \
    --layers 16 --heads 32 --kv-heads 8 --vocab 128256 --seq-len 8192
  "$build/tools/model/tandem-convert-hf" --in "$dir/1b.bin" --out "$dir/hf" --dtype bf16 --shards 2
  rm -f "$dir/1b.bin"
fi
for mode in mapped host; do
  "$build/tools/bench_model/bench_load" --model "$dir/hf" --mode "$mode"
done
