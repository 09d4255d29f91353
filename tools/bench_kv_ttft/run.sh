#!/usr/bin/env bash
# KV connector benchmark (issues 6 and 32): starts a tandem-kvstore, two
# scheduler+worker replicas sharing it (A computes prefixes, B is measured)
# and one replica without a store (C), then runs tandem-bench-kv-ttft, which
# prints B's figures beside C's. B accepts request cache salts: the bench
# computes the same prompt from scratch on B under a salt of its own.
#
# Usage: tools/bench_kv_ttft/run.sh [BUILD_DIR] [flags] [tandem-bench-kv-ttft flags]
#   --model PATH|1b   the workers' model (default ../shared/models/stories260K.bin);
#                     1b: a random llama2.c model of Llama-3.2-1B's shape (dim
#                     2048, 16 layers, 32/8 heads, vocab 128256, 8192 positions),
#                     made once with tandem-make-random-model into $TMPDIR (5 GB)
#   --backend B       the workers' --backend (default cpu)
#   --dtype D         the workers' --dtype (default auto)
#   --num-blocks N    each worker's KV cache in blocks of 16 tokens (default 120:
#                     about four 448-token requests; the 1b model's 4,000-token
#                     prompts want about 1,024)
#   --no-local-socket the store serves no local socket: loads go over TCP (the
#                     bulk port), as from a store on another host
# Then any tandem-bench-kv-ttft flag, e.g. --prompt-len 4000 --cached-len 3984.
# On a GPU, the issue's two points:
#   run.sh build --model 1b --backend cuda --dtype bfloat16 --num-blocks 1024 \
#     --prompt-len 1000 --cached-len 992
#   run.sh build --model 1b --backend cuda --dtype bfloat16 --num-blocks 1024 \
#     --prompt-len 4000 --cached-len 3984
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD=build
if [ $# -gt 0 ] && [ "${1#--}" = "$1" ]; then BUILD=$1; shift; fi
MODEL="$(pwd)/../shared/models/stories260K.bin"
BACKEND=cpu
DTYPE=auto
BLOCKS=120
LOCAL_SOCKET=1
BENCH_FLAGS=()
while [ $# -gt 0 ]; do
  case "$1" in
    --model) MODEL=$2; shift 2 ;;
    --backend) BACKEND=$2; shift 2 ;;
    --dtype) DTYPE=$2; shift 2 ;;
    --num-blocks) BLOCKS=$2; shift 2 ;;
    --no-local-socket) LOCAL_SOCKET=0; shift ;;
    *) BENCH_FLAGS+=("$1"); shift ;;
  esac
done
TARGETS=(tandem-worker tandem-scheduler tandem-kvstore tandem-bench-kv-ttft)
[ "$MODEL" = 1b ] && TARGETS+=(tandem-make-random-model)
# TANDEM_NO_BUILD=1: BUILD holds the binaries only (a tools/gpu/bundle.sh
# --services bundle on a GPU machine: bash .gpu/run.sh kvttft [flags]).
[ "${TANDEM_NO_BUILD:-0}" = 1 ] ||
  cmake --build "$BUILD" -j"${TANDEM_JOBS:-2}" --target "${TARGETS[@]}" >/dev/null
