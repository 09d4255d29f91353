// bench_load: peak host RSS and time of loading a Hugging Face checkpoint,
// against its size on disk (issue 28: a bf16 checkpoint must load in at most
// 1.25x its file size). One mode per process, so each peak is its own:
//
//   bench_load --model DIR --mode mapped   # the worker's load: tensors stay
//       mapped, every weight read once as bf16 (what the bfloat16 CUDA
//       runner uploads), then the mapping released
//   bench_load --model DIR --mode host     # fp32 host weights (the tools'
//       load, and the worker's before the mapped load)
//
// tools/bench_model/bench_load.sh writes a 1B-shaped bf16 checkpoint with
// tandem-make-random-model + tandem-convert-hf and runs both.
#include <chrono>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <string>

#include "tandem/common/flags.h"
#include "tandem/model/model.h"

namespace {

// The process's peak resident set (VmHWM), in bytes.
int64_t PeakRssBytes() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmHWM:", 0) == 0) return std::stoll(line.substr(6)) * 1024;
  }
  return -1;
}

int64_t DirBytes(const std::string& dir) {
  int64_t total = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    if (e.path().extension() == ".safetensors") total += static_cast<int64_t>(e.file_size());
  }
  return total;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace tandem::model;
  std::string model_path, mode = "mapped";
  tandem::FlagSet flags("bench_load",
                        "Peak host RSS and time of loading a Hugging Face checkpoint.");
  flags.Add("model", &model_path, "Hugging Face directory");
  flags.Add("mode", &mode, "mapped (the worker's load, read as bf16) | host (fp32 host weights)");
  flags.ParseOrExit(argc, argv);
  if (model_path.empty() || (mode != "mapped" && mode != "host")) {
    flags.Fail("--model DIR and --mode mapped|host");
  }
  const auto start = std::chrono::steady_clock::now();
  auto model = Model::Load(model_path, {.host_weights = mode == "host"});
  if (!model.ok()) {
    std::cerr << "error: " << model.status() << "\n";
    return 1;
  }
  int64_t read_bytes = 0;
  if (mode == "mapped") {
    const ModelConfig& c = (*model)->config();
    auto read = [&](WeightId id) {
      auto v = (*model)->Bf16(id);
      if (!v.ok()) {
        std::cerr << "error: " << v.status() << "\n";
        std::exit(1);
      }
      // Touch every value, as a copy to the device would.
      uint32_t sum = 0;
      for (uint16_t x : v->span()) sum += x;
      read_bytes += static_cast<int64_t>(v->size() * 2) + (sum == 0xFFFFFFFFu);
    };
    read({WeightKind::kEmbedding});
    read({WeightKind::kRmsFinal});
    for (int32_t l = 0; l < c.num_layers; ++l) {
      for (WeightKind k : {WeightKind::kRmsAtt, WeightKind::kWq, WeightKind::kWk, WeightKind::kWv,
                           WeightKind::kWo, WeightKind::kRmsFfn, WeightKind::kW1, WeightKind::kW2,
                           WeightKind::kW3}) {
        read({k, l});
      }
    }
    (*model)->ReleaseCheckpoint();
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const int64_t file = DirBytes(model_path), peak = PeakRssBytes();
  std::cout << "mode=" << mode << " file_bytes=" << file << " peak_rss_bytes=" << peak
            << " peak_over_file=" << static_cast<double>(peak) / static_cast<double>(file)
            << " (target <= 1.25 for mapped) seconds=" << seconds
            << " bf16_bytes_read=" << read_bytes << "\n";
  return 0;
}
