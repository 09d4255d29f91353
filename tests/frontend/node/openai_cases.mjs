// Drives tandem-frontend with the npm `openai` SDK (a client we did not
// write) and prints what it got as JSON, for tests/frontend/frontend_test.cc
// to check against the reference outputs and the gRPC path.
//
//   node openai_cases.mjs BASE_URL REFERENCE_JSON OUT_JSON [API_KEY]
//
// For every case of the reference file: a greedy completion of its prompt
// text, non-streaming and streaming (vLLM's return_token_ids extension for
// the ids), and one chat completion each way.
import fs from "node:fs";
import OpenAI from "openai";

const [baseURL, referencePath, outPath, apiKey] = process.argv.slice(2);
const client = new OpenAI({ baseURL, apiKey: apiKey || "unused", maxRetries: 0 });
const cases = JSON.parse(fs.readFileSync(referencePath, "utf8"));
const models = await client.models.list();
const model = models.data[0].id;

async function streamed(params, kind) {
  const stream = await (kind === "chat"
    ? client.chat.completions.create({ ...params, stream: true, stream_options: { include_usage: true } })
    : client.completions.create({ ...params, stream: true, stream_options: { include_usage: true } }));
  const out = { text: "", token_ids: [], finish_reason: null, usage: null, chunks: 0, roles: [],
                prompt_token_ids: [] };
  for await (const chunk of stream) {
    out.chunks += 1;
    if (chunk.usage) out.usage = chunk.usage;
    // vLLM: with a choice's first chunk, beside the choices (chat) or in it.
    if (chunk.prompt_token_ids) out.prompt_token_ids.push(chunk.prompt_token_ids);
    for (const c of chunk.choices) {
      if (kind === "chat") {
        if (c.delta.role) out.roles.push(c.delta.role);
        out.text += c.delta.content ?? "";
      } else {
        out.text += c.text;
      }
      out.token_ids.push(...(c.token_ids ?? []));
      if (c.prompt_token_ids) out.prompt_token_ids.push(c.prompt_token_ids);
      if (c.finish_reason) out.finish_reason = c.finish_reason;
    }
  }
  return out;
}

const results = { model, cases: [] };
for (const c of cases) {
  const params = { model, prompt: c.prompt_text, max_tokens: c.max_tokens, temperature: 0,
                   return_token_ids: true };
  const full = await client.completions.create(params);
  const choice = full.choices[0];
  results.cases.push({
    nonstream: { text: choice.text, token_ids: choice.token_ids, finish_reason: choice.finish_reason,
                 prompt_token_ids: choice.prompt_token_ids, usage: full.usage },
    stream: await streamed(params, "completion"),
  });
}
const chatParams = { model, messages: [{ role: "user", content: cases[0].prompt_text }],
                     max_tokens: 16, temperature: 0, return_token_ids: true };
const chat = await client.chat.completions.create(chatParams);
results.chat = {
  nonstream: { text: chat.choices[0].message.content, role: chat.choices[0].message.role,
               token_ids: chat.choices[0].token_ids, prompt_token_ids: chat.prompt_token_ids,
               finish_reason: chat.choices[0].finish_reason, usage: chat.usage },
  stream: await streamed(chatParams, "chat"),
};
// The Responses API (client.responses): the same user message as the chat
// request above, read the three ways the SDK offers.
const respParams = { model, input: cases[0].prompt_text, max_output_tokens: 16, temperature: 0 };
const resp = await client.responses.create(respParams);
const events = [];
let deltas = "";
let last = null;
for await (const ev of await client.responses.create({ ...respParams, stream: true })) {
  events.push({ type: ev.type, sequence_number: ev.sequence_number, item_id: ev.item_id ?? null });
  if (ev.type === "response.output_text.delta") deltas += ev.delta;
  if (ev.response) last = ev.response;
}
const helper = await client.responses.stream(respParams).finalResponse();
const cut = await client.responses.create({ ...respParams, max_output_tokens: 2 });
const parts = await client.responses.create({
  ...respParams,
  input: [{ role: "user", content: [{ type: "input_text", text: cases[0].prompt_text }] }],
});
let refused = null;
try {
  await client.responses.create({ ...respParams, tools: [{ type: "web_search" }] });
} catch (e) {
  refused = { status: e.status, param: e.param ?? e.error?.param ?? null };
}
// Logprobs where include asks for them, beside chat's for the same message.
const lpParams = { ...respParams, max_output_tokens: 4, include: ["message.output_text.logprobs"],
                   top_logprobs: 2 };
const lpChat = await client.chat.completions.create({
  model, messages: [{ role: "user", content: cases[0].prompt_text }], max_tokens: 4,
  temperature: 0, logprobs: true, top_logprobs: 2 });
const lpWhole = await client.responses.create(lpParams);
const lpStream = [];
for await (const ev of await client.responses.create({ ...lpParams, stream: true })) {
  if (ev.type === "response.output_text.delta") lpStream.push(...ev.logprobs);
}
const itemText = (r) => r.output.flatMap((o) => o.content ?? []).map((c) => c.text).join("");
results.responses = {
  nonstream: { object: resp.object, id: resp.id, status: resp.status, output_text: resp.output_text,
               item_text: itemText(resp), model: resp.model, usage: resp.usage,
               message_id: resp.output[0]?.id ?? null },
  stream: { events, deltas, final_text: last ? itemText(last) : null,
            final_status: last?.status ?? null, usage: last?.usage ?? null,
            message_id: last?.output[0]?.id ?? null },
  helper: { text: itemText(helper), status: helper.status },
  cut: { status: cut.status, incomplete_details: cut.incomplete_details, usage: cut.usage,
         text: itemText(cut) },
  parts: { text: itemText(parts) },
  refused,
  logprobs: { chat: lpChat.choices[0].logprobs.content, whole: lpWhole.output[0].content[0].logprobs,
              stream: lpStream },
};
fs.writeFileSync(outPath, JSON.stringify(results, null, 1));
console.log(`openai_cases: ${cases.length} cases, model ${model}`);