[ "$MODEL" != 1b ] || MODEL="$(tools/model/random_1b.sh "$BUILD")"
RUN="$(mktemp -d /tmp/tandem-bench-kv-XXXXXX)"
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill -TERM "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap cleanup EXIT INT TERM
# A worker loading a large model takes a while to write its port.
port() { for _ in $(seq 1 6000); do [ -s "$RUN/$1.port" ] && { cat "$RUN/$1.port"; return; }; sleep 0.05; done; echo "$1 did not start (log: $RUN/$1.log)" >&2; exit 1; }
# Runs in this shell (not in $(...)), so that PIDS reaches cleanup; sets ADDR.
start() {  # name binary args...
  local name=$1; shift
  "$@" --listen 127.0.0.1:0 --port-file "$RUN/$name.port" > "$RUN/$name.log" 2>&1 &
  PIDS+=($!)
  ADDR="127.0.0.1:$(port "$name")"
}
# The workers share the store's host: they load through its local socket
# (shared memory) unless --no-local-socket.
KV_ARGS=(--data-dir "$RUN/kvdata")
[ "$LOCAL_SOCKET" = 1 ] && KV_ARGS+=(--local-socket "$RUN/kv.sock")
start kv "$BUILD/services/kvstore/tandem-kvstore" "${KV_ARGS[@]}"; KV=$ADDR
W=("$BUILD/services/worker/tandem-worker" --model "$MODEL" --backend "$BACKEND" --dtype "$DTYPE")
S="$BUILD/services/scheduler/tandem-scheduler"
# Three workers share the machine (and a GPU), so each gets a fixed cache;
# A, which computes every prefix into the store, four times B's and C's.
start wa "${W[@]}" --num-blocks $((BLOCKS * 4)) --kvstore "$KV"; WA=$ADDR
start wb "${W[@]}" --num-blocks "$BLOCKS" --kvstore "$KV"; WB=$ADDR
start wc "${W[@]}" --num-blocks "$BLOCKS"; WC=$ADDR
start sa "$S" --worker "$WA" --kvstore "$KV"; SA=$ADDR
start sb "$S" --worker "$WB" --kvstore "$KV" --allow-request-cache-salt; SB=$ADDR
start sc "$S" --worker "$WC"; SC=$ADDR
# A worker writes its port before it loads the model, and a scheduler answers
# UNAVAILABLE until it has connected to its worker: wait for all three (the
# 1b model takes tens of seconds to load; the H200 run of 2026-11-30 began
# before and every request failed).
for s in sa sb sc; do
  for _ in $(seq 1 12000); do grep -q "connected to worker" "$RUN/$s.log" && break; sleep 0.05; done
  grep -q "connected to worker" "$RUN/$s.log" ||
    { echo "scheduler $s has no worker after 600 s (logs: $RUN)" >&2; tail -n 5 "$RUN"/w*.log >&2; exit 1; }
done
echo "model $MODEL, --backend $BACKEND --dtype $DTYPE, $BLOCKS KV blocks per worker"
# A failed run says why: the bench's status and every service's last lines
# (the H200 run of 2026-11-30 ended here with no word at all).
rc=0
"$BUILD/tools/bench_kv_ttft/tandem-bench-kv-ttft" --replica-a "$SA" --replica-b "$SB" --plain "$SC" \
  --kvstore "$KV" "${BENCH_FLAGS[@]}" || rc=$?
if [ "$rc" != 0 ]; then
  echo "tandem-bench-kv-ttft failed (exit status $rc); the services' last lines:"
  for f in "$RUN"/*.log; do echo "== $f"; tail -n 15 "$f"; done
  exit "$rc"
fi
# Where B's loads spent their time (its worker's tandem_worker_kvstore_*
# series): the read from the store into host memory, and the copy into the
# KV cache (on a GPU, the DMA). And how the workers' stores reached the
# store (its tandem_kvstore_* series): written in place through the local
# socket, or over the bulk port.
metrics_url() { grep -o 'metrics on http://[^ ]*' "$RUN/$1.log" | head -1 | cut -d' ' -f3; }
python3 - "$(metrics_url wb)" "$(metrics_url kv)" <<'PY' || true
import re, sys, urllib.request
def series(url):
    if not url:
        return lambda name: 0.0
    text = urllib.request.urlopen(url, timeout=10).read().decode()
    def v(name):
        m = re.search(rf"^{re.escape(name)} (\S+)$", text, re.M)
        return float(m.group(1)) if m else 0.0
    return v
b, kv = series(sys.argv[1]), series(sys.argv[2])
n = b('tandem_worker_kvstore_load_seconds_count{phase="read"}')
if n:
    mib = b("tandem_worker_kvstore_loaded_bytes_total") / 2**20
    read = b('tandem_worker_kvstore_load_seconds_sum{phase="read"}') * 1e3 / n
    copy = b('tandem_worker_kvstore_load_seconds_sum{phase="copy"}') * 1e3 / n
    print(f"B's loads: {n:.0f} steps, {mib:.1f} MiB; per step: read from the store {read:.2f} ms "
          f"(into host memory, checksummed), copy into the KV cache {copy:.2f} ms")
if sys.argv[2]:
    print(f"The store: {kv('tandem_kvstore_blocks_stored_total'):.0f} blocks stored; "
          f"{kv('tandem_kvstore_local_stores_total'):.0f} store batches through the local socket, "
          f"{kv('tandem_kvstore_local_written_in_place_blocks_total'):.0f} blocks written in place")
PY
echo "(logs: $RUN)"
