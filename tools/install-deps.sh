#!/usr/bin/env bash
# Installs every Debian package Tandem's build, tests and scripts need.
# Idempotent: does nothing (and needs no network) when all are present.
set -euo pipefail

PACKAGES=(
  build-essential cmake ninja-build pkg-config git curl ca-certificates
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler grpc-proto
  libabsl-dev librocksdb-dev prometheus-cpp-dev libssl-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  python3-grpcio python3-grpc-tools
  redis-server redis-tools
  prometheus  # promtool, for tests/integration/metrics_test.py
)

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#PACKAGES[@]} packages present"
  exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
echo "install-deps: installing ${missing[*]}"
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
