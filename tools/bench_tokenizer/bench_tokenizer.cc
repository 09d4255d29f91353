// Tokenizer throughput on the test corpus: encode and decode MB/s of each
// tokenizer given, one JSON line each. bench_tokenizers_js.mjs measures
// @huggingface/tokenizers the same way; run.sh runs both.
//
//   bench_tokenizer CORPUS_JSON SECONDS TOKENIZER...
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tandem/tokenizer/tokenizer.h"

namespace {

using Clock = std::chrono::steady_clock;

// Runs `pass` (one pass over the corpus) until `seconds` have gone by;
// returns passes per second.
template <typename F>
double PassesPerSecond(double seconds, F pass) {
  pass();  // warm up
  int passes = 0;
  const auto start = Clock::now();
  double elapsed = 0;
  while (elapsed < seconds) {
    pass();
    ++passes;
    elapsed = std::chrono::duration<double>(Clock::now() - start).count();
  }
  return passes / elapsed;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 4) {
    std::cerr << "usage: bench_tokenizer CORPUS_JSON SECONDS TOKENIZER...\n";
    return 2;
  }
  std::ifstream in(argv[1]);
  const auto texts = nlohmann::json::parse(in)["texts"].get<std::vector<std::string>>();
  const double seconds = std::stod(argv[2]);
  size_t bytes = 0;
  for (const auto& t : texts) bytes += t.size();
  for (int a = 3; a < argc; ++a) {
    auto tok = tandem::tokenizer::LoadTokenizer(argv[a]);
    if (!tok.ok()) {
      std::cerr << tok.status() << "\n";
      return 1;
    }
    std::vector<std::vector<int32_t>> ids(texts.size());
    size_t num_tokens = 0;
    const double encode = PassesPerSecond(seconds, [&] {
      num_tokens = 0;
      for (size_t i = 0; i < texts.size(); ++i) {
        ids[i] = *(*tok)->Encode(texts[i]);
        num_tokens += ids[i].size();
      }
    });
    const double decode = PassesPerSecond(seconds, [&] {
      for (const auto& x : ids) {
        if (!(*tok)->Decode(x).ok()) std::abort();
      }
    });
    std::cout << nlohmann::json{{"impl", "tandem"},
                                {"tokenizer", argv[a]},
                                {"corpus_bytes", bytes},
                                {"corpus_tokens", num_tokens},
                                {"encode_mb_s", encode * bytes / 1e6},
                                {"encode_tokens_s", encode * num_tokens},
                                {"decode_mb_s", decode * bytes / 1e6}}
                     .dump()
              << std::endl;
  }
  return 0;
}
