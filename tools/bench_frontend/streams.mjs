// N concurrent SSE streams through tandem-frontend (issue 17: bounded threads
// and memory); samples its threads and RSS while they are all open.
//   node tools/bench_frontend/streams.mjs http://127.0.0.1:PORT 1000 64 $(pgrep -f tandem-frontend)
import fs from "node:fs";
const [url, n, maxTokens, pid] = [process.argv[2], +process.argv[3], +process.argv[4], process.argv[5]];
const status = () => Object.fromEntries(fs.readFileSync(`/proc/${pid}/status`, "utf8").split("\n")
  .filter(l => /^(Threads|VmRSS|VmHWM):/.test(l)).map(l => l.split(/:\s+/)));
const before = status();
let open = 0, maxOpen = 0, tokens = 0, done = 0, failed = 0, peak = { Threads: 0 };
const sampler = setInterval(() => { const s = status(); if (+s.Threads > +peak.Threads || open === n) peak = s; }, 50);
const t0 = Date.now();
await Promise.all(Array.from({ length: n }, async (_, i) => {
  const prompt = [1, ...Array.from({ length: 31 }, (_, k) => 2 + (i * 31 + k * 7) % 500)];
  const res = await fetch(url + "/v1/completions", { method: "POST", headers: { "Content-Type": "application/json" },
    body: JSON.stringify({ prompt, max_tokens: maxTokens, ignore_eos: true, temperature: 0, stream: true }) });
  if (res.status !== 200) { failed++; return; }
  open++; maxOpen = Math.max(maxOpen, open);
  const reader = res.body.getReader(); const dec = new TextDecoder(); let text = "";
  for (;;) { const { value, done: d } = await reader.read(); if (d) break; text += dec.decode(value, { stream: true }); }
  open--;
  if (text.includes("[DONE]")) done++; else failed++;
  tokens += (text.match(/"finish_reason":null/g) || []).length + 1;
}));
clearInterval(sampler);
const after = status();
console.log(JSON.stringify({ streams: n, completed: done, failed, max_open_at_once: maxOpen, seconds: (Date.now() - t0) / 1000,
  threads_before: +before.Threads, threads_peak: +peak.Threads, rss_before: before.VmRSS, rss_peak_hwm: after.VmHWM, rss_after: after.VmRSS }));
