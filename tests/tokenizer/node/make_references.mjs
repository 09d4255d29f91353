// Writes the tokenizer tests' reference outputs, computed by implementations
// we did not write (pinned in package.json / package-lock.json):
//
//   node make_references.mjs MODELS_DIR DATA_DIR OUT_DIR
//
// MODELS_DIR/<name>/ holds tokenizer.json + tokenizer_config.json for each
// tokenizer below (tests/tokenizer/npm_references.py prepares it); DATA_DIR
// is tests/tokenizer/data (corpus.json, chat inputs). Writes OUT_DIR/*.json,
// which must equal the committed tests/tokenizer/data/references/*.json.
import fs from "fs";
import path from "path";
import { Template } from "@huggingface/jinja";
import { Tokenizer } from "@huggingface/tokenizers";
import llamaTokenizer from "llama-tokenizer-js";
import llama3Tokenizer from "llama3-tokenizer-js";

// The installed version of a package (they sit beside this script).
const version = (pkg) => {
  const file = new URL(`./node_modules/${pkg}/package.json`, import.meta.url);
  return `${pkg}@${JSON.parse(fs.readFileSync(file, "utf8")).version}`;
};

// tokenizers.js's ByteFallback decoder uses `new TextDecoder()`, which strips
// a byte-order mark at the start of each run of byte tokens: text containing
// U+FEFF written as byte tokens loses it. The Rust crate (what models are
// served with) keeps it, and so do we; the reference runs with ignoreBOM.
const NativeTextDecoder = globalThis.TextDecoder;
globalThis.TextDecoder = class extends NativeTextDecoder {
  constructor(label = "utf-8", options = {}) {
    super(label, { ...options, ignoreBOM: true });
  }
};

// tokenizers.js runs GPT-2's ByteLevel regex as a JavaScript literal, whose \s
// adds U+FEFF and lacks U+0085. Its own translation of tokenizer.json regexes
// maps \s to \p{White_Space} (Oniguruma's \s, which the Rust crate uses:
// "JS \s wrongly adds U+FEFF and misses \x85"); the reference gets the same
// for GPT-2's pattern.
const GPT2_PATTERN = /'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\p{White_Space}\p{L}\p{N}]+|\p{White_Space}+(?!\P{White_Space})|\p{White_Space}+/gu;
function useWhiteSpaceInByteLevel(preTokenizer) {
  if (!preTokenizer) return 0;
  let patched = 0;
  if ("byte_encoder" in preTokenizer && preTokenizer.use_regex) {
    preTokenizer.pattern = GPT2_PATTERN;
    ++patched;
  }
  for (const child of preTokenizer.tokenizers ?? []) patched += useWhiteSpaceInByteLevel(child);
  return patched;
}

const [modelsDir, dataDir, outDir] = process.argv.slice(2);
if (!outDir) {
  console.error("usage: node make_references.mjs MODELS_DIR DATA_DIR OUT_DIR");
  process.exit(2);
}
const corpus = JSON.parse(fs.readFileSync(path.join(dataDir, "corpus.json"), "utf8"));
fs.mkdirSync(outDir, { recursive: true });

// One case per line keeps the committed files reviewable in a diff.
function writeJson(name, header, arrays) {
  let text = JSON.stringify(header).slice(0, -1);
  for (const [key, items] of Object.entries(arrays)) {
    text += `,"${key}":[\n` + items.map((c) => JSON.stringify(c)).join(",\n") + "\n]";
  }
  fs.writeFileSync(path.join(outDir, name), text + "}\n");
}

// A small seeded generator (mulberry32), so random ids are the same each run.
function rng(seed) {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}
const seedOf = (s) => [...s].reduce((h, c) => (Math.imul(h, 31) + c.codePointAt(0)) >>> 0, 7);

// The byte-level alphabet of GPT-2 (bytes_to_unicode).
function byteLevelChar(b) {
  const printable = (x) => (x >= 0x21 && x <= 0x7e) || (x >= 0xa1 && x <= 0xac) || x >= 0xae;
  if (printable(b)) return String.fromCodePoint(b);
  let n = 0;
  for (let x = 0; x < b; ++x) if (!printable(x)) ++n;
  return String.fromCodePoint(256 + n);
}

const HF_TOKENIZERS = ["gpt2", "llama3", "qwen2", "mistral", "gemma", "mistral_nemo", "llama2",
                       "llama2_metaspace", "gemma3", "deepseek_v3", "qwen3"];

