#!/usr/bin/env bash
# Benchmarks the running services on this machine (DESIGN §8; not a test):
# output tokens/s, TTFT and inter-token latency at 32 and 64 concurrent
# requests, sync and async scheduling in the same run, then the per-step
# SchedulerOutput size and serialize time at 256 running requests, measured
# inside the running scheduler (GetStats) under a 256-concurrency bench, with
# tandem-wire-bench's offline figure beside it.
# "device idle between steps" is DESIGN §8's "GPU idle between steps" on the
# device's own clock (CUDA events; with --backend sim, 5 ms steps and no
# math, the modelled device), beside the worker's wall-clock figure.
# Usage: tools/bench_services.sh [--build-dir DIR] [--backend cpu|cuda|sim] [--output-len N]
#                                [--model PATH|1b] [--kv-cache-bytes B] [--worker-flag FLAG]...
#        (DIR defaults to ./build; the model to ../shared/models/stories260K.bin,
#        1b: a random model of Llama-3.2-1B's shape made once into $TMPDIR, as
#        tools/bench_kv_ttft/run.sh makes it; B, each 32/64-stream worker's
#        KV cache, to 64 MiB, and the 256-stream worker gets 16 B; each
#        --worker-flag goes to every worker, e.g. --worker-flag
#        --overlap-steps=false or --worker-flag --dtype=bfloat16)
# On a GPU (a tools/gpu/bundle.sh --services bundle: bash .gpu/run.sh services):
#   --backend cuda --model 1b --kv-cache-bytes 1073741824 --worker-flag --dtype=bfloat16
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD="$(pwd)/build"
BACKEND=cpu
OUTPUT_LEN=128
PROMPT_LEN=64
WORKER_FLAGS=()
MODEL="$(pwd)/../shared/models/stories260K.bin"
KV_BYTES=$((64 << 20))
while [ $# -gt 0 ]; do
  case "$1" in
    --build-dir) BUILD="$2"; shift ;;
    --backend) BACKEND="$2"; shift ;;
    --output-len) OUTPUT_LEN="$2"; shift ;;
    --worker-flag) WORKER_FLAGS+=("$2"); shift ;;
    --model) MODEL="$2"; shift ;;
    --kv-cache-bytes) KV_BYTES="$2"; shift ;;
    -h|--help) sed -n '2,20p' "$0"; exit 0 ;;
    *) echo "unknown flag: $1" >&2; exit 2 ;;
  esac
  shift
done
[ "$MODEL" != 1b ] || MODEL="$(tools/model/random_1b.sh "$BUILD")"
[ -f "$MODEL" ] || { MODEL="$(mktemp -d)/random.bin"; "$BUILD/tools/model/tandem-make-random-model" --out "$MODEL"; }
DIR="$(mktemp -d /tmp/tandem-bench-XXXXXX)"
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill -TERM "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap cleanup EXIT
port() { for _ in $(seq 1 600); do [ -s "$1" ] && { cat "$1"; return; }; sleep 0.05; done; echo "no $1" >&2; exit 1; }

declare -A SERVER
for mode in sync async; do
  # Two workers at once: each a fixed cache (on cuda the first would
  # otherwise take --gpu-memory-utilization's 0.9 of the GPU).
  "$BUILD/services/worker/tandem-worker" --model "$MODEL" --backend "$BACKEND" --listen 127.0.0.1:0 \
    --kv-cache-bytes "$KV_BYTES" --port-file "$DIR/w-$mode.port" "${WORKER_FLAGS[@]}" \
    > "$DIR/worker-$mode.log" 2>&1 &
  PIDS+=($!)
  wport="$(port "$DIR/w-$mode.port")"
  async_flag=true; [ "$mode" = sync ] && async_flag=false
  "$BUILD/services/scheduler/tandem-scheduler" --worker "127.0.0.1:$wport" --listen 127.0.0.1:0 \
    --port-file "$DIR/s-$mode.port" --async-scheduling=$async_flag > "$DIR/scheduler-$mode.log" 2>&1 &
  PIDS+=($!)
  SERVER[$mode]="127.0.0.1:$(port "$DIR/s-$mode.port")"
  for _ in $(seq 1 300); do "$BUILD/tools/cli/tandem" info --server "${SERVER[$mode]}" >/dev/null 2>&1 && break; sleep 0.1; done
done

