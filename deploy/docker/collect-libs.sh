#!/usr/bin/env bash
# collect-libs.sh OUT BINARY...: copies the binaries (stripped) to OUT/bin and
# every shared library they load, except the C runtime the runtime image
# already has, to OUT/lib.
set -euo pipefail
out=$1; shift
mkdir -p "$out/bin" "$out/lib"
for b in "$@"; do
  install -m 755 "$b" "$out/bin/"
  strip --strip-unneeded "$out/bin/$(basename "$b")" || true
  if ldd "$b" | grep -q "not found"; then
    echo "collect-libs: $b needs libraries that are not found:" >&2
    ldd "$b" | grep "not found" >&2
    exit 1
  fi
  ldd "$b" | awk '/=> \// {print $3}' | while read -r lib; do
    case "$(basename "$lib")" in
      libc.so.*|libm.so.*|libpthread.so.*|libdl.so.*|librt.so.*|ld-linux*|libgcc_s.so.*) ;;
      libcuda.so.*) ;;  # the node's driver library, mounted by the NVIDIA runtime
      *) cp -Lu "$lib" "$out/lib/" ;;
    esac
  done
done
