#!/usr/bin/env bash
# The main job: builds (if needed), starts tandem-kvstore, tandem-worker and
# tandem-scheduler on loopback, waits until they serve, sends a few requests
# with the `tandem` client, prints the results, shows a second replica
# getting a long shared prefix from the KV-store instead of recomputing it,
# then serves a text model over OpenAI HTTP with `tandem serve` (worker,
# scheduler and tandem-frontend in one command, as `vllm serve`) and shows a
# curl completion and a streamed chat completion, and stops the processes
# cleanly.
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
  cmake --build "$BUILD" -j"$JOBS" --target tandem-worker tandem-scheduler tandem-kvstore tandem-frontend tandem tandem-make-random-model
fi
WORKER="$BUILD/services/worker/tandem-worker"
SCHEDULER="$BUILD/services/scheduler/tandem-scheduler"
KVSTORE="$BUILD/services/kvstore/tandem-kvstore"
FRONTEND="$BUILD/services/frontend/tandem-frontend"
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

echo "== starting tandem-kvstore (data $RUN_DIR/kvstore)"
"$KVSTORE" --data-dir "$RUN_DIR/kvstore" --listen 127.0.0.1:0 --port-file "$RUN_DIR/kvstore.port" \
  --local-socket "$RUN_DIR/kvstore.sock" \
  > "$RUN_DIR/kvstore.log" 2>&1 &
PIDS+=($!)
KVADDR="127.0.0.1:$(wait_port "$RUN_DIR/kvstore.port" "${PIDS[0]}" kvstore)"
echo "== starting tandem-worker ($MODEL, --kvstore $KVADDR)"
"$WORKER" --model "$MODEL" --listen 127.0.0.1:0 --port-file "$RUN_DIR/worker.port" \
  --kvstore "$KVADDR" > "$RUN_DIR/worker.log" 2>&1 &
PIDS+=($!)
WPORT="$(wait_port "$RUN_DIR/worker.port" "${PIDS[1]}" worker)"
echo "== starting tandem-scheduler (worker 127.0.0.1:$WPORT, --kvstore $KVADDR)"
"$SCHEDULER" --worker "127.0.0.1:$WPORT" --listen 127.0.0.1:0 --port-file "$RUN_DIR/scheduler.port" \
  --kvstore "$KVADDR" > "$RUN_DIR/scheduler.log" 2>&1 &
PIDS+=($!)
SPORT="$(wait_port "$RUN_DIR/scheduler.port" "${PIDS[2]}" scheduler)"
SERVER="127.0.0.1:$SPORT"
for _ in $(seq 1 300); do
  "$CLI" info --server "$SERVER" > "$RUN_DIR/info.txt" 2>/dev/null && break
  sleep 0.1
done
echo "== serving on $SERVER"
grep -ho "metrics on http://[^ ]*" "$RUN_DIR/kvstore.log" "$RUN_DIR/worker.log" "$RUN_DIR/scheduler.log" \
  | sed 's/^/   /' || true
sed 's/^/   /' "$RUN_DIR/info.txt"

echo "== tandem generate --prompt 1 --max-tokens 32 (greedy; llama2.c's reference starts 461 461 401 401 401)"
"$CLI" generate --server "$SERVER" --prompt 1 --max-tokens 32
echo "== tandem generate --prompt 1,403,407,261 --n 3 --temperature 0.8 --seed 7 (same seed, same tokens)"
"$CLI" generate --server "$SERVER" --prompt 1,403,407,261 --max-tokens 24 --n 3 --temperature 0.8 --seed 7
echo "== tandem bench: 64 requests, 16 concurrent, 32-token shared prefix"
"$CLI" bench --server "$SERVER" --concurrency 16 --num-requests 64 --prompt-len 48 --output-len 32 \
  --shared-prefix-len 32
echo "== KV-store: a 200-token prompt on this replica computes its blocks and stores them"
PREFIX="1$(for i in $(seq 2 192); do printf ',%d' $(( (i * 37) % 509 + 2 )); done)"
"$CLI" generate --server "$SERVER" --prompt "$PREFIX,11,12,13,14,15,16,17,18" --max-tokens 8
echo "== a second replica (its own worker and scheduler, same KV-store) gets the same 192-token"
echo "   prefix with another suffix: cached_external=192 means it was loaded, not recomputed"
"$WORKER" --model "$MODEL" --listen 127.0.0.1:0 --port-file "$RUN_DIR/worker2.port" \
  --kvstore "$KVADDR" > "$RUN_DIR/worker2.log" 2>&1 &
PIDS+=($!)
W2PORT="$(wait_port "$RUN_DIR/worker2.port" "${PIDS[3]}" worker2)"
"$SCHEDULER" --worker "127.0.0.1:$W2PORT" --listen 127.0.0.1:0 --port-file "$RUN_DIR/scheduler2.port" \
  --kvstore "$KVADDR" > "$RUN_DIR/scheduler2.log" 2>&1 &
