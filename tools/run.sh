#!/usr/bin/env bash
# The main job: builds (if needed), starts tandem-worker and tandem-scheduler
# on loopback, waits until they serve, sends a few requests with the
# `tandem` client, prints the results, and stops the processes cleanly.
#
# Model: ../shared/models/stories260K.bin when present, otherwise a small
# random model generated with tandem-make-random-model.
# Usage: tools/run.sh [--no-build] [--build-dir DIR]
#   env: TANDEM_JOBS (build parallelism, default 2), TANDEM_SKIP_DEPS=1 (skip apt)
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="$(pwd)"
BUILD="$ROOT/build"
DO_BUILD=1
while [ $# -gt 0 ]; do
  case "$1" in
    --no-build) DO_BUILD=0 ;;
    --build-dir) BUILD="$2"; shift ;;
    -h|--help) sed -n '2,10p' "$0"; exit 0 ;;
    *) echo "unknown flag: $1" >&2; exit 2 ;;
  esac
  shift
done
JOBS="${TANDEM_JOBS:-2}"

if [ "$DO_BUILD" = 1 ]; then
  if [ "${TANDEM_SKIP_DEPS:-0}" != 1 ] && [ -x tools/install-deps.sh ]; then tools/install-deps.sh; fi
  [ -f "$BUILD/build.ninja" ] || [ -f "$BUILD/Makefile" ] || cmake -S . -B "$BUILD" -G Ninja
  cmake --build "$BUILD" -j"$JOBS" --target tandem-worker tandem-scheduler tandem tandem-make-random-model
fi
WORKER="$BUILD/services/worker/tandem-worker"
SCHEDULER="$BUILD/services/scheduler/tandem-scheduler"
CLI="$BUILD/tools/cli/tandem"

RUN_DIR="$(mktemp -d /tmp/tandem-run-XXXXXX)"
PIDS=()
cleanup() {
  for pid in "${PIDS[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
}
trap cleanup EXIT INT TERM

MODEL="$ROOT/../shared/models/stories260K.bin"
if [ ! -f "$MODEL" ]; then
  MODEL="$RUN_DIR/random.bin"
  echo "== ../shared/models/stories260K.bin not found; generating a random model at $MODEL"
  "$BUILD/tools/model/tandem-make-random-model" --out "$MODEL"
fi

wait_port() {  # file pid name
  for _ in $(seq 1 600); do
    [ -s "$1" ] && { cat "$1"; return 0; }
    kill -0 "$2" 2>/dev/null || { echo "$3 exited early; log:" >&2; cat "$RUN_DIR/$3.log" >&2; return 1; }
    sleep 0.05
  done
  echo "$3 did not start listening" >&2; return 1
}

echo "== starting tandem-worker ($MODEL)"
"$WORKER" --model "$MODEL" --listen 127.0.0.1:0 --port-file "$RUN_DIR/worker.port" \
  > "$RUN_DIR/worker.log" 2>&1 &
PIDS+=($!)
WPORT="$(wait_port "$RUN_DIR/worker.port" "${PIDS[0]}" worker)"
echo "== starting tandem-scheduler (worker 127.0.0.1:$WPORT)"
"$SCHEDULER" --worker "127.0.0.1:$WPORT" --listen 127.0.0.1:0 --port-file "$RUN_DIR/scheduler.port" \
  > "$RUN_DIR/scheduler.log" 2>&1 &
PIDS+=($!)
SPORT="$(wait_port "$RUN_DIR/scheduler.port" "${PIDS[1]}" scheduler)"
SERVER="127.0.0.1:$SPORT"
for _ in $(seq 1 300); do
  "$CLI" info --server "$SERVER" > "$RUN_DIR/info.txt" 2>/dev/null && break
  sleep 0.1
done
echo "== serving on $SERVER"
grep -ho "metrics on http://[^ ]*" "$RUN_DIR/worker.log" "$RUN_DIR/scheduler.log" | sed 's/^/   /' || true
sed 's/^/   /' "$RUN_DIR/info.txt"

echo "== tandem generate --prompt 1 --max-tokens 32 (greedy; llama2.c's reference starts 461 461 401 401 401)"
"$CLI" generate --server "$SERVER" --prompt 1 --max-tokens 32
echo "== tandem generate --prompt 1,403,407,261 --n 3 --temperature 0.8 --seed 7 (same seed, same tokens)"
"$CLI" generate --server "$SERVER" --prompt 1,403,407,261 --max-tokens 24 --n 3 --temperature 0.8 --seed 7
echo "== tandem bench: 64 requests, 16 concurrent, 32-token shared prefix"
"$CLI" bench --server "$SERVER" --concurrency 16 --num-requests 64 --prompt-len 48 --output-len 32 \
  --shared-prefix-len 32
echo "== scheduler stats"
"$CLI" stats --server "$SERVER" | sed 's/^/   /'
echo "== worth opening while it runs (Prometheus text):"
grep -ho "http://[^ ]*/metrics" "$RUN_DIR/scheduler.log" "$RUN_DIR/worker.log" | sed 's/^/   /' || true
echo "== logs: $RUN_DIR/{worker,scheduler}.log"
echo "   debug with grpcurl: grpcurl -plaintext $SERVER list   (reflection is on)"
cleanup
PIDS=()
echo "== stopped cleanly"
tail -n 3 "$RUN_DIR/scheduler.log" | sed 's/^/   /'
