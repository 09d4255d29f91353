// tandem-generate: offline generation (no RPC). Runs prompts given as token
// ids through the model runner with continuous batching (up to --batch
// sequences per step, prefill in --chunk-token pieces) and prints the
// generated ids of each prompt, one line per prompt:
//   <prompt index>: <id> <id> ...
// Generation of a prompt stops at --max-tokens or on any of the model's EOS
// ids (ModelConfig::EosTokenIds; llama2.c's is BOS = 1, Llama 3 has three),
// which is not printed.
#include <algorithm>
#include <chrono>
#include <deque>
#include <fstream>
#include <iostream>
#include <sstream>

#include "tandem/common/flags.h"
#include "tandem/common/sampling_params.h"
#include "tandem/model/model.h"
#include "tandem/model/model_runner.h"
#include "tandem/model/sampler.h"

namespace {

using namespace tandem::model;

bool ParseIds(const std::string& text, std::vector<int32_t>* out) {
  std::string t = text;
  for (char& c : t) {
    if (c == ',') c = ' ';
  }
  std::istringstream ss(t);
  std::string tok;
  while (ss >> tok) {
    char* end = nullptr;
    const long v = std::strtol(tok.c_str(), &end, 10);
    if (*end != '\0') return false;
    out->push_back(static_cast<int32_t>(v));
  }
  return !out->empty();
}

struct Sequence {
  int32_t index = 0;
  std::vector<int32_t> tokens;  // prompt + output so far
  int32_t prompt_len = 0;
  int32_t max_tokens = 0;
  int32_t num_computed = 0;  // tokens whose KV is in the cache
  std::vector<int32_t> blocks;
  tandem::SamplingParams params;
  bool done = false;
  int32_t num_output() const { return static_cast<int32_t>(tokens.size()) - prompt_len; }
};

}  // namespace

