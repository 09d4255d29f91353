// Converts a SentencePiece BPE tokenizer.model (Llama 2's) to a Hugging Face
// tokenizer.json the way transformers' LlamaConverter does, so the tests have
// Llama 2's vocabulary in tokenizer.json form without the internet:
//
//   node sp_to_tokenizer_json.mjs tokenizer.model OUT_DIR [metaspace]
//
// writes OUT_DIR/tokenizer.json and OUT_DIR/tokenizer_config.json.
//   - default: the "legacy" Llama form (normalizer Prepend "▁" + Replace " "
//     -> "▁", no pre-tokenizer; decoder Replace, ByteFallback, Fuse, Strip);
//   - "metaspace": transformers' legacy=false form (no normalizer, Metaspace
//     pre-tokenizer with prepend_scheme "first" and split false; decoder
//     ByteFallback then Metaspace).
// Merges come from the vocabulary as SentencePieceExtractor.extract() makes
// them: every split of a piece into two pieces, ordered by the piece's score
// (highest first), ties by the ids of the two halves.
import fs from "fs";
import path from "path";

const [modelPath, outDir, variant = "legacy"] = process.argv.slice(2);
if (!modelPath || !outDir) {
  console.error("usage: node sp_to_tokenizer_json.mjs tokenizer.model OUT_DIR [metaspace]");
  process.exit(2);
}

// A minimal protobuf reader for ModelProto.pieces (field 1): each piece has
// piece (1, string), score (2, float) and type (3, enum).
function readPieces(buf) {
  let pos = 0;
  const varint = () => {
    let result = 0n, shift = 0n;
    for (;;) {
      const b = buf[pos++];
      result |= BigInt(b & 0x7f) << shift;
      if (!(b & 0x80)) return result;
      shift += 7n;
    }
  };
  const skip = (wire) => {
    if (wire === 0) varint();
    else if (wire === 1) pos += 8;
    else if (wire === 2) {
      const len = Number(varint());  // read before pos is: `pos += varint()` loses the varint
      pos += len;
    }
    else if (wire === 5) pos += 4;
    else throw new Error(`unsupported wire type ${wire} at ${pos}`);
  };
  const pieces = [];
  while (pos < buf.length) {
    const tag = Number(varint());
    const field = tag >> 3, wire = tag & 7;
    if (field !== 1 || wire !== 2) {
      skip(wire);
      continue;
    }
    const len = Number(varint());
    const end = pos + len;
    const piece = { piece: "", score: 0, type: 1 };
    while (pos < end) {
      const t = Number(varint());
      const f = t >> 3, w = t & 7;
      if (f === 1 && w === 2) {
        const len = Number(varint());
        piece.piece = buf.toString("utf8", pos, pos + len);
        pos += len;
      } else if (f === 2 && w === 5) {
        piece.score = buf.readFloatLE(pos);
        pos += 4;
      } else if (f === 3 && w === 0) {
        piece.type = Number(varint());
      } else {
        skip(w);
      }
    }
    pieces.push(piece);
  }
  return pieces;
}

const pieces = readPieces(fs.readFileSync(modelPath));
const vocab = {};
pieces.forEach((p, id) => { vocab[p.piece] = id; });

const merges = [];
pieces.forEach((p) => {
  const chars = Array.from(p.piece);
  const local = [];
  for (let i = 1; i < chars.length; ++i) {
    const left = chars.slice(0, i).join(""), right = chars.slice(i).join("");
    if (left in vocab && right in vocab) local.push([left, right, p.score]);
  }
  local.sort((a, b) => vocab[a[0]] - vocab[b[0]] || vocab[a[1]] - vocab[b[1]]);
  merges.push(...local);
});
// Array.prototype.sort is stable, as Python's sorted() is.
merges.sort((a, b) => b[2] - a[2]);

const specials = [["<unk>", 0], ["<s>", 1], ["</s>", 2]];
const addedTokens = specials.map(([content, id]) => ({
  id, content, single_word: false, lstrip: false, rstrip: false, normalized: false, special: true,
}));
const template = {
  type: "TemplateProcessing",
  single: [{ SpecialToken: { id: "<s>", type_id: 0 } }, { Sequence: { id: "A", type_id: 0 } }],
  pair: [{ SpecialToken: { id: "<s>", type_id: 0 } }, { Sequence: { id: "A", type_id: 0 } },
         { SpecialToken: { id: "<s>", type_id: 1 } }, { Sequence: { id: "B", type_id: 1 } }],
  special_tokens: { "<s>": { id: "<s>", ids: [1], tokens: ["<s>"] } },
};
const legacy = variant !== "metaspace";
const tokenizer = {
  version: "1.0",
  truncation: null,
  padding: null,
  added_tokens: addedTokens,
  normalizer: legacy ? {
    type: "Sequence",
    normalizers: [{ type: "Prepend", prepend: "\u2581" },
                  { type: "Replace", pattern: { String: " " }, content: "\u2581" }],
  } : null,
  pre_tokenizer: legacy ? null
    : { type: "Metaspace", replacement: "\u2581", prepend_scheme: "first", split: false },
  post_processor: template,
  decoder: legacy ? {
    type: "Sequence",
    decoders: [{ type: "Replace", pattern: { String: "\u2581" }, content: " " },
               { type: "ByteFallback" }, { type: "Fuse" },
               { type: "Strip", content: " ", start: 1, stop: 0 }],
  } : {
    type: "Sequence",
    decoders: [{ type: "ByteFallback" },
               { type: "Metaspace", replacement: "\u2581", prepend_scheme: "first", split: false }],
  },
  model: {
    type: "BPE", dropout: null, unk_token: "<unk>", continuing_subword_prefix: null,
    end_of_word_suffix: null, fuse_unk: true, byte_fallback: true, ignore_merges: false,
    vocab, merges: merges.map(([l, r]) => [l, r]),
  },
};
const config = {
  add_bos_token: true, add_eos_token: false, bos_token: "<s>", eos_token: "</s>",
  unk_token: "<unk>", pad_token: null, clean_up_tokenization_spaces: false,
  legacy, tokenizer_class: "LlamaTokenizer",
};
fs.mkdirSync(outDir, { recursive: true });
fs.writeFileSync(path.join(outDir, "tokenizer.json"), JSON.stringify(tokenizer));
fs.writeFileSync(path.join(outDir, "tokenizer_config.json"), JSON.stringify(config, null, 2));
console.log(`${outDir}: ${pieces.length} pieces, ${merges.length} merges (${variant})`);
