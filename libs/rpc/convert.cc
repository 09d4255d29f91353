#include "tandem/rpc/convert.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "tandem/common/status.h"

namespace tandem::rpc {
namespace {

template <typename T>
std::vector<T> ToVector(const google::protobuf::RepeatedField<T>& r) {
  return std::vector<T>(r.begin(), r.end());
}

std::vector<std::string> ToVector(const google::protobuf::RepeatedPtrField<std::string>& r) {
  return std::vector<std::string>(r.begin(), r.end());
}

template <typename T>
void Assign(const std::vector<T>& v, google::protobuf::RepeatedField<T>* out) {
  out->Assign(v.begin(), v.end());
}

void Assign(const std::vector<std::string>& v, google::protobuf::RepeatedPtrField<std::string>* out) {
  out->Reserve(static_cast<int>(v.size()));
  for (const std::string& s : v) out->Add()->assign(s);
}

void AssignHashes(const std::vector<BlockHash>& v,
                  google::protobuf::RepeatedPtrField<std::string>* out) {
  out->Reserve(static_cast<int>(v.size()));
  for (const BlockHash& h : v) {
    out->Add()->assign(reinterpret_cast<const char*>(h.bytes.data()), h.bytes.size());
  }
}

absl::Status ReadHashes(const google::protobuf::RepeatedPtrField<std::string>& in,
                        std::vector<BlockHash>* out) {
  out->resize(in.size());
  for (int i = 0; i < in.size(); ++i) {
    absl::Status s = BlockHash::FromBytes(in.Get(i), &(*out)[i]);
    if (!s.ok()) return absl::InvalidArgumentError(absl::StrCat("block hash ", i, ": ", s.message()));
  }
  return absl::OkStatus();
}

// A logprobs count off the wire: -1 when unset; a negative count with its
// flag set stays below -1, so that Validate refuses it instead of reading it
// as "none".
int32_t LogprobsCount(bool has, int32_t n) {
  if (!has) return -1;
  return n < 0 ? std::min(n, -2) : n;
}

}  // namespace

void ToProto(const SamplingParams& in, v1::SamplingParams* out) {
  out->set_temperature(in.temperature);
  out->set_top_k(in.top_k);
  out->set_top_p(in.top_p);
  out->set_min_p(in.min_p);
  out->set_seed(in.seed.value_or(0));
  out->set_has_seed(in.seed.has_value());
  out->set_max_tokens(in.max_tokens);
  out->set_min_tokens(in.min_tokens);
  out->set_ignore_eos(in.ignore_eos);
  Assign(in.stop_token_ids, out->mutable_stop_token_ids());
  out->set_logprobs(std::max(in.logprobs, 0));
  out->set_has_logprobs(in.logprobs >= 0);
  out->set_prompt_logprobs(std::max(in.prompt_logprobs, 0));
  out->set_has_prompt_logprobs(in.prompt_logprobs >= 0);
  out->set_presence_penalty(in.presence_penalty);
  out->set_frequency_penalty(in.frequency_penalty);
  out->set_repetition_penalty(in.repetition_penalty);
  for (const auto& [id, bias] : in.logit_bias) (*out->mutable_logit_bias())[id] = bias;
  for (const std::vector<int32_t>& word : in.bad_words) {
    Assign(word, out->add_bad_words()->mutable_ids());
  }
  Assign(in.allowed_token_ids, out->mutable_allowed_token_ids());
  out->set_json_schema(in.json_schema);
  out->mutable_choice()->Assign(in.choice.begin(), in.choice.end());
  out->set_regex(in.regex);
  out->set_grammar(in.grammar);
  out->set_disable_any_whitespace(in.disable_any_whitespace);
  out->set_json_schema_after_token(in.json_schema_after_token.value_or(0));
  out->set_has_json_schema_after_token(in.json_schema_after_token.has_value());
}

SamplingParams FromProto(const v1::SamplingParams& in, uint64_t default_seed) {
  SamplingParams out;
  out.temperature = in.temperature();
  out.top_k = in.top_k();
  out.top_p = in.top_p() == 0.0f ? 1.0f : in.top_p();
  out.min_p = in.min_p();
  out.seed = in.has_seed() ? in.seed() : default_seed;
  out.max_tokens = in.max_tokens();
  out.min_tokens = in.min_tokens();
  out.ignore_eos = in.ignore_eos();
  out.stop_token_ids = ToVector(in.stop_token_ids());
  out.logprobs = LogprobsCount(in.has_logprobs(), in.logprobs());
  out.prompt_logprobs = LogprobsCount(in.has_prompt_logprobs(), in.prompt_logprobs());
  out.presence_penalty = in.presence_penalty();
  out.frequency_penalty = in.frequency_penalty();
  out.repetition_penalty = in.repetition_penalty() == 0.0f ? 1.0f : in.repetition_penalty();
  // A proto map has no order: sorted by id, as SamplingParams keeps it.
  out.logit_bias.assign(in.logit_bias().begin(), in.logit_bias().end());
  std::sort(out.logit_bias.begin(), out.logit_bias.end());
  for (const v1::TokenIdSequence& word : in.bad_words()) {
    out.bad_words.push_back(ToVector(word.ids()));
  }
  out.allowed_token_ids = ToVector(in.allowed_token_ids());
  out.json_schema = in.json_schema();
  out.choice.assign(in.choice().begin(), in.choice().end());
  out.regex = in.regex();
  out.grammar = in.grammar();
  out.disable_any_whitespace = in.disable_any_whitespace();
  if (in.has_json_schema_after_token()) out.json_schema_after_token = in.json_schema_after_token();
  return out;
}

void ToProto(const GenerationDefaults& in, v1::GenerationDefaults* out) {
  // An unset field: value 0 (proto3's default) and its has_ flag false.
  out->set_temperature(in.temperature.value_or(0.0f));
  out->set_has_temperature(in.temperature.has_value());
  out->set_top_p(in.top_p.value_or(0.0f));
  out->set_has_top_p(in.top_p.has_value());
  out->set_top_k(in.top_k.value_or(0));
  out->set_has_top_k(in.top_k.has_value());
  out->set_min_p(in.min_p.value_or(0.0f));
  out->set_has_min_p(in.min_p.has_value());
  out->set_repetition_penalty(in.repetition_penalty.value_or(0.0f));
  out->set_has_repetition_penalty(in.repetition_penalty.has_value());
  out->set_max_new_tokens(in.max_new_tokens.value_or(0));
  out->set_has_max_new_tokens(in.max_new_tokens.has_value());
}

GenerationDefaults FromProto(const v1::GenerationDefaults& in) {
  GenerationDefaults out;
  if (in.has_temperature()) out.temperature = in.temperature();
  if (in.has_top_p()) out.top_p = in.top_p();
  if (in.has_top_k()) out.top_k = in.top_k();
  if (in.has_min_p()) out.min_p = in.min_p();
  if (in.has_repetition_penalty()) out.repetition_penalty = in.repetition_penalty();
  if (in.has_max_new_tokens()) out.max_new_tokens = in.max_new_tokens();
  return out;
}

void ToProto(const sched::SchedulerOutput& in, v1::SchedulerOutput* out) {
  out->set_step_id(in.step_id);
  out->set_last_processed_step_id(in.last_processed_step_id);
  out->mutable_scheduled_new_reqs()->Reserve(static_cast<int>(in.scheduled_new_reqs.size()));
  for (const sched::NewRequestData& r : in.scheduled_new_reqs) {
    v1::NewRequestData* p = out->add_scheduled_new_reqs();
    p->set_request_id(r.request_id);
    Assign(r.prompt_token_ids, p->mutable_prompt_token_ids());
    Assign(r.output_token_ids, p->mutable_output_token_ids());
    ToProto(r.sampling, p->mutable_sampling());
    Assign(r.block_ids, p->mutable_block_ids());
    p->set_num_computed_tokens(r.num_computed_tokens);
  }
  out->mutable_scheduled_cached_reqs()->Reserve(
      static_cast<int>(in.scheduled_cached_reqs.size()));
  for (const sched::CachedRequestData& r : in.scheduled_cached_reqs) {
    v1::CachedRequestData* p = out->add_scheduled_cached_reqs();
    p->set_request_id(r.request_id);
    p->set_resumed_from_preemption(r.resumed_from_preemption);
    Assign(r.new_block_ids, p->mutable_new_block_ids());
    Assign(r.all_token_ids, p->mutable_all_token_ids());
    p->set_num_computed_tokens(r.num_computed_tokens);
    p->set_num_output_placeholders(r.num_output_placeholders);
  }
  Assign(in.num_scheduled_tokens, out->mutable_num_scheduled_tokens());
  out->set_total_num_scheduled_tokens(in.total_num_scheduled_tokens);
  Assign(in.finished_req_ids, out->mutable_finished_req_ids());
  Assign(in.preempted_req_ids, out->mutable_preempted_req_ids());
  if (!in.kv_connector_metadata.empty()) {
    v1::KvConnectorMetadata* meta = out->mutable_kv_connector_metadata();
    for (const sched::KvLoad& l : in.kv_connector_metadata.loads) {
      v1::KvLoad* p = meta->add_loads();
      p->set_request_id(l.request_id);
      AssignHashes(l.block_hashes, p->mutable_block_hashes());
      Assign(l.block_ids, p->mutable_block_ids());
    }
    for (const sched::KvStoreOp& s : in.kv_connector_metadata.stores) {
      v1::KvStoreOp* p = meta->add_stores();
      p->set_request_id(s.request_id);
      Assign(s.block_ids, p->mutable_block_ids());
      AssignHashes(s.block_hashes, p->mutable_block_hashes());
      p->set_before_forward(s.before_forward);
    }
  }
}

absl::Status FromProto(const v1::SchedulerOutput& in, sched::SchedulerOutput* out) {
  *out = sched::SchedulerOutput{};
  out->step_id = in.step_id();
  out->last_processed_step_id = in.last_processed_step_id();
  out->scheduled_new_reqs.reserve(in.scheduled_new_reqs_size());
  for (const v1::NewRequestData& p : in.scheduled_new_reqs()) {
    out->scheduled_new_reqs.push_back({
        .request_id = p.request_id(),
        .prompt_token_ids = ToVector(p.prompt_token_ids()),
        .output_token_ids = ToVector(p.output_token_ids()),
        .sampling = FromProto(p.sampling()),
        .block_ids = ToVector(p.block_ids()),
        .num_computed_tokens = p.num_computed_tokens(),
    });
  }
  out->scheduled_cached_reqs.reserve(in.scheduled_cached_reqs_size());
  for (const v1::CachedRequestData& p : in.scheduled_cached_reqs()) {
    out->scheduled_cached_reqs.push_back({
        .request_id = p.request_id(),
        .resumed_from_preemption = p.resumed_from_preemption(),
        .new_block_ids = ToVector(p.new_block_ids()),
        .all_token_ids = ToVector(p.all_token_ids()),
        .num_computed_tokens = p.num_computed_tokens(),
        .num_output_placeholders = p.num_output_placeholders(),
    });
  }
  out->num_scheduled_tokens = ToVector(in.num_scheduled_tokens());
  const size_t num_reqs = out->scheduled_new_reqs.size() + out->scheduled_cached_reqs.size();
  if (out->num_scheduled_tokens.size() != num_reqs) {
    return absl::InvalidArgumentError(absl::StrCat(
        "SchedulerOutput step ", in.step_id(), ": num_scheduled_tokens has ",
        out->num_scheduled_tokens.size(), " entries for ", num_reqs, " scheduled requests"));
  }
  out->total_num_scheduled_tokens = in.total_num_scheduled_tokens();
  out->finished_req_ids = ToVector(in.finished_req_ids());
  out->preempted_req_ids = ToVector(in.preempted_req_ids());
  for (const v1::KvLoad& p : in.kv_connector_metadata().loads()) {
    sched::KvLoad l{.request_id = p.request_id(), .block_ids = ToVector(p.block_ids())};
    absl::Status s = ReadHashes(p.block_hashes(), &l.block_hashes);
    if (!s.ok()) return absl::InvalidArgumentError(absl::StrCat("load of ", p.request_id(), ": ", s.message()));
    if (l.block_hashes.size() != l.block_ids.size()) {
      return absl::InvalidArgumentError(absl::StrCat("load of ", p.request_id(), ": ",
                                                     l.block_hashes.size(), " hashes but ",
                                                     l.block_ids.size(), " block ids"));
    }
    out->kv_connector_metadata.loads.push_back(std::move(l));
  }
  for (const v1::KvStoreOp& p : in.kv_connector_metadata().stores()) {
    sched::KvStoreOp st{.request_id = p.request_id(),
                      .block_ids = ToVector(p.block_ids()),
                      .before_forward = p.before_forward()};
    absl::Status s = ReadHashes(p.block_hashes(), &st.block_hashes);
    if (!s.ok()) return absl::InvalidArgumentError(absl::StrCat("store of ", p.request_id(), ": ", s.message()));
    if (st.block_hashes.size() != st.block_ids.size()) {
      return absl::InvalidArgumentError(absl::StrCat("store of ", p.request_id(), ": ",
                                                     st.block_hashes.size(), " hashes but ",
                                                     st.block_ids.size(), " block ids"));
    }
    out->kv_connector_metadata.stores.push_back(std::move(st));
  }
  return absl::OkStatus();
}

void ToProto(const TokenLogprobs& in, v1::TokenLogprobs* out) {
  out->set_token_id(in.token_id);
  out->set_logprob(in.logprob);
  out->set_rank(in.rank);
  Assign(in.top_token_ids, out->mutable_top_token_ids());
  Assign(in.top_logprobs, out->mutable_top_logprobs());
}

absl::Status FromProto(const v1::TokenLogprobs& in, TokenLogprobs* out) {
  if (in.top_token_ids_size() != in.top_logprobs_size()) {
    return absl::InvalidArgumentError(absl::StrCat("logprobs of token ", in.token_id(), ": ",
                                                   in.top_token_ids_size(), " top ids but ",
                                                   in.top_logprobs_size(), " top logprobs"));
  }
  *out = TokenLogprobs{.token_id = in.token_id(),
                       .logprob = in.logprob(),
                       .rank = in.rank(),
                       .top_token_ids = ToVector(in.top_token_ids()),
                       .top_logprobs = ToVector(in.top_logprobs())};
  return absl::OkStatus();
}

void ToProto(const std::vector<TokenLogprobs>& in,
             google::protobuf::RepeatedPtrField<v1::TokenLogprobs>* out) {
  out->Reserve(static_cast<int>(in.size()));
  for (const TokenLogprobs& t : in) ToProto(t, out->Add());
}

absl::Status FromProto(const google::protobuf::RepeatedPtrField<v1::TokenLogprobs>& in,
                       std::vector<TokenLogprobs>* out) {
  out->resize(static_cast<size_t>(in.size()));
  for (int i = 0; i < in.size(); ++i) {
    TANDEM_RETURN_IF_ERROR(FromProto(in[i], &(*out)[static_cast<size_t>(i)]));
  }
  return absl::OkStatus();
}

void ToProto(const sched::ModelRunnerOutput& in, v1::ModelRunnerOutput* out) {
  out->set_step_id(in.step_id);
  out->set_error(in.error);
  out->set_rejected(in.rejected);
  out->mutable_sampled()->Reserve(static_cast<int>(in.sampled.size()));
  for (const sched::SampledTokens& s : in.sampled) {
    v1::SampledTokens* p = out->add_sampled();
    p->set_request_id(s.request_id);
    Assign(s.token_ids, p->mutable_token_ids());
    ToProto(s.logprobs, p->mutable_logprobs());
    ToProto(s.prompt_logprobs, p->mutable_prompt_logprobs());
    p->set_prompt_logprobs_start(s.prompt_logprobs_start);
    p->set_error(s.error);
  }
  const sched::KvConnectorReport& r = in.kv_connector_report;
  if (!r.empty()) {
    v1::KvConnectorReport* p = out->mutable_kv_connector_report();
    Assign(r.finished_recving, p->mutable_finished_recving());
    Assign(r.finished_sending, p->mutable_finished_sending());
    Assign(r.failed_sending, p->mutable_failed_sending());
    Assign(r.invalid_block_ids, p->mutable_invalid_block_ids());
    p->set_num_load_failed_not_found(r.num_load_failed_not_found);
    p->set_num_load_failed_checksum(r.num_load_failed_checksum);
    p->set_num_load_failed_rpc(r.num_load_failed_rpc);
  }
}

absl::Status FromProto(const v1::ModelRunnerOutput& in, sched::ModelRunnerOutput* out) {
  *out = sched::ModelRunnerOutput{};
  out->step_id = in.step_id();
  out->sampled.reserve(in.sampled_size());
  for (const v1::SampledTokens& p : in.sampled()) {
    sched::SampledTokens& s = out->sampled.emplace_back();
    s.request_id = p.request_id();
    s.token_ids = ToVector(p.token_ids());
    s.prompt_logprobs_start = p.prompt_logprobs_start();
    s.error = p.error();
    TANDEM_RETURN_IF_ERROR(FromProto(p.logprobs(), &s.logprobs));
    TANDEM_RETURN_IF_ERROR(FromProto(p.prompt_logprobs(), &s.prompt_logprobs));
    if (!s.logprobs.empty() && s.logprobs.size() != s.token_ids.size()) {
      return absl::InvalidArgumentError(absl::StrCat("request ", p.request_id(), ": ",
                                                     s.logprobs.size(), " logprobs for ",
                                                     s.token_ids.size(), " sampled tokens"));
    }
  }
  out->kv_connector_report = FromProto(in.kv_connector_report());
  out->error = in.error();
  out->rejected = in.rejected();
  if (out->rejected && out->error.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("step ", in.step_id(), ": a rejected step's output carries no error"));
  }
  return absl::OkStatus();
}

