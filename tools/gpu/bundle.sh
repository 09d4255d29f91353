#!/usr/bin/env bash
# Builds the CUDA tests and bench_cuda here (nvcc, no GPU needed) and packs
# them with the shared libraries and model files they need into a folder that
# can be copied to a GPU machine which has the CUDA runtime but none of our
# build dependencies (the device tool's machines):
#
#   tools/gpu/bundle.sh [OUT_DIR=.gpu]    # then, on the GPU machine:
#   bash .gpu/run.sh [tests|bench|all]
#
# --services packs the services instead (tandem-worker, -scheduler,
# -frontend, -kvstore, the `tandem` CLI, tandem-bench-kv-ttft,
# tandem-make-random-model and tandem-wire-bench, from BUILD_DIR, default ./build, as they lie in
# the build tree, debug info stripped), for the three-service benchmarks on
# a machine with more cores (and a GPU for --backend cuda). The bundle must
# then sit in the checkout on that machine:
#
#   tools/gpu/bundle.sh --services [OUT_DIR=.gpu]   # then, there:
#   bash .gpu/run.sh frontend [run.sh flags]        # tools/bench_frontend/run.sh
#   bash .gpu/run.sh kvttft [run.sh flags]          # tools/bench_kv_ttft/run.sh
#   bash .gpu/run.sh services [flags]               # tools/bench_services.sh
# PACK=1 also writes OUT_DIR.tar.xz (17 MB against the folder's 62 MB: the
# device tool carries at most 64 MiB with the tree); tools/gpu/frontend_sets.sh
# unpacks it there and runs several benchmark configurations in one call.
set -euo pipefail
cd "$(dirname "$0")/../.."
services=0
if [ "${1:-}" = --services ]; then services=1; shift; fi
out="${1:-.gpu}"
if [ "$services" = 1 ]; then
  build="${BUILD_DIR:-build}"
  targets=(tandem-worker tandem-scheduler tandem-frontend tandem tandem-kvstore
           tandem-bench-kv-ttft tandem-make-random-model tandem-wire-bench)
else
  build="${BUILD_DIR:-build-gpu}"
  targets=(kernels_cuda_ops_test kernels_cuda_bf16_ops_test model_cuda_runner_test
           model_hf_families_test bench_cuda)
fi
if [ ! -f "$build/build.ninja" ]; then
  cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DTANDEM_CUDA=ON \
    -DCMAKE_CUDA_ARCHITECTURES="80;90"
fi
cmake --build "$build" -j"${JOBS:-2}" --target "${targets[@]}"
rm -rf "$out"
mkdir -p "$out/bin" "$out/lib" "$out/shared/models"
for t in "${targets[@]}"; do
  if [ "$services" = 1 ]; then  # kept where run.sh --build-dir looks for it
    f="$(cd "$build" && find . -type f -name "$t" -perm -u+x | head -1)"
    mkdir -p "$out/build/$(dirname "$f")"
    strip --strip-debug -o "$out/build/$f" "$build/$f"
  else
    find "$build" -type f -name "$t" -perm -u+x -exec cp {} "$out/bin/" \;
  fi
done
# Every non-glibc, non-CUDA library the binaries link (Abseil, gRPC, OpenSSL, ...).
bins_dir="$out/bin"; [ "$services" = 0 ] || bins_dir="$out/build"
find "$bins_dir" -type f -perm -u+x | while read -r b; do
  ldd "$b" | awk '/=> \//{print $3}' |
    grep -vE '/(libc|libm|libdl|libpthread|librt|libgcc_s|libstdc\+\+|ld-linux[^/]*)\.so|/cuda' || true
done | sort -u | xargs -r -I{} cp -L {} "$out/lib/"
shared="${TANDEM_SHARED:-../shared}"
if [ -d "$shared/models" ]; then
  cp "$shared/models/stories260K.bin" "$shared/models/stories260K.reference.json" "$out/shared/models/"
  [ "$services" = 0 ] || cp "$shared/models/tokenizer.bin" "$out/shared/models/"
  # The Hugging Face fixtures (about 25 MB) for model_hf_families_test's
  # both CUDA modes.
  [ "$services" = 1 ] || cp -r "$shared/models/hf" "$out/shared/models/"
fi
cp tools/gpu/run_bundle.sh "$out/run.sh"
cp tools/gpu/torch_anchor.py tools/gpu/kernel_profile.py tools/gpu/hf_derived_references.py "$out/"
# The derived fixtures' list (and any references made so far) for
# HfDerivedTest and hf_derived_references.py.
mkdir -p "$out/hf_derived"
cp tests/model/hf_derived/*.json "$out/hf_derived/"
cp -r tests/model/hf_generated "$out/"  # the generated checkpoints they name
du -sh "$out"
if [ "${PACK:-0}" = 1 ]; then
  tar -cf - "$out" | xz -T"${JOBS:-2}" -6 > "$out.tar.xz"
  du -sh "$out.tar.xz"
fi
