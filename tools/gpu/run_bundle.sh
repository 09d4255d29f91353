#!/usr/bin/env bash
# Runs a bundle made by tools/gpu/bundle.sh on a GPU machine.
#   bash run.sh tests   # the CUDA kernel and runner tests
#   bash run.sh bench   # bench1 and bench2 (each fits one device call):
#                       # bench1: bench_cuda's default lines, then PyTorch's figure;
#                       # bench2: the options still off, beside the defaults
#   bash run.sh all     # tests, then bench (may pass one call's 600 s)
#   bash run.sh profile # ncu: per-kernel time of decode steps and prefills
#                       # (PROFILE_BATCHES, PROFILE_PREFILLS; PROFILE_ARGS: more
#                       # bench_cuda flags for the decode steps, e.g.
#                       # "--decode-attention tensor-cores")
#   bash run.sh frontend [flags]   # a --services bundle in the checkout's
#                                  # root: tools/bench_frontend/run.sh
#   bash run.sh kvttft [flags]     # the same: tools/bench_kv_ttft/run.sh
#   bash run.sh services [flags]   # the same: tools/bench_services.sh --backend
#                                  # cuda (flags: --model 1b, --worker-flag ...)
# Results go to $OUT (or ./gpu-out) as text files.
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
out="${OUT:-$here/../gpu-out}"
mkdir -p "$out"
cuda_libs=$(ls -d /usr/local/cuda/lib64 /usr/local/cuda/lib /usr/local/cuda/targets/x86_64-linux/lib \
  2>/dev/null | tr '\n' ':')
py_libs=$(python3 -c 'import nvidia, os; print(":".join(os.path.join(p, d, "lib") for p in nvidia.__path__ for d in os.listdir(p)))' 2>/dev/null || true)
export LD_LIBRARY_PATH="$here/lib:${cuda_libs}${py_libs}:${LD_LIBRARY_PATH:-}"
export TANDEM_SHARED_DIR="$here/shared"
export TANDEM_HF_DERIVED_DIR="$here/hf_derived"
export CI=true
what="${1:-all}"
rc=0
if [ "$what" = frontend ]; then
  shift
  exec bash "$here/../tools/bench_frontend/run.sh" --build-dir "$here/build" "$@"
fi
if [ "$what" = services ]; then
  shift
  exec bash "$here/../tools/bench_services.sh" --build-dir "$here/build" --backend cuda "$@"
fi
if [ "$what" = kvttft ]; then
  shift
  TANDEM_NO_BUILD=1 exec bash "$here/../tools/bench_kv_ttft/run.sh" "$here/build" "$@"
fi
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv > "$out/gpu.txt" 2>&1
if [ "$what" = tests ] || [ "$what" = all ]; then
  # transformers' tokens for the derived fixtures (CPU, seconds), in one
  # file (the device tool brings back at most 8): untar
  # $out/hf_derived.tgz and copy its *.reference.json into
  # tests/model/hf_derived/.
  echo "=== hf_derived_references.py" | tee -a "$out/tests.txt"
  refs="$(mktemp -d)"
  python3 "$here/hf_derived_references.py" "$here/hf_derived/derived.json" "$here/shared/models/hf" \
    "$refs/hf_derived" 2>&1 | grep -v '^\[transformers\]' | tail -20 | tee -a "$out/tests.txt"
  tar -czf "$out/hf_derived.tgz" -C "$refs" hf_derived
  for t in kernels_cuda_ops_test kernels_cuda_bf16_ops_test model_cuda_runner_test \
           model_hf_families_test; do
    echo "=== $t" | tee -a "$out/tests.txt"
    "$here/bin/$t" 2>&1 | grep -vE '^\[ +(RUN|OK) +\]' | tee -a "$out/tests.txt"
    [ "${PIPESTATUS[0]}" = 0 ] || rc=1
  done
fi
if [ "$what" = profile ]; then
  # Eager steps (graphs off) so ncu sees each kernel; clocks and caches as
  # they run, not ncu's base-clock, flushed-cache defaults.
  ncu="$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)"
  [ -n "$ncu" ] || { echo "no ncu on this machine" | tee -a "$out/profile.txt"; exit 1; }
  prof() {  # NAME STEPS bench_cuda-args...
    local name="$1" steps="$2"; shift 2
    echo "=== $name: bench_cuda $*" | tee -a "$out/profile.txt"
    "$ncu" --profile-from-start off --metrics gpu__time_duration.sum --csv --page raw \
      --cache-control none --clock-control none --log-file "$out/ncu-$name.csv" \
      "$here/bin/bench_cuda" "$@" --profile 2>&1 | tail -3 | tee -a "$out/profile.txt"
    python3 "$here/kernel_profile.py" --steps "$steps" "$out/ncu-$name.csv" | tee -a "$out/profile.txt"
  }
  for b in ${PROFILE_BATCHES:-1 32 256}; do
    # shellcheck disable=SC2086
    prof "decode-b$b" 3 --shape llama-3.2-1b --batches "$b" --steps 4 --prefill= --cuda-graphs off \
      ${PROFILE_ARGS:-}
  done
  for n in ${PROFILE_PREFILLS:-8192}; do
    prof "prefill-$n" 3 --shape llama-3.2-1b --batches= --prefill "$n"
  done
  exit 0
