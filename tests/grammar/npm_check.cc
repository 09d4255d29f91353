// The grammar against references we did not write (tests/grammar/README.md):
//   grammar_npm_check SCHEMAS INSTANCES DUMPS TOKENIZER WALKS_OUT
// 1. every document json-schema-faker made (INSTANCES, JSON lines of
//    {"schema": i, "doc": text}) must be a whole document of schema i;
// 2. each of them as Python's json.dumps writes it (DUMPS, JSON lines of
//    {"schema": i, "dumps": text, "tight": text}) must be a whole document of
//    schema i compiled without any whitespace (vLLM's disable_any_whitespace)
//    and with it; written with (",", ":") separators ("tight"), the first
//    must refuse it where it differs;
// 3. random walks over TOKENIZER's vocabulary, each token drawn from the
//    mask, are written to WALKS_OUT for ajv (check.mjs validate). At every
//    step the mask must hold a token or the document be complete, and every
//    drawn token must be taken by Accept, and the mask a TokenMaskCache
//    gives must be the walked one (both times are printed: the cache's
//    figure against the walk of the whole vocabulary it saves); the
//    schemas without any whitespace are walked too.
// Exits 1 on the first failure, naming it.
#include <algorithm>
#include <chrono>
#include <fstream>
#include <iostream>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "tandem/grammar/json_matcher.h"
#include "tandem/grammar/json_schema.h"
#include "tandem/grammar/token_mask.h"
#include "tandem/tokenizer/tokenizer.h"