sched::KvConnectorReport FromProto(const v1::KvConnectorReport& in) {
  return sched::KvConnectorReport{.finished_recving = ToVector(in.finished_recving()),
                                  .finished_sending = ToVector(in.finished_sending()),
                                  .failed_sending = ToVector(in.failed_sending()),
                                  .invalid_block_ids = ToVector(in.invalid_block_ids()),
                                  .num_load_failed_not_found = in.num_load_failed_not_found(),
                                  .num_load_failed_checksum = in.num_load_failed_checksum(),
                                  .num_load_failed_rpc = in.num_load_failed_rpc()};
}

v1::FinishReason ToProto(FinishReason in) {
  switch (in) {
    case FinishReason::kStop:
      return v1::FINISH_REASON_STOP;
    case FinishReason::kLength:
      return v1::FINISH_REASON_LENGTH;
    case FinishReason::kAbort:
      return v1::FINISH_REASON_ABORT;
    case FinishReason::kError:
      return v1::FINISH_REASON_ERROR;
    case FinishReason::kNone:
      break;
  }
  return v1::FINISH_REASON_UNSPECIFIED;
}

FinishReason FromProto(v1::FinishReason in) {
  switch (in) {
    case v1::FINISH_REASON_STOP:
      return FinishReason::kStop;
    case v1::FINISH_REASON_LENGTH:
      return FinishReason::kLength;
    case v1::FINISH_REASON_ABORT:
      return FinishReason::kAbort;
    case v1::FINISH_REASON_ERROR:
      return FinishReason::kError;
    default:
      return FinishReason::kNone;
  }
}

}  // namespace tandem::rpc