PIDS+=($!)
SERVER2="127.0.0.1:$(wait_port "$RUN_DIR/scheduler2.port" "${PIDS[4]}" scheduler2)"
for _ in $(seq 1 300); do "$CLI" info --server "$SERVER2" > /dev/null 2>&1 && break; sleep 0.1; done
"$CLI" generate --server "$SERVER2" --prompt "$PREFIX,21,22,23,24,25,26,27,28" --max-tokens 8
"$CLI" stats --server "$SERVER2" | grep -E 'external' | sed 's/^/   /'
echo "== KV-store counters from its /metrics (lookups and loads over its bulk port)"
KVMETRICS="$(grep -ho "http://[^ ]*/metrics" "$RUN_DIR/kvstore.log" | head -1)"
curl -s "$KVMETRICS" | grep -E '^tandem_kvstore_(lookups|bulk_lookups|bulk_loads|blocks_stored|blocks_loaded)_total' \
  | sed 's/^/   /' || true
# The OpenAI front door. stories260K has no tokenizer, so this part serves
# random32k (random weights, Llama 2's 32k vocabulary and tokenizer): the
# text is gibberish, but every byte of it went through the real path.
TEXT_MODEL="$ROOT/../shared/models/random32k.bin"
TOKENIZER="$ROOT/../shared/models/tokenizer.model"
if [ -f "$TEXT_MODEL" ] && [ -f "$TOKENIZER" ]; then
  echo "== tandem serve (as \`vllm serve\`): worker, scheduler and OpenAI frontend for random32k.bin"
  API_PORT="$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
  echo "   $CLI serve $TEXT_MODEL --tokenizer $TOKENIZER --chat-template llama-2 --host 127.0.0.1 --port $API_PORT"
  "$CLI" serve "$TEXT_MODEL" --tokenizer "$TOKENIZER" --chat-template llama-2 \
    --host 127.0.0.1 --port "$API_PORT" > "$RUN_DIR/serve.out" 2> "$RUN_DIR/serve.log" &
  PIDS+=($!)
  for _ in $(seq 1 600); do
    grep -q '^serving' "$RUN_DIR/serve.out" && break
    kill -0 "${PIDS[5]}" 2>/dev/null || { echo "tandem serve exited early; log:" >&2; cat "$RUN_DIR/serve.log" >&2; exit 1; }
    sleep 0.1
  done
  HTTP="http://127.0.0.1:$API_PORT"
  for _ in $(seq 1 300); do curl -sf "$HTTP/health" > /dev/null && break; sleep 0.1; done
  echo "   curl $HTTP/v1/completions -d '{\"prompt\": \"Once upon a time\", \"max_tokens\": 12, \"temperature\": 0}'"
  curl -s "$HTTP/v1/completions" -H 'Content-Type: application/json' \
    -d '{"prompt": "Once upon a time", "max_tokens": 12, "temperature": 0}' | sed 's/^/   /'
  echo
  echo "   a streamed chat completion (SSE; the text deltas joined):"
  curl -sN "$HTTP/v1/chat/completions" -H 'Content-Type: application/json' \
    -d '{"messages": [{"role": "user", "content": "Tell me a story"}], "max_tokens": 12,
         "temperature": 0, "stream": true}' \
    | sed -n 's/^data: //p' | grep -v '^\[DONE\]' \
    | python3 -c 'import json,sys; print("   " + "".join(json.loads(l)["choices"][0]["delta"].get("content","") for l in sys.stdin if json.loads(l)["choices"]))'
  echo "   structured outputs (vLLM's structured_outputs.json; response_format json_schema works too):"
  echo "   the answer is one of the schema's values (random32k would fill an object's whitespace)"
  curl -s "$HTTP/v1/chat/completions" -H 'Content-Type: application/json' \
    -d '{"messages": [{"role": "user", "content": "Is it raining?"}], "max_tokens": 20,
         "structured_outputs": {"json": {"enum": ["yes", "no", "maybe"]}}}' \
    | python3 -c 'import json,sys; c=json.load(sys.stdin)["choices"][0]; print("   " + c["message"]["content"] + "   (finish_reason " + c["finish_reason"] + ")")'
  echo "   (tandem serve's log, its parts' included: $RUN_DIR/serve.log; the frontend's metrics: $HTTP/metrics)"
else
  echo "== (../shared/models/random32k.bin or tokenizer.model missing: no frontend demo)"
fi
echo "== scheduler stats"
"$CLI" stats --server "$SERVER" | sed 's/^/   /'
echo "== worth opening while it runs (Prometheus text):"
grep -ho "http://[^ ]*/metrics" "$RUN_DIR/scheduler.log" "$RUN_DIR/worker.log" "$RUN_DIR/kvstore.log" \
  | sed 's/^/   /' || true
echo "== logs: $RUN_DIR/{kvstore,worker,scheduler,worker2,scheduler2}.log"
echo "   debug with grpcurl: grpcurl -plaintext $SERVER list   (reflection is on)"
cleanup
PIDS=()
echo "== stopped cleanly"
tail -n 3 "$RUN_DIR/scheduler.log" | sed 's/^/   /'