function hfReference(name) {
  const dir = path.join(modelsDir, name);
  const config = JSON.parse(fs.readFileSync(path.join(dir, "tokenizer_config.json"), "utf8"));
  const tok = new Tokenizer(JSON.parse(fs.readFileSync(path.join(dir, "tokenizer.json"), "utf8")),
                            config);
  if (useWhiteSpaceInByteLevel(tok.pre_tokenizer)) console.log(`${name}: GPT-2 regex with \\p{White_Space}`);
  const decode = (ids, options) => (ids.length === 0 ? "" : tok.decode(ids, options));
  const decodes = (ids) => {
    const plain = decode(ids, { skip_special_tokens: false, clean_up_tokenization_spaces: false });
    const skip = decode(ids, { skip_special_tokens: true, clean_up_tokenization_spaces: false });
    const cleanup = decode(ids, { skip_special_tokens: false });  // as tokenizer_config.json says
    return { plain, skip, cleanup };
  };
  // Each case: the ids of a corpus text (add_special_tokens true) and its
  // decodes; a decode left out equals its fallback: "skip" (skip special
  // tokens) the text, "plain" (keep them) "skip", "cleanup" (plain with
  // tokenizer_config.json's clean_up_tokenization_spaces) "plain".
  const withDecodes = (c, { plain, skip, cleanup }, text) => {
    if (skip !== text) c.skip = skip;
    if (plain !== skip) c.plain = plain;
    if (cleanup !== plain) c.cleanup = cleanup;
    return c;
  };
  // transformers' update_post_processor (LlamaTokenizerFast's, every fast
  // tokenizer's in transformers 5): a tokenizer_config.json that names
  // add_bos_token or add_eos_token puts those tokens around the text in place
  // of tokenizer.json's post-processor. tokenizers.js reads tokenizer.json
  // alone, so the reference applies it here (DeepSeek V3's ByteLevel
  // post-processor adds no BOS; transformers, and vLLM with it, add one).
  // get_vocab builds a Map of the whole vocabulary on each call (Gemma's
  // 256k took 200 ms a text), so the vocabulary and the flags' ids are
  // looked up once per tokenizer.
  const vocab = tok.get_vocab(true);
  const namesFlags = "add_bos_token" in config || "add_eos_token" in config;
  const flagged = (flag, token) => {
    if (config[flag] !== true || token == null) return [];
    const id = vocab.get(typeof token === "string" ? token : token.content);
    if (id === undefined) throw new Error(`${name}: ${flag} names a token not in the vocabulary`);
    return [id];
  };
  const bos = flagged("add_bos_token", config.bos_token);
  const eos = flagged("add_eos_token", config.eos_token);
  const encode = (text) => (namesFlags ? [...bos, ...tok.encode(text, { add_special_tokens: false }).ids, ...eos]
                                       : tok.encode(text).ids);
  const cases = corpus.texts.map((text) => {
    const ids = encode(text);
    return withDecodes({ ids }, decodes(ids), text);
  });
  // Decoding ids no text encodes to: ill-formed UTF-8 as byte tokens, and
  // random ids.
  const byteId = (b) => vocab.get(`<0x${b.toString(16).toUpperCase().padStart(2, "0")}>`) ??
                        vocab.get(byteLevelChar(b));
  const idCases = [];
  for (const bytes of corpus.byte_sequences) {
    const ids = bytes.map(byteId);
    if (ids.some((id) => id === undefined)) throw new Error(`${name}: no byte tokens`);
    idCases.push(withDecodes({ kind: "bytes", ids }, decodes(ids), null));
  }
  const ids = [...vocab.values()];
  const maxId = ids.reduce((a, b) => Math.max(a, b), 0);
  const specialIds = [...tok.get_added_tokens_decoder().keys()];
  const random = rng(seedOf(name));
  for (let n = 0; n < 150; ++n) {
    const len = 1 + Math.floor(random() * 16);
    const seq = [];
    while (seq.length < len) {
      const r = random();
      const id = r < 0.15 && specialIds.length ? specialIds[Math.floor(random() * specialIds.length)]
               : r < 0.3 ? byteId(Math.floor(random() * 256))
               : Math.floor(random() * (maxId + 1));
      if (tok.id_to_token(id) !== undefined) seq.push(id);
    }
    idCases.push(withDecodes({ kind: "random", ids: seq }, decodes(seq), null));
  }
  const source = JSON.parse(fs.readFileSync(path.join(dir, "source.json"), "utf8"));
  writeJson(`hf_${name}.json`, { tokenizer: name, source, reference: version("@huggingface/tokenizers") },
            { cases, id_cases: idCases });
}

