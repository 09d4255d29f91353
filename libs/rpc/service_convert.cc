#include "tandem/rpc/service_convert.h"

#include <algorithm>

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

void ToProto(const GenerateRequest& in, v1::GenerateRequest* out) {
  out->set_request_id(in.request_id);
  out->set_cache_salt(in.cache_salt);
  out->set_priority(in.priority);
  out->mutable_prompt_token_ids()->Assign(in.prompt_token_ids.begin(), in.prompt_token_ids.end());
  ToProto(in.sampling, out->mutable_sampling());
}

namespace {

std::vector<TokenLogprobs> LenientFromProto(
    const google::protobuf::RepeatedPtrField<v1::TokenLogprobs>& in) {
  std::vector<TokenLogprobs> out;
  out.reserve(in.size());
  for (const v1::TokenLogprobs& lp : in) {
    const int num_top = std::min(lp.top_token_ids_size(), lp.top_logprobs_size());
    out.push_back(
        {.token_id = lp.token_id(),
         .logprob = lp.logprob(),
         .rank = lp.rank(),
         .top_token_ids = {lp.top_token_ids().begin(), lp.top_token_ids().begin() + num_top},
         .top_logprobs = {lp.top_logprobs().begin(), lp.top_logprobs().begin() + num_top}});
  }
  return out;
}

}  // namespace

GenerateResponse FromProto(const v1::GenerateResponse& in) {
  return GenerateResponse{
      .token_ids = {in.token_ids().begin(), in.token_ids().end()},
      .logprobs = LenientFromProto(in.logprobs()),
      .prompt_logprobs = LenientFromProto(in.prompt_logprobs()),
      .finish_reason = FromProto(in.finish_reason()),
      .usage = {.prompt_tokens = in.usage().prompt_tokens(),
                .output_tokens = in.usage().output_tokens(),
                .cached_tokens_local = in.usage().cached_tokens_local(),
                .cached_tokens_external = in.usage().cached_tokens_external()},
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
