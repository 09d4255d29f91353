// @huggingface/tokenizers (tokenizers.js) on the test corpus, measured as
// bench_tokenizer.cc measures ours. Run from BUILD/tokenizer_npm (where the
// tokenizer_npm_references fixture installed it):
//   node bench_tokenizers_js.mjs CORPUS_JSON SECONDS DIR_WITH_TOKENIZER_JSON...
import fs from "fs";
import path from "path";
import { Tokenizer } from "@huggingface/tokenizers";

const [corpusPath, secondsArg, ...dirs] = process.argv.slice(2);
const texts = JSON.parse(fs.readFileSync(corpusPath, "utf8")).texts;
const seconds = Number(secondsArg);
const bytes = texts.reduce((n, t) => n + Buffer.byteLength(t, "utf8"), 0);

function passesPerSecond(pass) {
  pass();
  let passes = 0;
  const start = process.hrtime.bigint();
  let elapsed = 0;
  while (elapsed < seconds) {
    pass();
    ++passes;
    elapsed = Number(process.hrtime.bigint() - start) / 1e9;
  }
  return passes / elapsed;
}

for (const dir of dirs) {
  const read = (f) => JSON.parse(fs.readFileSync(path.join(dir, f), "utf8"));
  const tok = new Tokenizer(read("tokenizer.json"), read("tokenizer_config.json"));
  let ids = [];
  let tokens = 0;
  const encode = passesPerSecond(() => {
    ids = texts.map((t) => tok.encode(t).ids);
    tokens = ids.reduce((n, x) => n + x.length, 0);
  });
  const decode = passesPerSecond(() => {
    for (const x of ids) if (x.length) tok.decode(x, { clean_up_tokenization_spaces: false });
  });
  console.log(JSON.stringify({ impl: "tokenizers.js", tokenizer: dir, corpus_bytes: bytes,
                               corpus_tokens: tokens, encode_mb_s: (encode * bytes) / 1e6,
                               encode_tokens_s: encode * tokens, decode_mb_s: (decode * bytes) / 1e6 }));
}
