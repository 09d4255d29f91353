// OpenAI-HTTP load generator for tandem-frontend (issue 17): closed-loop
// streaming /v1/completions at a fixed concurrency, measured the way
// `tandem bench` measures the direct gRPC path (tools/cli/main.cc), so the
// two can be compared line by line:
//   - prompt: BOS (1) then random token ids, prompt-len in all;
//   - TTFT: request start -> first SSE chunk carrying a token;
//   - ITL: gap between token-carrying chunks, divided by the tokens in the
//     chunk (return_token_ids gives the count), one sample per token;
//   - throughput: usage.completion_tokens summed / wall time.
// Node 20, no npm packages:
//   node loadgen.mjs --url http://127.0.0.1:PORT --concurrency C --num-requests N
//        [--prompt-len 64] [--output-len 64] [--seed 0] [--client http|fetch]
//        [--json PATH] [--label TEXT]
// --client http (default) uses node:http with a keep-alive agent; fetch uses
// the global fetch (undici), which costs more client CPU per chunk.
import fs from "node:fs";
import http from "node:http";
import { monitorEventLoopDelay } from "node:perf_hooks";

const args = { url: "", concurrency: 64, "num-requests": 256, "prompt-len": 64, "output-len": 64,
               seed: 0, client: "http", json: "", label: "" };
for (let i = 2; i < process.argv.length; i += 2) {
  const key = process.argv[i].replace(/^--/, "");
  if (!(key in args) || i + 1 >= process.argv.length) {
    console.error(`loadgen: unknown or incomplete flag ${process.argv[i]}`);
    process.exit(2);
  }
  args[key] = typeof args[key] === "number" ? Number(process.argv[i + 1]) : process.argv[i + 1];
}
const C = args.concurrency, N = args["num-requests"];
const PROMPT_LEN = args["prompt-len"], OUTPUT_LEN = args["output-len"];
if (!args.url || !(C >= 1 && N >= 1 && PROMPT_LEN >= 1 && OUTPUT_LEN >= 1)) {
  console.error("loadgen: need --url and positive --concurrency, --num-requests, --prompt-len, --output-len");
  process.exit(2);
}
const url = new URL("/v1/completions", args.url);

// Deterministic prompts (mulberry32), token ids in 3..511 (stories260K has a
// vocabulary of 512; 0-2 are unk/BOS/EOS).
let state = (args.seed >>> 0) + 0x9e3779b9;
function rand() {
  state = (state + 0x6d2b79f5) >>> 0;
  let t = state;
  t = Math.imul(t ^ (t >>> 15), t | 1);
  t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
  return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
}
const bodies = [];
for (let i = 0; i < N; ++i) {
  const prompt = [1];
  while (prompt.length < PROMPT_LEN) prompt.push(3 + Math.floor(rand() * 509));
  bodies.push(JSON.stringify({ prompt, max_tokens: OUTPUT_LEN, temperature: 0, ignore_eos: true,
                               stream: true, stream_options: { include_usage: true },
                               return_token_ids: true }));
}

// One request's measurements, fed one SSE `data:` payload at a time.
class Stream {
  constructor(start) {
    this.start = start; this.last = start; this.ttft = -1; this.itl = [];
    this.tokens = 0; this.usageTokens = -1; this.done = false; this.error = "";
  }
  onData(payload, now) {
    if (payload === "[DONE]") { this.done = true; return; }
    const msg = JSON.parse(payload);
    if (msg.error) { this.error ||= JSON.stringify(msg.error); return; }
    if (msg.usage) this.usageTokens = msg.usage.completion_tokens;
    const choice = msg.choices && msg.choices[0];
    if (!choice) return;
    const k = choice.token_ids ? choice.token_ids.length : (choice.text ? 1 : 0);
    if (k === 0) return;
    if (this.ttft < 0) {
      this.ttft = now - this.start;
      for (let j = 1; j < k; ++j) this.itl.push(0);
    } else {
      const gap = (now - this.last) / k;
      for (let j = 0; j < k; ++j) this.itl.push(gap);
    }
    this.last = now;
    this.tokens += k;
  }
}

// Splits a byte stream into SSE events and hands each `data:` line on.
function sseParser(stream) {
  let buf = "";
  return (text) => {
    buf += text;
    let end;
    while ((end = buf.indexOf("\n\n")) >= 0) {
      const event = buf.slice(0, end);
      buf = buf.slice(end + 2);
      const now = performance.now();
      for (const line of event.split("\n")) {
        if (line.startsWith("data:")) stream.onData(line.slice(5).trim(), now);
      }
    }
  };
}

const agent = new http.Agent({ keepAlive: true, maxSockets: C });

function sendHttp(body) {
  const stream = new Stream(performance.now());
  return new Promise((resolve) => {
    const req = http.request(url, { method: "POST", agent,
      headers: { "Content-Type": "application/json", "Content-Length": Buffer.byteLength(body) } },
    (res) => {
      res.setEncoding("utf8");
      if (res.statusCode !== 200) {
        let text = "";
        res.on("data", (d) => { text += d; });
        res.on("end", () => { stream.error = `HTTP ${res.statusCode}: ${text.slice(0, 200)}`; resolve(stream); });
        return;
      }
      const feed = sseParser(stream);
      res.on("data", feed);
      res.on("end", () => resolve(stream));
      res.on("error", (e) => { stream.error ||= String(e); resolve(stream); });
    });
    req.on("error", (e) => { stream.error ||= String(e); resolve(stream); });
    req.end(body);
  });
}

