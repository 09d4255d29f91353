// Drives tandem-frontend with the npm `openai` SDK (a client we did not
// write) on a chat request with tools, for tests/frontend/tools_test.cc:
// the answer's tool calls as the SDK reads them, whole, streamed chunk by
// chunk (accumulated as its docs show), and through its own stream helper,
// which assembles the final message from the deltas; and the same tool
// through the Responses API (client.responses), whole and streamed.
//
//   node tool_call_cases.mjs BASE_URL OUT_JSON
import fs from "node:fs";
import OpenAI from "openai";

const [baseURL, outPath] = process.argv.slice(2);
const client = new OpenAI({ baseURL, apiKey: "unused", maxRetries: 0 });
const params = {
  model: (await client.models.list()).data[0].id,
  messages: [{ role: "user", content: "What is the weather in Paris?" }],
  tools: [{ type: "function", function: { name: "get_weather", description: "Weather of a city",
            parameters: { type: "object", properties: { city: { type: "string" } } } } }],
  max_tokens: 64,
};

const whole = await client.chat.completions.create(params);

const streamed = { content: "", tool_calls: [], finish_reason: null };
for await (const chunk of await client.chat.completions.create({ ...params, stream: true })) {
  for (const c of chunk.choices) {
    streamed.content += c.delta.content ?? "";
    for (const t of c.delta.tool_calls ?? []) {
      const call = (streamed.tool_calls[t.index] ??= { id: "", type: "", function: { name: "", arguments: "" } });
      call.id += t.id ?? "";
      call.type += t.type ?? "";
      call.function.name += t.function?.name ?? "";
      call.function.arguments += t.function?.arguments ?? "";
    }
    if (c.finish_reason) streamed.finish_reason = c.finish_reason;
  }
}

const helper = await client.chat.completions.stream(params).finalChatCompletion();

// The Responses API with the same tool: function_call items, whole and
// assembled by the SDK's stream helper from the events.
const responsesParams = {
  model: params.model,
  input: params.messages[0].content,
  tools: params.tools.map((t) => ({ type: "function", ...t.function })),
  max_output_tokens: 64,
};
const responsesWhole = await client.responses.create(responsesParams);
const responsesHelper = await client.responses.stream(responsesParams).finalResponse();

fs.writeFileSync(outPath, JSON.stringify({
  whole: { message: whole.choices[0].message, finish_reason: whole.choices[0].finish_reason },
  streamed,
  helper: { message: helper.choices[0].message, finish_reason: helper.choices[0].finish_reason },
  responses: { whole: { output: responsesWhole.output, output_text: responsesWhole.output_text },
               helper: { output: responsesHelper.output } },
}, null, 1));
console.log("tool_call_cases: done");
