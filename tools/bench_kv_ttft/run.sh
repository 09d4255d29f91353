#!/usr/bin/env bash
# KV connector benchmark (issue 6): starts a tandem-kvstore, two
# scheduler+worker replicas sharing it (A computes prefixes, B is measured)
# and one replica without a store, then runs tandem-bench-kv-ttft. B accepts
# request cache salts: the bench computes the same prompt from scratch on B
# under a salt of its own.
# Usage: tools/bench_kv_ttft/run.sh [BUILD_DIR] [extra tandem-bench-kv-ttft flags]
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD="${1:-build}"; shift || true
cmake --build "$BUILD" -j"${TANDEM_JOBS:-2}" --target tandem-worker tandem-scheduler \
  tandem-kvstore tandem-bench-kv-ttft >/dev/null
MODEL="$(pwd)/../shared/models/stories260K.bin"
RUN="$(mktemp -d /tmp/tandem-bench-kv-XXXXXX)"
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill -TERM "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap cleanup EXIT INT TERM
port() { for _ in $(seq 1 600); do [ -s "$RUN/$1.port" ] && { cat "$RUN/$1.port"; return; }; sleep 0.05; done; echo "$1 did not start" >&2; exit 1; }
# Runs in this shell (not in $(...)), so that PIDS reaches cleanup; sets ADDR.
start() {  # name binary args...
  local name=$1; shift
  "$@" --listen 127.0.0.1:0 --port-file "$RUN/$name.port" > "$RUN/$name.log" 2>&1 &
  PIDS+=($!)
  ADDR="127.0.0.1:$(port "$name")"
}
start kv "$BUILD/services/kvstore/tandem-kvstore" --data-dir "$RUN/kvdata"; KV=$ADDR
W="$BUILD/services/worker/tandem-worker"; S="$BUILD/services/scheduler/tandem-scheduler"
# Small KV caches (120 blocks of 16 tokens: about four 448-token requests).
# Three workers share the machine (and a GPU), so each gets a fixed cache.
start wa "$W" --model "$MODEL" --kvstore "$KV" --kv-cache-bytes $((64 << 20)); WA=$ADDR
start wb "$W" --model "$MODEL" --kvstore "$KV" --num-blocks 120; WB=$ADDR
start wc "$W" --model "$MODEL" --num-blocks 120; WC=$ADDR
start sa "$S" --worker "$WA" --kvstore "$KV"; SA=$ADDR
start sb "$S" --worker "$WB" --kvstore "$KV" --allow-request-cache-salt; SB=$ADDR
start sc "$S" --worker "$WC"; SC=$ADDR
sleep 1
"$BUILD/tools/bench_kv_ttft/tandem-bench-kv-ttft" --replica-a "$SA" --replica-b "$SB" --plain "$SC" \
  --kvstore "$KV" "$@"
echo "(logs: $RUN)"