fi
# bench1: where the defaults stand (bench_cuda's lines, then PyTorch's on
# the same shapes, same GPU). bench2: the options that are off until a GPU
# has run them, each beside the default it would replace. `bench` and `all`
# run both; each half fits one device call (about 5 minutes), the whole
# may not. Every line prints its seconds.
bench_line() {  # bench_cuda-args...
  local t0=$SECONDS
  echo "=== bench_cuda $*" | tee -a "$out/bench.txt"
  "$here/bin/bench_cuda" "$@" 2>&1 | grep -v '^I[0-9]' | tee -a "$out/bench.txt"
  [ "${PIPESTATUS[0]}" = 0 ] || rc=1
  echo "    ($((SECONDS - t0)) s)" | tee -a "$out/bench.txt"
}
anchor_line() {  # torch_anchor.py-args...
  local t0=$SECONDS
  echo "=== torch_anchor.py $*" | tee -a "$out/bench.txt"
  python3 "$here/torch_anchor.py" "$@" 2>&1 | grep -v Warning | tee -a "$out/bench.txt"
  echo "    ($((SECONDS - t0)) s)" | tee -a "$out/bench.txt"
}
if [ "$what" = bench1 ] || [ "$what" = bench ] || [ "$what" = all ]; then
  # The default decode and prefill lines, decode steps that draw with top-p
  # on the device (less the greedy line: the sampler's cost), prefills that
  # score every prompt token (less the plain prefill: prompt logprobs'
  # cost), the other shapes (Qwen2.5-1.5B's: head size 128) and the float32
  # mode; then PyTorch (with vLLM's way of top-p sampling and of prompt
  # logprobs). What the 2026-11-30 H200 run settled is left out
  # (DESIGN-NOTES "round three, measured"); its flags stay for a run by
  # hand: --cuda-graphs off, --decode-attention auto|per-row,
  # --dependent-launch on, --attention split-k.
  bench_line --shape llama-3.2-1b
  bench_line --shape llama-3.2-1b --prefill= --batches 1,32,256 --sampling top-p
  bench_line --shape llama-3.2-1b --batches= --prefill 512,2048 --prompt-logprobs 20
  bench_line --shape tinyllama-1.1b --batches 1,32,256
  bench_line --shape qwen2.5-1.5b --batches 1,32,256
  bench_line --shape "$here/shared/models/stories260K.bin" --context 128 --prefill 256 --batches 1,32,256
  bench_line --shape llama-3.2-1b --dtype float32 --batches 1,32 --prefill 512
  anchor_line --shape llama-3.2-1b --sample-batches 1,32,256
  anchor_line --shape tinyllama-1.1b --sample-batches 1,32,256
  anchor_line --shape llama-3.2-1b --prefill 512,2048 --prompt-logprobs 20
  anchor_line --shape qwen2.5-1.5b
  anchor_line --shape gemma-2-2b
fi
if [ "$what" = bench2 ] || [ "$what" = bench ] || [ "$what" = all ]; then
  # Against bench1's default lines: the tensor-core decode attention;
  # batches 2 and 4 on our GEMV and 1 to 8 on cuBLAS alone (where the GEMV's
  # limit belongs); batches 8 to 64 on the tensor-core GEMM against cuBLAS
  # (bench1's first line, and 16 and 64 here); Gemma 2 2B's prefill with its
  # head size 256 and softcap on the tensor cores, against the default's
  # split-K at 2,048 (and bench1's PyTorch line); Qwen2.5-1.5B's prefill
  # (head size 128) in the wide block, against bench1's qwen2.5-1.5b line.
  bench_line --shape llama-3.2-1b --prefill= --batches 1,32,128,256 --decode-attention tensor-cores
  bench_line --shape tinyllama-1.1b --prefill= --batches 1,32,256 --decode-attention tensor-cores
  bench_line --shape llama-3.2-1b --prefill= --batches 2,4,16,64
  bench_line --shape llama-3.2-1b --prefill= --batches 1,2,4,8 --gemv-max-rows 0
  bench_line --shape llama-3.2-1b --prefill= --batches 8,16,32,64 --tc-gemm-max-rows 64
  bench_line --shape tinyllama-1.1b --prefill= --batches 8,32 --tc-gemm-max-rows 64
  bench_line --shape gemma-2-2b --batches= --prefill 512,2048,8192 --attention tensor-cores-gemma
  bench_line --shape gemma-2-2b --batches= --prefill 2048
  bench_line --shape qwen2.5-1.5b --batches= --prefill 512,2048,8192 --attention tensor-cores-wide
fi
exit $rc
