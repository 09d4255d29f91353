#include "tandem/rpc/service_convert.h"

#include "tandem/rpc/convert.h"

namespace tandem::rpc {

void ToProto(const ModelInfo& in, v1::GetModelInfoResponse* out) {
  out->set_model_name(in.model_name);
  out->set_model_fingerprint(in.model_fingerprint);
  out->set_vocab_size(in.vocab_size);
  out->set_max_model_len(in.max_model_len);
  out->set_block_size(in.block_size);
  out->set_num_kv_blocks(in.num_kv_blocks);
  out->set_eos_token_id(in.eos_token_id);
  out->mutable_extra_eos_token_ids()->Assign(in.extra_eos_token_ids.begin(),
                                             in.extra_eos_token_ids.end());
  ToProto(in.generation, out->mutable_generation());
  out->set_max_logprobs(in.max_logprobs);
}

ModelInfo FromProto(const v1::GetModelInfoResponse& in) {
  return ModelInfo{
      .ready = true,
      .model_name = in.model_name(),
      .model_fingerprint = in.model_fingerprint(),
      .vocab_size = in.vocab_size(),
      .max_model_len = in.max_model_len(),
      .block_size = in.block_size(),
      .num_kv_blocks = in.num_kv_blocks(),
      .eos_token_id = in.eos_token_id(),
      .extra_eos_token_ids = {in.extra_eos_token_ids().begin(), in.extra_eos_token_ids().end()},
      .generation = FromProto(in.generation()),
      .max_logprobs = in.max_logprobs(),
  };
}

engine::WorkerDescription FromProto(const v1::DescribeResponse& in) {
  return engine::WorkerDescription{
      .model_name = in.model_name(),
      .model_fingerprint = in.model_fingerprint(),
      .kv_layout = in.kv_layout(),
      .block_size = in.block_size(),
      .num_kv_blocks = in.num_kv_blocks(),
      .vocab_size = in.vocab_size(),
      .eos_token_id = in.eos_token_id(),
      .extra_eos_token_ids = {in.extra_eos_token_ids().begin(), in.extra_eos_token_ids().end()},
      .max_model_len = in.max_model_len(),
      .block_bytes = in.block_bytes(),
      .generation = FromProto(in.generation()),
  };
}

}  // namespace tandem::rpc
