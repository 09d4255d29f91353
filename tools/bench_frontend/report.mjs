// Final tables of tools/bench_frontend/run.sh: reads the per-run JSON files it
// left in OUT_DIR and writes OUT_DIR/results.json.
//   node report.mjs OUT_DIR REPEATS CONCURRENCY...
// Per concurrency C and repeat R (1..REPEATS), OUT_DIR holds
// grpc-C-R.json (`tandem bench --json`), http-C-R.json (`tandem bench --http --json` or loadgen.mjs --json)
// and usage-{grpc,http}-C-R.json (CPU seconds of each process, machine-wide
// busy CPU, worker steps during that run). Figures are medians over the
// repeats; ratio and TTFT difference are medians of the per-repeat pairs
// (gRPC and HTTP run back to back). OUT_DIR/tokenizer.jsonl (optional):
// bench_tokenizer and bench_tokenizers_js.mjs lines.
import fs from "node:fs";
import path from "node:path";

const [outDir, repeatsArg, ...levels] = process.argv.slice(2);
const repeats = Number(repeatsArg);
const read = (name) => JSON.parse(fs.readFileSync(path.join(outDir, name), "utf8"));
const meta = fs.existsSync(path.join(outDir, "meta.json")) ? read("meta.json") : {};
const TTFT_BUDGET_MS = 0.5, THROUGHPUT_FLOOR = 0.95;  // issue 17's targets

const median = (v) => {
  const s = [...v].sort((a, b) => a - b), m = s.length >> 1;
  return s.length % 2 ? s[m] : (s[m - 1] + s[m]) / 2;
};
const reps = (fn) => Array.from({ length: repeats }, (_, i) => fn(i + 1));

const rows = levels.map((c) => {
  const runs = reps((r) => {
    const grpc = read(`grpc-${c}-${r}.json`), http = read(`http-${c}-${r}.json`);
    const usage = { grpc: read(`usage-grpc-${c}-${r}.json`), http: read(`usage-http-${c}-${r}.json`) };
    return { grpc, http, usage,
             ratio: http.output_tokens_per_s / grpc.output_tokens_per_s,
             ttft_delta_ms: http.p50_ttft_ms - grpc.p50_ttft_ms,
             fe_us_per_token: (1e6 * usage.http.frontend_cpu_s) / http.output_tokens };
  });
  const med = (fn) => median(runs.map(fn));
  const ratios = runs.map((x) => x.ratio), deltas = runs.map((x) => x.ttft_delta_ms);
  const r = {
    concurrency: Number(c), num_requests: runs[0].grpc.num_requests, repeats,
    grpc_tok_s: med((x) => x.grpc.output_tokens_per_s), http_tok_s: med((x) => x.http.output_tokens_per_s),
    throughput_ratio: median(ratios), throughput_ratio_min: Math.min(...ratios), throughput_ratio_max: Math.max(...ratios),
    grpc_p50_ttft_ms: med((x) => x.grpc.p50_ttft_ms), http_p50_ttft_ms: med((x) => x.http.p50_ttft_ms),
    p50_ttft_delta_ms: median(deltas), p50_ttft_delta_min_ms: Math.min(...deltas), p50_ttft_delta_max_ms: Math.max(...deltas),
    grpc_p99_ttft_ms: med((x) => x.grpc.p99_ttft_ms), http_p99_ttft_ms: med((x) => x.http.p99_ttft_ms),
    grpc_p50_itl_ms: med((x) => x.grpc.p50_itl_ms), http_p50_itl_ms: med((x) => x.http.p50_itl_ms),
    frontend_cpu_us_per_token: med((x) => x.fe_us_per_token),
    http_failed: runs.reduce((n, x) => n + x.http.failed, 0),
    http_wrong_token_count: runs.reduce((n, x) => n + x.http.wrong_token_count, 0),
    grpc_failed: runs.reduce((n, x) => n + x.grpc.failed, 0),
    http_first_error: runs.map((x) => x.http.first_error).find((e) => e) || "",
    runs,
  };
  r.meets_throughput_target = r.throughput_ratio >= THROUGHPUT_FLOOR;
  r.meets_ttft_target = r.p50_ttft_delta_ms <= TTFT_BUDGET_MS;
  return r;
});

const f = (x, d = 2) => (x === undefined || Number.isNaN(x) ? "-" : x.toFixed(d));
const pad = (s, w) => String(s).padStart(w);
const table = (cols, data) => {
  console.log(cols.map(([n, w]) => pad(n, w)).join(" "));
  for (const d of data) console.log(d.map((v, i) => pad(v, cols[i][1])).join(" "));
};

