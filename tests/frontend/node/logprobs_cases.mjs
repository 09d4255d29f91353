// Drives tandem-frontend's logprobs with the npm `openai` SDK (a client we did
// not write) and prints what it got as JSON, for
// tests/frontend/logprobs_test.cc to check against the fake scheduler's.
//
//   node logprobs_cases.mjs BASE_URL OUT_JSON
//
// Each case is run non-streaming (the response) and, where streaming is
// allowed, streaming (every chunk's choice, in order).
import fs from "node:fs";
import OpenAI from "openai";

const [baseURL, outPath] = process.argv.slice(2);
const client = new OpenAI({ baseURL, apiKey: "unused", maxRetries: 0 });
const model = (await client.models.list()).data[0].id;
const prompt = "Once upon a time";
const messages = [{ role: "user", content: prompt }];

async function chunks(stream) {
  const out = [];
  for await (const chunk of stream) {
    for (const c of chunk.choices) out.push(c);
  }
  return out;
}

async function completion(params) {
  const full = { model, prompt, temperature: 0, return_token_ids: true, ...params };
  const result = { nonstream: await client.completions.create(full) };
  if (!("prompt_logprobs" in params)) {
    result.stream = await chunks(await client.completions.create({ ...full, stream: true }));
  }
  return result;
}

async function chat(params) {
  const full = { model, messages, temperature: 0, return_token_ids: true, ...params };
  const result = { nonstream: await client.chat.completions.create(full) };
  if (!("prompt_logprobs" in params)) {
    result.stream = await chunks(await client.chat.completions.create({ ...full, stream: true }));
  }
  return result;
}

const results = {
  completion: await completion({ max_tokens: 16, logprobs: 2 }),
  // lm-evaluation-harness's loglikelihood request.
  echo: await completion({ max_tokens: 1, logprobs: 1, echo: true }),
  stop: await completion({ max_tokens: 16, logprobs: 2, stop: ["."] }),
  prompt_logprobs: await completion({ max_tokens: 16, prompt_logprobs: 2 }),
  chat: await chat({ max_tokens: 16, logprobs: true, top_logprobs: 2 }),
  chat_prompt_logprobs: await chat({ max_tokens: 16, prompt_logprobs: 1 }),
};
fs.writeFileSync(outPath, JSON.stringify(results, null, 1));