namespace {

using Json = nlohmann::ordered_json;
using namespace tandem::grammar;

int Fail(const std::string& why) {
  std::cerr << "grammar_npm_check: " << why << "\n";
  return 1;
}

// Whether a token's bytes hold something that closes or separates.
bool Structural(std::string_view bytes) {
  return bytes.find_first_of("\"}],:") != std::string_view::npos;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 6) {
    return Fail("usage: grammar_npm_check SCHEMAS INSTANCES DUMPS TOKENIZER WALKS_OUT");
  }
  // Each schema with any whitespace, then each without.
  std::vector<std::shared_ptr<const Schema>> schemas;
  const Json listed = Json::parse(std::ifstream(argv[1]));
  for (bool any_whitespace : {true, false}) {
    for (const Json& s : listed) {
      auto compiled = CompileJsonSchema(s, any_whitespace);
      if (!compiled.ok()) return Fail(std::string(compiled.status().message()));
      schemas.push_back(*compiled);
    }
  }
  const auto whole = [](const std::shared_ptr<const Schema>& schema, const std::string& doc) {
    JsonMatcher m(schema);
    return m.Accept(doc) && m.Complete();
  };
  int instances = 0;
  std::ifstream in(argv[2]);
  for (std::string line; std::getline(in, line);) {
    const Json j = Json::parse(line);
    const size_t i = j.at("schema").get<size_t>();
    const std::string doc = j.at("doc").get<std::string>();
    JsonMatcher m(schemas.at(i));
    if (!m.Accept(doc) || !m.Complete()) {
      return Fail("schema " + std::to_string(i) + " refuses json-schema-faker's " + doc);
    }
    ++instances;
  }
  int dumps = 0, tight = 0;
  std::ifstream dumped(argv[3]);
  for (std::string line; std::getline(dumped, line);) {
    const Json j = Json::parse(line);
    const size_t i = j.at("schema").get<size_t>();
    const std::string doc = j.at("dumps").get<std::string>();
    const std::string& compact_doc = j.at("tight").get_ref<const std::string&>();
    if (!whole(schemas.at(listed.size() + i), doc) || !whole(schemas.at(i), doc)) {
      return Fail("schema " + std::to_string(i) + " refuses json.dumps' " + doc);
    }
    if (compact_doc != doc) {
      if (whole(schemas.at(listed.size() + i), compact_doc)) {
        return Fail("schema " + std::to_string(i) + " without whitespace takes " + compact_doc);
      }
      ++tight;
    }
    ++dumps;
  }
  if (dumps != instances) return Fail("DUMPS does not hold every instance");
  auto tokenizer = tandem::tokenizer::LoadTokenizer(argv[4]);
  if (!tokenizer.ok()) return Fail(std::string(tokenizer.status().message()));
  std::vector<std::string> bytes((*tokenizer)->vocab_size());
  for (int32_t id = 0; id < (*tokenizer)->vocab_size(); ++id) {
    if ((*tokenizer)->IsSpecial(id)) continue;
    bytes[static_cast<size_t>(id)] =
        tandem::tokenizer::PieceBytes(*(*tokenizer)->IdToPiece(id), /*byte_level=*/false);
  }
  const auto shared_vocab = std::make_shared<const TokenVocabulary>(std::move(bytes));
  const TokenVocabulary& vocab = *shared_vocab;
  TokenMaskCache cache(shared_vocab, size_t{256} << 20);
  std::ofstream out(argv[5]);
  std::mt19937 rng(1234);
  int walks = 0, complete = 0, tokens = 0, masks = 0;
  std::chrono::steady_clock::duration mask_time{}, cached_time{};
  for (size_t i = 0; i < schemas.size(); ++i) {
    const bool compact = i >= listed.size();
    for (int w = 0; w < (compact ? 6 : 12); ++w, ++walks) {
      JsonMatcher m(schemas[i]);
      std::string doc;
      for (int step = 0; step < 600 && m.Open(); ++step) {
        TokenMask mask;
        const auto start = std::chrono::steady_clock::now();
        const int32_t count = AllowedTokens(m, vocab, &mask);
        const auto walked = std::chrono::steady_clock::now();
        mask_time += walked - start;
        TokenMask kept;
        const int32_t kept_count = cache.Allowed(m, &kept);
        cached_time += std::chrono::steady_clock::now() - walked;
        if (kept != mask || kept_count != count) {
          return Fail("the cache's mask is not the walked one after " + doc);
        }
        ++masks;
        if (count == 0) {
          if (!m.Complete()) return Fail("no token allowed in an incomplete " + doc);
          break;
        }
        if (m.Complete() && rng() % 3 == 0) break;
        std::vector<int32_t> allowed, structural;
        for (int32_t id = 0; id < vocab.size(); ++id) {
          if (!MaskAllows(mask, id)) continue;
          allowed.push_back(id);
          if (Structural(vocab.bytes(id))) structural.push_back(id);
        }
        const std::vector<int32_t>& from =
            !structural.empty() && rng() % 10 < 3 ? structural : allowed;
        const int32_t id = from[rng() % from.size()];
        if (!m.Accept(vocab.bytes(id))) return Fail("the mask allowed a token Accept refuses");
        doc += vocab.bytes(id);
        ++tokens;
      }
      if (!m.Complete()) continue;
      ++complete;
      out << Json({{"schema", i % listed.size()}, {"doc", doc}})
                 .dump(-1, ' ', false, Json::error_handler_t::strict)
          << "\n";
    }
  }
  std::cout << "grammar_npm_check: " << instances << " json-schema-faker documents accepted, "
            << dumps << " as json.dumps writes them with and without any whitespace, " << tight
            << " with tight separators refused without; " << complete << " of " << walks
            << " walks complete (" << tokens << " tokens of " << vocab.size() << "); a mask took "
            << std::chrono::duration<double, std::milli>(mask_time).count() / std::max(masks, 1)
            << " ms on average, from the TokenMaskCache "
            << std::chrono::duration<double, std::milli>(cached_time).count() / std::max(masks, 1)
            << " ms (" << cache.stats().hits << " hits, " << cache.stats().misses << " misses)\n";
  if (complete < walks / 2) return Fail("fewer than half of the walks completed");
  return 0;
}
