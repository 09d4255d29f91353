// structured_outputs.grammar against a GBNF reader we did not write
// (tests/grammar/README.md):
//   grammar_gbnf_check GRAMMARS TOKENIZER VERDICTS_OUT
// GRAMMARS is a JSON array of grammars written in what xgrammar's EBNF and
// llama.cpp's GBNF share. For each, random walks over TOKENIZER's vocabulary
// (each token drawn from the mask) give texts; the texts, prefixes of them
// and prefixes with a character or a refused token added are written to
// VERDICTS_OUT as JSON lines {"grammar": i, "text": t, "viable": b,
// "complete": b}: whether our matcher takes the text as the start of a
// document of grammar i, and whether as a whole one. check.mjs (mode gbnf)
// asks the gbnf package the same of each and fails on any difference.
// A text our matcher finds too ambiguous (overflowed) is counted, not
// written. Exits 1 on the first failure here, naming it.
#include <algorithm>
#include <fstream>
#include <iostream>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "tandem/grammar/ebnf.h"
#include "tandem/grammar/json_matcher.h"
#include "tandem/grammar/token_mask.h"
#include "tandem/tokenizer/tokenizer.h"

namespace {

using Json = nlohmann::ordered_json;
using namespace tandem::grammar;

int Fail(const std::string& why) {
  std::cerr << "grammar_gbnf_check: " << why << "\n";
  return 1;
}

// Whether `text` is whole UTF-8 (what a JavaScript string can hold).
bool WholeUtf8(std::string_view text) {
  for (size_t i = 0; i < text.size();) {
    const auto lead = static_cast<uint8_t>(text[i]);
    const size_t len = lead < 0x80 ? 1 : lead >> 5 == 0x6 ? 2 : lead >> 4 == 0xE ? 3 : lead >> 3 == 0x1E ? 4 : 0;
    if (len == 0 || i + len > text.size()) return false;
    for (size_t k = 1; k < len; ++k) {
      if ((static_cast<uint8_t>(text[i + k]) & 0xC0) != 0x80) return false;
    }
    i += len;
  }
  return true;
}

// Offsets in `text` where a character begins, and its end.
std::vector<size_t> CharBoundaries(std::string_view text) {
  std::vector<size_t> out;
  for (size_t i = 0; i <= text.size(); ++i) {
    if (i == text.size() || (static_cast<uint8_t>(text[i]) & 0xC0) != 0x80) out.push_back(i);
  }
  return out;
}

struct Counts {
  int written = 0, viable = 0, refused = 0, complete = 0, overflowed = 0, walks = 0;
};

// Our verdict on `text` for `schema`, written for check.mjs.
void Write(const std::shared_ptr<const Schema>& schema, size_t grammar, const std::string& text,
           std::ofstream& out, Counts& counts) {
  if (!WholeUtf8(text)) return;
  JsonMatcher m(schema);
  const bool viable = m.Accept(text);
  if (m.overflowed()) {
    ++counts.overflowed;
    return;
  }
  const bool complete = viable && m.Complete();
  ++counts.written;
  ++(viable ? counts.viable : counts.refused);
  counts.complete += complete;
  out << Json({{"grammar", grammar}, {"text", text}, {"viable", viable}, {"complete", complete}})
             .dump(-1, ' ', false, Json::error_handler_t::strict)
      << "\n";
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 4) return Fail("usage: grammar_gbnf_check GRAMMARS TOKENIZER VERDICTS_OUT");
  const Json listed = Json::parse(std::ifstream(argv[1]));
  auto tokenizer = tandem::tokenizer::LoadTokenizer(argv[2]);
  if (!tokenizer.ok()) return Fail(std::string(tokenizer.status().message()));
  std::vector<std::string> bytes((*tokenizer)->vocab_size());
  for (int32_t id = 0; id < (*tokenizer)->vocab_size(); ++id) {
    if ((*tokenizer)->IsSpecial(id)) continue;
    bytes[static_cast<size_t>(id)] =
        tandem::tokenizer::PieceBytes(*(*tokenizer)->IdToPiece(id), /*byte_level=*/false);
  }
  const TokenVocabulary vocab(std::move(bytes));
  // Characters added to prefixes: some each grammar reads, some none does.
  const std::vector<std::string> extra = {"a", "x", "0", "9", "-", "+", "(", ")", ",", ".", "!",
                                          " ", "\n", "\"", "\\", "{", "}", "[", "]", ":", "=",
                                          "O", "N", "é", "你", "ü", "\t", "#", "*", "/"};
  std::ofstream out(argv[3]);
  std::mt19937 rng(4321);
  Counts counts;
  for (size_t g = 0; g < listed.size(); ++g) {
    auto compiled = CompileEbnfDocument(listed[g].get<std::string>());
    if (!compiled.ok()) return Fail("grammar " + std::to_string(g) + ": " + std::string(compiled.status().message()));
    const std::shared_ptr<const Schema>& schema = *compiled;
    Write(schema, g, "", out, counts);
    for (int w = 0; w < 30; ++w, ++counts.walks) {
      JsonMatcher m(schema);
      std::string text;
      for (int step = 0; step < 120 && m.Open(); ++step) {
        TokenMask mask;
        if (AllowedTokens(m, vocab, &mask) == 0) {
          if (!m.Complete()) return Fail("no token allowed in an incomplete " + text);
          break;
        }
        if (m.Complete() && rng() % 4 == 0) break;
        std::vector<int32_t> allowed, short_ones, refused;
        for (int32_t id = 0; id < vocab.size(); ++id) {
          if (vocab.bytes(id).empty()) continue;
          if (!MaskAllows(mask, id)) {
            if (refused.size() < 64 && rng() % 500 == 0) refused.push_back(id);
            continue;
          }
          allowed.push_back(id);
          if (vocab.bytes(id).size() <= 2) short_ones.push_back(id);
        }
        // A token the mask refuses: the text with it must not be a start.
        if (!refused.empty() && rng() % 4 == 0) {
          Write(schema, g, text + std::string(vocab.bytes(refused[rng() % refused.size()])), out, counts);
        }
        // Short tokens half the time, so that walks reach the grammar's ends.
        const std::vector<int32_t>& from = !short_ones.empty() && rng() % 2 ? short_ones : allowed;
        const int32_t id = from[rng() % from.size()];
        if (!m.Accept(vocab.bytes(id))) return Fail("the mask allowed a token Accept refuses");
        text += vocab.bytes(id);
      }
      Write(schema, g, text, out, counts);
      const std::vector<size_t> cuts = CharBoundaries(text);
      for (int k = 0; k < 3; ++k) {
        const std::string prefix = text.substr(0, cuts[rng() % cuts.size()]);
        Write(schema, g, prefix, out, counts);
        Write(schema, g, prefix + extra[rng() % extra.size()], out, counts);
      }
    }
  }
  std::cout << "grammar_gbnf_check: " << listed.size() << " grammars, " << counts.walks
            << " walks; " << counts.written << " verdicts written (" << counts.viable
            << " starts, " << counts.complete << " of them whole, " << counts.refused
            << " refused); " << counts.overflowed << " texts too ambiguous\n";
  if (counts.refused < counts.written / 10 || counts.complete < counts.written / 10) {
    return Fail("too few refused or whole texts to tell readers apart");
  }
  return 0;
}