for (const name of HF_TOKENIZERS) hfReference(name);

// llama-tokenizer-js (Llama 2's vocabulary; BOS and the dummy prefix space).
// It has no added-token matching: "<s>" in text is text, as in SentencePiece.
// Decodes: of each text's ids (null where it gives the text back), and of BOS
// followed by each corpus byte sequence as <0xXX> tokens (ill-formed UTF-8).
// Its decoder was made before the TextDecoder above, so it would strip a
// leading U+FEFF (libsentencepiece keeps it); it gets one that keeps it.
llamaTokenizer.utf8Decoder = new TextDecoder();
const llamaCases = corpus.texts.map((text) => llamaTokenizer.encode(text));
writeJson("llama_tokenizer_js.json", { reference: version("llama-tokenizer-js") }, {
  cases: llamaCases,
  decodes: llamaCases.map((ids, i) => {
    const text = ids.length === 0 ? "" : llamaTokenizer.decode(ids);
    return text === corpus.texts[i] ? null : text;
  }),
  byte_decodes: corpus.byte_sequences.map((bytes) => llamaTokenizer.decode([1, ...bytes.map((b) => 3 + b)])),
});
// llama3-tokenizer-js (Llama 3's vocabulary; BOS, no EOS).
writeJson("llama3_tokenizer_js.json", { reference: version("llama3-tokenizer-js") },
          { cases: corpus.texts.map((text) => llama3Tokenizer.encode(text, { bos: true, eos: false })) });
// Chat templates: each model's chat_template (tokenizer_config.json) and the
// built-in templates (data/chat_templates/*.jinja, which must equal
// ChatTemplate::BuiltinSource) rendered by @huggingface/jinja on every
// conversation, with add_generation_prompt false and true; {"error": message}
// where the template raises.
const CHAT_MODELS = ["llama3", "llama3_0", "qwen2", "mistral_nemo", "qwen3", "gemma3", "llama3_2",
                     "deepseek_v3"];
const chat = JSON.parse(fs.readFileSync(path.join(dataDir, "chat_conversations.json"), "utf8"));
const tokenText = (t) => (t == null ? "" : typeof t === "string" ? t : t.content);
const chatTemplates = [
  ...CHAT_MODELS.map((name) => {
    const config = JSON.parse(fs.readFileSync(path.join(modelsDir, name, "tokenizer_config.json"), "utf8"));
    return { template: name, source: config.chat_template, bos_token: tokenText(config.bos_token),
             eos_token: tokenText(config.eos_token) };
  }),
  // Templates written to exercise the Jinja subset feature by feature.
  ...Object.entries(chat.feature_templates).map(([name, source]) => ({
    template: `feature:${name}`, source, bos_token: "<s>", eos_token: "</s>",
  })),
  ...Object.entries(chat.builtin_tokens).map(([name, tokens]) => ({
    template: `builtin:${name}`,
    source: fs.readFileSync(path.join(dataDir, "chat_templates", `${name}.jinja`), "utf8"),
    ...tokens,
  })),
];
const DATE_STRING = "26 Jul 2024";  // reference_test.cc's kDateString
const chatCases = [];
for (const t of chatTemplates) {
  const template = new Template(t.source);
  for (const conversation of chat.conversations) {
    for (const add_generation_prompt of [false, true]) {
      // date_string: Llama 3.x's templates would take today's date from
      // strftime_now, and the references would change every day.
      const context = { messages: conversation.messages, add_generation_prompt,
                        bos_token: t.bos_token, eos_token: t.eos_token, date_string: DATE_STRING };
      if (conversation.tools) context.tools = conversation.tools;
      const c = { template: t.template, conversation: conversation.name, add_generation_prompt };
      try {
        c.text = template.render(context);
      } catch (e) {
        c.error = e.message;
      }
      chatCases.push(c);
    }
  }
}
writeJson("chat_templates.json", { reference: version("@huggingface/jinja") }, { cases: chatCases });
console.log(`references written to ${outDir}`);