async function sendFetch(body) {
  const stream = new Stream(performance.now());
  try {
    const res = await fetch(url, { method: "POST", body, headers: { "Content-Type": "application/json" } });
    if (res.status !== 200) {
      stream.error = `HTTP ${res.status}: ${(await res.text()).slice(0, 200)}`;
      return stream;
    }
    const feed = sseParser(stream);
    const decoder = new TextDecoder();
    for await (const chunk of res.body) feed(decoder.decode(chunk, { stream: true }));
  } catch (e) {
    stream.error ||= String(e);
  }
  return stream;
}

function percentile(v, p) {  // as tools/cli/main.cc: linear between ranks
  if (v.length === 0) return 0;
  const s = Float64Array.from(v).sort();
  const rank = (p / 100) * (s.length - 1), lo = Math.floor(rank), hi = Math.min(lo + 1, s.length - 1);
  return s[lo] + (s[hi] - s[lo]) * (rank - lo);
}

const send = args.client === "fetch" ? sendFetch : sendHttp;
const ttft = [], itl = [], e2e = [];
let outputTokens = 0, failed = 0, short = 0, firstError = "";
// Event-loop delay: how late this one thread runs callbacks; tens of ms
// means the timestamps (and so TTFT/ITL) carry the client's own lag.
const loopDelay = monitorEventLoopDelay({ resolution: 1 });
loopDelay.enable();
const cpu0 = process.cpuUsage();
const t0 = performance.now();
let next = 0;
async function lane() {  // closed loop: one request after another
  for (let i; (i = next++) < N;) {
    const s = await send(bodies[i]);
    const end = performance.now();
    // Tokens: the server's usage count; what the chunks carried otherwise.
    const tokens = s.usageTokens >= 0 ? s.usageTokens : s.tokens;
    outputTokens += tokens;
    if (!s.error && !s.done) s.error = "stream ended without [DONE]";
    if (s.error) {
      ++failed;
      firstError ||= s.error;
      continue;
    }
    if (tokens !== OUTPUT_LEN || s.tokens !== OUTPUT_LEN) {
      ++short;
      firstError ||= `request ${i}: usage ${s.usageTokens}, chunks carried ${s.tokens}, expected ${OUTPUT_LEN}`;
    }
    if (s.ttft >= 0) ttft.push(s.ttft);
    itl.push(...s.itl);
    e2e.push(end - s.start);
  }
}
await Promise.all(Array.from({ length: Math.min(C, N) }, lane));
const wall = (performance.now() - t0) / 1000;
const cpu = process.cpuUsage(cpu0);
loopDelay.disable();
agent.destroy();

const result = {
  label: args.label, client: args.client, concurrency: C, num_requests: N, failed,
  wrong_token_count: short, prompt_len: PROMPT_LEN, output_len: OUTPUT_LEN, duration_s: wall,
  output_tokens: outputTokens, output_tokens_per_s: outputTokens / wall,
  requests_per_s: (N - failed) / wall,
  mean_ttft_ms: ttft.reduce((a, b) => a + b, 0) / Math.max(ttft.length, 1), p50_ttft_ms: percentile(ttft, 50), p90_ttft_ms: percentile(ttft, 90), p99_ttft_ms: percentile(ttft, 99),
  p50_itl_ms: percentile(itl, 50), p90_itl_ms: percentile(itl, 90), p99_itl_ms: percentile(itl, 99),
  p50_e2e_ms: percentile(e2e, 50), p99_e2e_ms: percentile(e2e, 99),
  // The generator's own CPU share: near 1.0 means Node's one thread, not the
  // frontend, may be what limits the HTTP figures.
  loadgen_cpu_s: (cpu.user + cpu.system) / 1e6,
  loadgen_cpu_share: (cpu.user + cpu.system) / 1e6 / wall,
  loadgen_loop_delay_p50_ms: loopDelay.percentile(50) / 1e6, loadgen_loop_delay_p99_ms: loopDelay.percentile(99) / 1e6,
  loadgen_loop_delay_max_ms: loopDelay.max / 1e6,
  first_error: firstError,
};
console.log(`${args.label ? `[${args.label}] ` : ""}concurrency=${C} requests=${N} failed=${failed} ` +
            `wrong_token_count=${short} prompt_len=${PROMPT_LEN} output_len=${OUTPUT_LEN} client=${args.client}`);
console.log(`  duration ${wall.toFixed(2)} s | output ${result.output_tokens_per_s.toFixed(1)} tok/s | ` +
            `loadgen CPU ${(100 * result.loadgen_cpu_share).toFixed(0)}% of one core, event-loop delay ` +
            `p50 ${result.loadgen_loop_delay_p50_ms.toFixed(2)} p99 ${result.loadgen_loop_delay_p99_ms.toFixed(2)} ms`);
console.log(`  TTFT ms p50 ${result.p50_ttft_ms.toFixed(2)} p99 ${result.p99_ttft_ms.toFixed(2)} | ` +
            `ITL ms p50 ${result.p50_itl_ms.toFixed(2)} p99 ${result.p99_itl_ms.toFixed(2)}`);
if (firstError) console.log(`  first error: ${firstError}`);
if (args.json) fs.writeFileSync(args.json, JSON.stringify(result) + "\n");
process.exit(failed === 0 ? 0 : 1);