worker_series() {  # WORKER SERIES: a worker's metric, as it stands
  local url; url="$(grep -ho "http://[^ ]*/metrics" "$DIR/worker-$1.log" | head -1)"
  curl -s "$url" | awk -v n="$2" '$1 == n {print $2}'
}
# Seconds the worker spent executing steps so far (its wall clock).
worker_busy() { worker_series "$1" tandem_worker_step_duration_seconds_sum; }
# "busy idle": the device's own clock (CUDA events on cuda).
device_times() {
  echo "$(worker_series "$1" tandem_worker_device_busy_seconds_total)" \
       "$(worker_series "$1" tandem_worker_device_idle_seconds_total)"
}
device_idle() {  # LABEL "busy0 idle0" "busy1 idle1": the device's idle share between them
  awk -v l="$1" -v a="$2" -v b="$3" 'BEGIN { split(a, x, " "); split(b, y, " ");
    busy = y[1] - x[1]; idle = y[2] - x[2]
    if (busy + idle <= 0) { printf "  %s: no device time\n", l; exit }
    printf "  %s: device idle between steps %.2f%% (device clock: %.1f ms idle, %.1f ms busy)\n",
           l, 100 * idle / (busy + idle), 1e3 * idle, 1e3 * busy }'
}
echo "== services: backend $BACKEND, prompt $PROMPT_LEN tokens, output $OUTPUT_LEN tokens (EOS ignored), $(nproc) CPUs, worker flags: ${WORKER_FLAGS[*]:-(none)}"
for c in 32 64; do
  for mode in sync async; do
    # Warm-up, then the measured run.
    "$BUILD/tools/cli/tandem" bench --server "${SERVER[$mode]}" --concurrency "$c" --num-requests "$c" \
      --prompt-len "$PROMPT_LEN" --output-len 8 > /dev/null 2>&1 || true
    busy0="$(worker_busy "$mode")"; t0="$(date +%s.%N)"
    "$BUILD/tools/cli/tandem" bench --server "${SERVER[$mode]}" --concurrency "$c" \
      --num-requests $((c * 4)) --prompt-len "$PROMPT_LEN" --output-len "$OUTPUT_LEN" \
      --label "$mode c=$c" 2>/dev/null > "$DIR/bench.out" &
    bench_pid=$!
    # Steady state: a window in the middle of the run, after the ramp-up.
    sleep 0.6; busy_a="$(worker_busy "$mode")"; ta="$(date +%s.%N)"; dev_a="$(device_times "$mode")"
    sleep 0.8; busy_b="$(worker_busy "$mode")"; tb="$(date +%s.%N)"; dev_b="$(device_times "$mode")"
    kill -0 "$bench_pid" 2>/dev/null && steady=1 || steady=0
    wait "$bench_pid" || true
    busy1="$(worker_busy "$mode")"; t1="$(date +%s.%N)"
    cat "$DIR/bench.out"
    awk -v b0="$busy0" -v b1="$busy1" -v t0="$t0" -v t1="$t1" 'BEGIN {
      printf "  worker busy %.1f%% of the run (idle between steps %.1f%%, includes ramp-up/down)\n",
             100*(b1-b0)/(t1-t0), 100*(1-(b1-b0)/(t1-t0)) }'
    if [ "$steady" = 1 ]; then
      awk -v b0="$busy_a" -v b1="$busy_b" -v t0="$ta" -v t1="$tb" 'BEGIN {
        printf "  steady state (0.6-1.4 s into the run): worker idle between steps %.2f%%\n",
               100*(1-(b1-b0)/(t1-t0)) }'
      device_idle "steady state" "$dev_a" "$dev_b"
    else
      echo "  (run shorter than 1.4 s: no steady-state window)"
    fi
  done
done

# 256 running requests: a worker with room for all of them and a scheduler
# that admits them all (async scheduling).
"$BUILD/services/worker/tandem-worker" --model "$MODEL" --backend "$BACKEND" --listen 127.0.0.1:0 \
  --kv-cache-bytes $((16 * KV_BYTES)) --port-file "$DIR/w-256.port" "${WORKER_FLAGS[@]}" \
  > "$DIR/worker-256.log" 2>&1 &
PIDS+=($!)
wport="$(port "$DIR/w-256.port")"
"$BUILD/services/scheduler/tandem-scheduler" --worker "127.0.0.1:$wport" --listen 127.0.0.1:0 \
  --port-file "$DIR/s-256.port" --max-num-seqs 256 > "$DIR/scheduler-256.log" 2>&1 &
PIDS+=($!)
S256="127.0.0.1:$(port "$DIR/s-256.port")"
for _ in $(seq 1 300); do "$BUILD/tools/cli/tandem" info --server "$S256" >/dev/null 2>&1 && break; sleep 0.1; done
stats() { "$BUILD/tools/cli/tandem" stats --server "$S256"; }
echo "== per-step SchedulerOutput in the running scheduler, 256 concurrent requests (async)"
stats > "$DIR/stats0.txt"
dev0="$(device_times 256)"
"$BUILD/tools/cli/tandem" bench --server "$S256" --concurrency 256 --num-requests 256 \
  --prompt-len "$PROMPT_LEN" --output-len "$OUTPUT_LEN" --label "async c=256" 2>/dev/null
device_idle "the whole run (ramp-up and down included)" "$dev0" "$(device_times 256)"
stats > "$DIR/stats1.txt"
awk 'FNR == 1 { f++ } { v[f, $1] = $2 }
  END {
    n = v[2, "num_steps_sent:"] - v[1, "num_steps_sent:"]
    k = v[2, "step_serialize_samples:"] - v[1, "step_serialize_samples:"]
    if (n <= 0) { print "  no steps sent"; exit 1 }
    printf "  %d steps, %.1f requests/step (max_steps_in_flight %d)\n", n,
      (v[2, "step_scheduled_reqs_sum:"] - v[1, "step_scheduled_reqs_sum:"]) / n, v[2, "max_steps_in_flight:"]
    ser = 0
    if (k > 0) ser = 1e6 * (v[2, "step_serialize_seconds_sum:"] - v[1, "step_serialize_seconds_sum:"]) / k
    printf "  SchedulerOutput %.0f bytes/step | struct->proto %.2f us/step | serialize %.2f us/step (%d sampled steps)\n",
      (v[2, "step_message_bytes_sum:"] - v[1, "step_message_bytes_sum:"]) / n,
      1e6 * (v[2, "step_to_proto_seconds_sum:"] - v[1, "step_to_proto_seconds_sum:"]) / n, ser, k
  }' "$DIR/stats0.txt" "$DIR/stats1.txt"
echo "== per-step wire messages at 256 running decodes, offline (tandem-wire-bench)"
"$BUILD/tools/cli/tandem-wire-bench" --running 256
