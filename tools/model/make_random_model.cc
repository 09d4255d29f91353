// tandem-make-random-model: writes a deterministic random-weight llama2.c
// checkpoint of any size (used when shared/models/stories260K.bin is absent,
// and for benchmarks of larger shapes).
#include <iostream>

#include "tandem/common/flags.h"
#include "tandem/model/checkpoint.h"

int main(int argc, char** argv) {
  using namespace tandem::model;
  std::string out = "random.bin";
  int64_t dim = 64, hidden = 172, layers = 5, heads = 8, kv_heads = 4, vocab = 512, seq_len = 512,
          seed = 1;
  bool unshared = false;
  tandem::FlagSet flags(
      "tandem-make-random-model",
      "Writes a llama2.c .bin with deterministic random weights (a pure function of the "
      "sizes and --seed).");
  flags.Add("out", &out, "output .bin path");
  flags.Add("dim", &dim, "model width");
  flags.Add("hidden-dim", &hidden, "FFN width");
  flags.Add("layers", &layers, "number of layers");
  flags.Add("heads", &heads, "query heads");
  flags.Add("kv-heads", &kv_heads, "KV heads");
  flags.Add("vocab", &vocab, "vocabulary size");
  flags.Add("seq-len", &seq_len, "max sequence length");
  flags.Add("seed", &seed, "weight seed");
  flags.Add("unshared-classifier", &unshared, "write a separate classifier (negative vocab)");
  flags.ParseOrExit(argc, argv);
  const RandomModelOptions opts{.dim = static_cast<int32_t>(dim),
                                .hidden_dim = static_cast<int32_t>(hidden),
                                .num_layers = static_cast<int32_t>(layers),
                                .num_heads = static_cast<int32_t>(heads),
                                .num_kv_heads = static_cast<int32_t>(kv_heads),
                                .vocab_size = static_cast<int32_t>(vocab),
                                .max_seq_len = static_cast<int32_t>(seq_len),
                                .shared_classifier = !unshared,
                                .seed = static_cast<uint64_t>(seed)};
  auto ckpt = MakeRandomCheckpoint(opts);
  if (!ckpt.ok()) {
    std::cerr << "error: " << ckpt.status() << "\n";
    return 1;
  }
  if (absl::Status s = WriteLlama2cCheckpoint(ckpt->config, ckpt->weights, out); !s.ok()) {
    std::cerr << "error: " << s << "\n";
    return 1;
  }
  std::cout << "wrote " << out << "\n";
  return 0;
}