console.log(`== tandem-frontend (HTTP) vs direct gRPC: medians of ${repeats} back-to-back pair(s); ` +
            "TTFT, ITL: p50 in ms; FE = frontend CPU per generated token");
table([["C", 5], ["requests", 9], ["gRPC tok/s", 11], ["HTTP tok/s", 11], ["ratio", 6], ["gRPC TTFT", 10],
       ["HTTP TTFT", 10], ["dTTFT", 8], ["gRPC ITL", 9], ["HTTP ITL", 9], ["FE us/tok", 10]],
      rows.map((r) => [r.concurrency, r.num_requests, f(r.grpc_tok_s, 0), f(r.http_tok_s, 0), f(r.throughput_ratio, 3),
                       f(r.grpc_p50_ttft_ms), f(r.http_p50_ttft_ms), f(r.p50_ttft_delta_ms), f(r.grpc_p50_itl_ms),
                       f(r.http_p50_itl_ms), f(r.frontend_cpu_us_per_token, 1)]));
for (const r of rows) {
  console.log(`  C=${r.concurrency}: throughput ratio ${f(r.throughput_ratio, 3)} ` +
              `[${f(r.throughput_ratio_min, 3)}..${f(r.throughput_ratio_max, 3)}] (target >= ${THROUGHPUT_FLOOR}: ` +
              `${r.meets_throughput_target ? "met" : "MISSED"}); p50 TTFT ${r.p50_ttft_delta_ms >= 0 ? "+" : ""}` +
              `${f(r.p50_ttft_delta_ms)} ms [${f(r.p50_ttft_delta_min_ms)}..${f(r.p50_ttft_delta_max_ms)}] ` +
              `(target <= +${TTFT_BUDGET_MS} ms: ${r.meets_ttft_target ? "met" : "MISSED"})` +
              (r.http_failed || r.http_wrong_token_count || r.grpc_failed
                ? `; FAILURES: HTTP ${r.http_failed} failed, ${r.http_wrong_token_count} with a wrong token count ` +
                  `(${r.http_first_error}); gRPC ${r.grpc_failed} failed` : ""));
}

// Where the CPU went (medians): on a small machine the HTTP path's extra
// processes (frontend, Node client) compete with the worker for cores;
// "other" is busy CPU of processes not in this benchmark.
console.log(`== CPU during the runs, in cores (CPU s / wall s; ${meta.cpus ?? "?"} CPUs), and worker steps`);
const usageRow = (r, p) => {
  const m = (fn) => median(r.runs.map((x) => fn(x.usage[p])));
  const cores = (k) => m((u) => u[k] / u.wall_s);
  const ours = (u) => u.worker_cpu_s + u.scheduler_cpu_s + u.frontend_cpu_s + u.client_cpu_s;
  return [`${p} c=${r.concurrency}`, f(m((u) => u.wall_s)), f(cores("worker_cpu_s")), f(cores("scheduler_cpu_s")),
          f(cores("frontend_cpu_s")), f(cores("client_cpu_s")), f(m((u) => ours(u) / u.wall_s)),
          f(m((u) => Math.max(0, u.machine_busy_s - ours(u)) / u.wall_s)), f(m((u) => u.worker_steps), 0),
          f(m((u) => (u.worker_steps ? (1e3 * u.worker_busy_s) / u.worker_steps : 0))),
          f(m((u) => (100 * u.worker_busy_s) / u.wall_s), 1),
          f(m((u) => (u.scheduler_outputs ? (1e3 * u.scheduler_output_sum_s) / u.scheduler_outputs : NaN)), 3),
          f(m((u) => (u.scheduler_schedules ? (1e3 * u.scheduler_schedule_sum_s) / u.scheduler_schedules : NaN)), 3)];
};
// "out ms": the scheduler's loop per worker output (its tokens handed to the
// streams); "sched ms": per Schedule(). With async scheduling the worker
// idles when these two and the send outlast its step.
table([["run", 10], ["wall s", 7], ["worker", 7], ["sched", 6], ["frontend", 9], ["client", 7], ["ours", 5],
       ["other", 6], ["steps", 6], ["step ms", 8], ["busy %", 7], ["out ms", 7], ["sched ms", 9]],
      rows.flatMap((r) => [usageRow(r, "grpc"), usageRow(r, "http")]));
