// Drives tandem-frontend under --reasoning-parser with the npm `openai` SDK
// (a client we did not write), for tests/frontend/tools_test.cc: the
// thinking as the SDK hands it over, in a chat message, in a Responses
// reasoning item, and as its Responses stream helper assembles it from the
// events.
//
//   node reasoning_cases.mjs BASE_URL OUT_JSON
import fs from "node:fs";
import OpenAI from "openai";

const [baseURL, outPath] = process.argv.slice(2);
const client = new OpenAI({ baseURL, apiKey: "unused", maxRetries: 0 });
const model = (await client.models.list()).data[0].id;
const input = "Weather in Paris?";

const chat = await client.chat.completions.create({
  model, messages: [{ role: "user", content: input }] });
const whole = await client.responses.create({ model, input });
const helper = await client.responses.stream({ model, input }).finalResponse();
const types = [];
for await (const ev of await client.responses.create({ model, input, stream: true })) {
  types.push(ev.type);
}

fs.writeFileSync(outPath, JSON.stringify({
  chat: { reasoning: chat.choices[0].message.reasoning ?? null,
          content: chat.choices[0].message.content },
  whole: { output: whole.output, output_text: whole.output_text },
  helper: { output: helper.output },
  types,
}, null, 1));
console.log("reasoning_cases: done");
