// tandem-convert-hf: writes a llama2.c checkpoint as a Hugging Face Llama
// directory (config.json + safetensors), permuting wq/wk for rotate-half RoPE.
#include <iostream>

#include "tandem/common/flags.h"
#include "tandem/model/checkpoint.h"

int main(int argc, char** argv) {
  using namespace tandem::model;
  std::string in = "../shared/models/stories260K.bin", out, dtype = "f32";
  int64_t shards = 1;
  tandem::FlagSet flags(
      "tandem-convert-hf",
      "Writes a llama2.c checkpoint as a Hugging Face Llama directory (config.json + "
      "safetensors).");
  flags.Add("in", &in, "llama2.c .bin checkpoint");
  flags.Add("out", &out, "output directory (created)");
  flags.Add("dtype", &dtype, "tensor dtype: f32, f16 or bf16");
  flags.Add("shards", &shards, "number of safetensors shards (>1 writes an index)");
  flags.ParseOrExit(argc, argv);
  if (out.empty()) flags.Fail("--out is required");
  HfWriteOptions opts{.num_shards = static_cast<int32_t>(shards)};
  if (dtype == "f32")
    opts.dtype = TensorDtype::kF32;
  else if (dtype == "f16")
    opts.dtype = TensorDtype::kF16;
  else if (dtype == "bf16")
    opts.dtype = TensorDtype::kBF16;
  else
    flags.Fail("--dtype must be f32, f16 or bf16");
  auto ckpt = ReadLlama2cCheckpoint(in);
  if (!ckpt.ok()) {
    std::cerr << "error: " << ckpt.status() << "\n";
    return 1;
  }
  if (absl::Status s = WriteHfCheckpoint(ckpt->config, ckpt->weights, out, opts); !s.ok()) {
    std::cerr << "error: " << s << "\n";
    return 1;
  }
  std::cout << "wrote " << out << "\n";
  return 0;
}