int main(int argc, char** argv) {
  std::string model_path = "../shared/models/stories260K.bin", prompts_file, backend = "cpu";
  std::vector<std::vector<int32_t>> prompts;
  int64_t max_tokens = 64, top_k = 0, seed = 0, batch = 32, chunk = 64, num_blocks = 0,
          block_size = 16;
  double temperature = 0.0, top_p = 1.0, min_p = 0.0;
  bool stats = false;
  tandem::FlagSet flags(
      "tandem-generate",
      "Offline generation for prompts given as token ids (--prompt 1,2,3, repeatable); prints "
      "'<index>: <ids>' per prompt. Prompt i samples with seed --seed + i (same seed and "
      "prompt -> same tokens, in any batch).");
  flags.Add("model", &model_path, "llama2.c .bin or Hugging Face directory");
  std::vector<std::string> prompt_flags;
  flags.Add("prompt", &prompt_flags, "prompt token ids, comma separated (repeatable)");
  flags.Add("prompts-file", &prompts_file, "file with one prompt of token ids per line");
  flags.Add("max-tokens", &max_tokens, "max generated tokens per prompt");
  flags.Add("temperature", &temperature, "sampling temperature; 0 = greedy");
  flags.Add("top-k", &top_k, "top-k filter; 0 = off");
  flags.Add("top-p", &top_p, "top-p (nucleus) filter; 1 = off");
  flags.Add("min-p", &min_p, "min-p filter (below min-p x the top probability); 0 = off");
  flags.Add("seed", &seed, "sampling seed of prompt 0 (prompt i uses seed + i)");
  flags.Add("batch", &batch, "max sequences per step");
  flags.Add("chunk", &chunk, "prefill chunk size in tokens");
  flags.Add("block-size", &block_size, "KV cache block size in tokens");
  flags.Add("num-blocks", &num_blocks, "KV cache blocks; 0 = enough for every prompt at once");
  flags.Add("backend", &backend, "cpu or cuda");
  flags.Add("stats", &stats, "print steps and tokens/s to stderr");
  flags.ParseOrExit(argc, argv);
  for (const std::string& p : prompt_flags) {
    std::vector<int32_t> ids;
    if (!ParseIds(p, &ids)) flags.Fail("--prompt '" + p + "' is not comma-separated token ids");
    prompts.push_back(std::move(ids));
  }

  if (!prompts_file.empty()) {
    std::ifstream in(prompts_file);
    if (!in) flags.Fail("cannot open --prompts-file " + prompts_file);
    std::string line;
    while (std::getline(in, line)) {
      if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
      std::vector<int32_t> ids;
      if (!ParseIds(line, &ids)) flags.Fail("bad prompt line in " + prompts_file + ": " + line);
      prompts.push_back(std::move(ids));
    }
  }
  if (prompts.empty()) flags.Fail("give at least one --prompt or --prompts-file");
  if (batch < 1 || chunk < 1 || max_tokens < 1 || block_size < 1 || num_blocks < 0) {
    flags.Fail("--batch, --chunk, --max-tokens and --block-size must be >= 1");
  }

  auto model = Model::Load(model_path, {.host_weights = false});
  if (!model.ok()) {
    std::cerr << "error: " << model.status() << "\n";
    return 1;
  }
  const ModelConfig& cfg = (*model)->config();
  const std::vector<int32_t> eos = cfg.EosTokenIds();
  std::vector<Sequence> seqs(prompts.size());
  int64_t blocks_needed = 0;
  for (size_t i = 0; i < prompts.size(); ++i) {
    Sequence& s = seqs[i];
    s.index = static_cast<int32_t>(i);
    s.tokens = prompts[i];
    s.prompt_len = static_cast<int32_t>(prompts[i].size());
    if (s.prompt_len >= cfg.max_seq_len) {
      std::cerr << "error: prompt " << i << " has " << s.prompt_len
                << " tokens, the model's max_seq_len is " << cfg.max_seq_len << "\n";
      return 1;
    }
    s.max_tokens =
        static_cast<int32_t>(std::min<int64_t>(max_tokens, cfg.max_seq_len - s.prompt_len));
    s.params = tandem::SamplingParams{.temperature = static_cast<float>(temperature),
                                      .top_k = static_cast<int32_t>(top_k),
                                      .top_p = static_cast<float>(top_p),
                                      .min_p = static_cast<float>(min_p),
                                      .seed = static_cast<uint64_t>(seed) + i,
                                      .max_tokens = s.max_tokens};
    if (absl::Status st = s.params.Validate(cfg.vocab_size); !st.ok()) {
      std::cerr << "error: " << st << "\n";
      return 1;
    }
    blocks_needed += (s.prompt_len + s.max_tokens + block_size - 1) / block_size;
  }
  if (num_blocks == 0) num_blocks = blocks_needed;
  auto runner = ModelRunner::Create(model->get(),
                                    {.block_size = static_cast<int32_t>(block_size),
                                     .num_blocks = static_cast<int32_t>(num_blocks)},
                                    backend == "cuda" ? Backend::kCuda : Backend::kCpu);
  if (!runner.ok()) {
    std::cerr << "error: " << runner.status() << "\n";
    return 1;
  }

  std::vector<int32_t> free_blocks;
  for (int32_t b = static_cast<int32_t>(num_blocks) - 1; b >= 0; --b) free_blocks.push_back(b);
  std::deque<Sequence*> waiting;
  for (Sequence& s : seqs) waiting.push_back(&s);
  std::vector<Sequence*> running;
  std::vector<float> logits;
  int64_t steps = 0, generated = 0;
  const auto start = std::chrono::steady_clock::now();
  while (!waiting.empty() || !running.empty()) {
    // Admit while there is room: a sequence reserves all its blocks up front.
    while (!waiting.empty() && static_cast<int64_t>(running.size()) < batch) {
      Sequence* s = waiting.front();
      const size_t need =
          static_cast<size_t>((s->prompt_len + s->max_tokens + block_size - 1) / block_size);
      if (need > free_blocks.size()) {
        if (running.empty()) {
          std::cerr << "error: prompt " << s->index << " needs " << need
                    << " KV blocks, --num-blocks gives " << num_blocks << "\n";
          return 1;
        }
        break;
      }
      for (size_t b = 0; b < need; ++b) {
        s->blocks.push_back(free_blocks.back());
        free_blocks.pop_back();
      }
      running.push_back(s);
      waiting.pop_front();
    }
    std::vector<SequenceInput> inputs;
    for (Sequence* s : running) {
      const int32_t remaining = static_cast<int32_t>(s->tokens.size()) - s->num_computed;
      const int32_t n = std::min<int32_t>(remaining, static_cast<int32_t>(chunk));
      inputs.push_back(SequenceInput{
          .token_ids = std::span(s->tokens).subspan(static_cast<size_t>(s->num_computed), n),
          .start_pos = s->num_computed,
          .block_table = s->blocks});
    }
    if (absl::Status st = (*runner)->Forward(inputs, &logits); !st.ok()) {
      std::cerr << "error: " << st << "\n";
      return 1;
    }
    ++steps;
    std::vector<Sequence*> still;
    for (size_t i = 0; i < running.size(); ++i) {
      Sequence* s = running[i];
      s->num_computed += static_cast<int32_t>(inputs[i].token_ids.size());
      if (s->num_computed < static_cast<int32_t>(s->tokens.size())) {
        still.push_back(s);  // prompt not done yet: no sample
        continue;
      }
      const int32_t tok = SampleToken(
          std::span(logits).subspan(i * cfg.vocab_size, static_cast<size_t>(cfg.vocab_size)),
          s->params, s->num_output());
      ++generated;
      if (std::find(eos.begin(), eos.end(), tok) != eos.end()) {
        s->done = true;
      } else {
        s->tokens.push_back(tok);
        if (s->num_output() >= s->max_tokens) s->done = true;
      }
      if (s->done) {
        free_blocks.insert(free_blocks.end(), s->blocks.rbegin(), s->blocks.rend());
        s->blocks.clear();
      } else {
        still.push_back(s);
      }
    }
    running = std::move(still);
  }
  const double secs =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  for (const Sequence& s : seqs) {
    std::cout << s.index << ":";
    for (int32_t i = s.prompt_len; i < static_cast<int32_t>(s.tokens.size()); ++i) {
      std::cout << " " << s.tokens[static_cast<size_t>(i)];
    }
    std::cout << "\n";
  }
  if (stats) {
    std::cerr << "steps " << steps << ", sampled tokens " << generated << ", " << secs << " s, "
              << generated / secs << " tok/s\n";
  }
  return 0;
}
