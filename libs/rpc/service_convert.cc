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
      .last_token_stops = in.last_token_stops(),
      .usage = in.has_usage() ? std::optional<GenerateUsage>(GenerateUsage{
                                    .prompt_tokens = in.usage().prompt_tokens(),
                                    .output_tokens = in.usage().output_tokens(),
                                    .cached_tokens_local = in.usage().cached_tokens_local(),
                                    .cached_tokens_external = in.usage().cached_tokens_external()})
                              : std::nullopt,
  };
}

GenerateRequest FromProto(const v1::GenerateRequest& in, uint64_t default_seed) {
  return GenerateRequest{
      .request_id = in.request_id(),
      .prompt_token_ids = {in.prompt_token_ids().begin(), in.prompt_token_ids().end()},
      .sampling = FromProto(in.sampling(), default_seed),
      .priority = in.priority(),
      .cache_salt = in.cache_salt(),
  };
}

void ToProto(const GenerateResponse& in, v1::GenerateResponse* out) {
  out->mutable_token_ids()->Assign(in.token_ids.begin(), in.token_ids.end());
  ToProto(in.logprobs, out->mutable_logprobs());
  ToProto(in.prompt_logprobs, out->mutable_prompt_logprobs());
  if (in.finish_reason != FinishReason::kNone) out->set_finish_reason(ToProto(in.finish_reason));
  out->set_last_token_stops(in.last_token_stops);
  if (!in.usage) return;
  v1::Usage* usage = out->mutable_usage();
  usage->set_prompt_tokens(in.usage->prompt_tokens);
  usage->set_output_tokens(in.usage->output_tokens);
  usage->set_cached_tokens_local(in.usage->cached_tokens_local);
  usage->set_cached_tokens_external(in.usage->cached_tokens_external);
}

void ToProto(const engine::EngineStats& e, v1::GetStatsResponse* s) {
  s->set_worker_connected(e.worker_connected);
  s->set_async_scheduling(e.async_scheduling);
  s->set_num_active_streams(e.num_requests);
  s->set_num_steps_in_flight(e.num_steps_in_flight);
  s->set_num_worker_connects(e.num_worker_connects);
  if (e.has_scheduler) {
    const sched::SchedulerStats& st = e.scheduler;
    s->set_num_running(e.num_running);
    s->set_num_waiting(e.num_waiting);
    s->set_num_free_blocks(e.num_free_blocks);
    s->set_num_total_blocks(e.num_total_blocks);
    s->set_num_preemptions(st.num_preemptions_total);
    s->set_prefix_cache_queries(st.prefix_cache_queries_tokens);
    s->set_prefix_cache_hits(st.prefix_cache_hits_tokens);
    s->set_external_cache_queries(st.external_cache_queries_tokens);
    s->set_external_cache_hits(st.external_cache_hits_tokens);
    s->set_num_steps(st.num_steps);
    s->set_num_requests_finished(st.num_requests_finished);
    s->set_num_waiting_for_lookup(st.num_waiting_for_lookup);
    s->set_num_waiting_for_load(st.num_waiting_for_load);
    s->set_external_loaded_tokens(st.external_loaded_tokens);
  }
  s->set_max_running_plus_loading(e.max_running_plus_loading);
  s->set_max_steps_in_flight(e.max_steps_in_flight);
  s->set_num_steps_sent(e.num_steps_sent);
  s->set_step_scheduled_reqs_sum(e.step_scheduled_reqs_sum);
  s->set_external_load_failed_not_found(e.load_failed_not_found);
  s->set_external_load_failed_checksum(e.load_failed_checksum);
  s->set_external_load_failed_rpc(e.load_failed_rpc);
  if (e.has_kv_connector) {
    const sched::KvConnectorSchedulerStats& k = e.kv_connector;
    s->set_external_lookups(k.lookups);
    s->set_external_lookups_with_hits(k.lookups_with_hits);
    s->set_external_lookups_failed(k.lookups_failed);
    s->set_external_lookup_hit_tokens(k.lookup_hit_tokens);
    s->set_external_lookup_latency_seconds_sum(static_cast<double>(k.lookup_latency_ns_sum) * 1e-9);
    s->set_external_lookup_latency_seconds_max(static_cast<double>(k.lookup_latency_ns_max) * 1e-9);
    s->set_external_invalid_blocks(k.invalid_blocks);
    s->set_external_stored_blocks(k.stored_blocks);
    s->set_num_lookups_pending(k.lookups_pending);
    s->set_num_loads_in_flight(k.loads_in_flight);
    s->set_num_stores_in_flight(k.stores_in_flight);
  }
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
      .structured_outputs = in.structured_outputs(),
  };
}

}  // namespace tandem::rpc