const busy = rows.flatMap((r) => r.runs.flatMap((x) => [x.usage.grpc, x.usage.http].map((u) =>
  Math.max(0, u.machine_busy_s - u.worker_cpu_s - u.scheduler_cpu_s - u.frontend_cpu_s - u.client_cpu_s) / u.wall_s)));
if (Math.max(...busy) > 0.3) {
  console.log(`  WARNING: other processes used up to ${f(Math.max(...busy))} cores during the runs: figures are disturbed`);
}

// The frontend's threads and resident memory at their peak during the HTTP
// runs (sampled every 0.1 s): bounded, whatever the number of streams.
console.log("== tandem-frontend at its peak during the HTTP runs (largest over the repeats)");
table([["C", 5], ["threads", 8], ["RSS MiB", 8]],
      rows.map((r) => [r.concurrency, Math.max(...r.runs.map((x) => x.usage.http.frontend_peak_threads ?? NaN)),
                       f(Math.max(...r.runs.map((x) => (x.usage.http.frontend_peak_rss_kib ?? NaN) / 1024)), 1)]));

// Mean TTFT seen by the client, the frontend and the scheduler (their
// /metrics histograms, summed over each run): the differences split the added
// TTFT into the hop above the frontend (client, HTTP) and the frontend itself
// (arrival to first token written, less the scheduler's own TTFT).
console.log("== mean TTFT (ms) where each component sees it (medians over the repeats)");
const ttftRow = (r, p) => {
  const m = (fn) => median(r.runs.map(fn));
  const sched = (x) => (1e3 * x.usage[p].scheduler_ttft_sum_s) / x.usage[p].scheduler_ttft_count;
  const fe = (x) => (1e3 * x.usage.http.frontend_ttft_sum_s) / x.usage.http.frontend_ttft_count;
  const http = (fn) => (p === "http" ? m(fn) : NaN);
  return [`${p} c=${r.concurrency}`, f(m((x) => x[p].mean_ttft_ms)), f(http(fe)), f(m(sched)),
          f(http((x) => x.http.mean_ttft_ms - fe(x))), f(http((x) => fe(x) - sched(x))),
          f(m((x) => x[p].mean_ttft_ms - sched(x))), f(http((x) => x.http.loadgen_loop_delay_p99_ms))];
};
// "LG loop p99": loadgen.mjs's event-loop delay; when it is large the
// client-FE column is partly the client's own lateness.
table([["run", 10], ["client", 8], ["frontend", 9], ["sched", 8], ["client-FE", 10], ["FE-sched", 9], ["client-sched", 13],
       ["LG loop p99", 12]],
      rows.flatMap((r) => [ttftRow(r, "grpc"), ttftRow(r, "http")]));

let tokenizer = null;
const tokPath = path.join(outDir, "tokenizer.jsonl");
if (fs.existsSync(tokPath)) {
  const lines = fs.readFileSync(tokPath, "utf8").split("\n").filter((l) => l.startsWith("{")).map((l) => JSON.parse(l));
  const byName = {};
  for (const l of lines) (byName[path.basename(l.tokenizer)] ||= {})[l.impl] = l;
  tokenizer = Object.entries(byName).map(([name, v]) => ({
    tokenizer: name, corpus_bytes: (v.tandem || v["tokenizers.js"]).corpus_bytes,
    tandem_encode_mb_s: v.tandem?.encode_mb_s, js_encode_mb_s: v["tokenizers.js"]?.encode_mb_s,
    tandem_decode_mb_s: v.tandem?.decode_mb_s, js_decode_mb_s: v["tokenizers.js"]?.decode_mb_s,
  }));
  const x = (a, b) => (a && b ? f(a / b, 1) : "-");
  console.log("== tokenizer MB/s, tests/tokenizer/data/corpus.json, one thread: tandem vs @huggingface/tokenizers (js)");
  table([["tokenizer", 10], ["enc tandem", 11], ["enc js", 8], ["x", 5], ["dec tandem", 11], ["dec js", 8], ["x", 5]],
        tokenizer.map((t) => [t.tokenizer, f(t.tandem_encode_mb_s), f(t.js_encode_mb_s),
                              x(t.tandem_encode_mb_s, t.js_encode_mb_s), f(t.tandem_decode_mb_s), f(t.js_decode_mb_s),
                              x(t.tandem_decode_mb_s, t.js_decode_mb_s)]));
}

fs.writeFileSync(path.join(outDir, "results.json"),
                 JSON.stringify({ ...meta, serving: rows, tokenizer }, null, 1) + "\n");
