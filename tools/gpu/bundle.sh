#!/usr/bin/env bash
# Builds the CUDA tests and bench_cuda here (nvcc, no GPU needed) and packs
# them with the shared libraries and model files they need into a folder that
# can be copied to a GPU machine which has the CUDA runtime but none of our
# build dependencies (the device tool's machines):
#
#   tools/gpu/bundle.sh [OUT_DIR=.gpu]    # then, on the GPU machine:
#   bash .gpu/run.sh [tests|bench|all]
set -euo pipefail
cd "$(dirname "$0")/../.."
out="${1:-.gpu}"
build="${BUILD_DIR:-build-gpu}"
targets=(kernels_cuda_ops_test kernels_cuda_bf16_ops_test model_cuda_runner_test bench_cuda)
if [ ! -f "$build/build.ninja" ]; then
  cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DTANDEM_CUDA=ON \
    -DCMAKE_CUDA_ARCHITECTURES="80;90"
fi
cmake --build "$build" -j"${JOBS:-2}" --target "${targets[@]}"
rm -rf "$out"
mkdir -p "$out/bin" "$out/lib" "$out/shared/models"
for t in "${targets[@]}"; do
  find "$build" -type f -name "$t" -perm -u+x -exec cp {} "$out/bin/" \;
done
# Every non-glibc, non-CUDA library the binaries link (Abseil, OpenSSL's crypto).
for b in "$out"/bin/*; do
  ldd "$b" | awk '/=> \//{print $3}' |
    grep -vE '/(libc|libm|libdl|libpthread|librt|libgcc_s|libstdc\+\+|ld-linux[^/]*)\.so|/cuda' || true
done | sort -u | xargs -r -I{} cp -L {} "$out/lib/"
shared="${TANDEM_SHARED:-../shared}"
if [ -d "$shared/models" ]; then
  cp "$shared/models/stories260K.bin" "$shared/models/stories260K.reference.json" "$out/shared/models/"
fi
cp tools/gpu/run_bundle.sh "$out/run.sh"
du -sh "$out"
