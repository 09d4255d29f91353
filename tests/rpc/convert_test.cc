#include "tandem/rpc/convert.h"

#include <gtest/gtest.h>

#include "tandem/rpc/service_convert.h"
#include "tandem/rpc/status.h"

namespace tandem::rpc {
namespace {

BlockHash Hash(uint8_t seed) {
  BlockHash h;
  for (size_t i = 0; i < h.bytes.size(); ++i) h.bytes[i] = static_cast<uint8_t>(seed + i);
  return h;
}

sched::SchedulerOutput MakeOutput() {
  sched::SchedulerOutput out;
  out.step_id = 42;
  out.scheduled_new_reqs.push_back({
      .request_id = "a",
      .prompt_token_ids = {1, 5, 9},
      .output_token_ids = {11, 12},
      .sampling = {.temperature = 0.7f,
                   .top_k = 5,
                   .top_p = 0.9f,
                   .min_p = 0.05f,
                   .presence_penalty = -0.5f,
                   .frequency_penalty = 1.25f,
                   .repetition_penalty = 1.1f,
                   .logit_bias = {{2, -100.0f}, {17, 0.5f}, {300, 3.0f}},
                   .bad_words = {{9}, {5, 6, 7}},
                   .allowed_token_ids = {40, 2, 40},
                   .json_schema = R"({"type":"integer"})",
                   .choice = {"yes", "no \u00e9"},
                   .regex = "[a-z]+\\d",
                   .disable_any_whitespace = true,
                   .json_schema_after_token = 0,
                   .seed = 1234567890123ull,
                   .max_tokens = 7,
                   .min_tokens = 2,
                   .ignore_eos = true,
                   .stop_token_ids = {3, 4}},
      .block_ids = {7, 8},
      .num_computed_tokens = 16,
  });
  out.scheduled_cached_reqs.push_back({.request_id = "b", .new_block_ids = {3},
                                       .num_computed_tokens = 33, .num_output_placeholders = 1});
  out.scheduled_cached_reqs.push_back({.request_id = "c", .resumed_from_preemption = true,
                                       .new_block_ids = {1, 2}, .all_token_ids = {1, 2, 3},
                                       .num_computed_tokens = 0});
  out.num_scheduled_tokens = {3, 1, 3};
  out.total_num_scheduled_tokens = 7;
  out.finished_req_ids = {"x", "y"};
  out.preempted_req_ids = {"c"};
  out.kv_connector_metadata.loads.push_back(
      {.request_id = "a", .block_hashes = {Hash(1)}, .block_ids = {7}});
  out.kv_connector_metadata.stores.push_back(
      {.request_id = "b", .block_ids = {2, 3}, .block_hashes = {Hash(2), Hash(3)}});
  return out;
}

void ExpectEqual(const SamplingParams& a, const SamplingParams& b) {
  EXPECT_EQ(a.temperature, b.temperature);
  EXPECT_EQ(a.top_k, b.top_k);
  EXPECT_EQ(a.top_p, b.top_p);
  EXPECT_EQ(a.min_p, b.min_p);
  EXPECT_EQ(a.presence_penalty, b.presence_penalty);
  EXPECT_EQ(a.frequency_penalty, b.frequency_penalty);
  EXPECT_EQ(a.repetition_penalty, b.repetition_penalty);
  EXPECT_EQ(a.logit_bias, b.logit_bias);  // sorted again after the map
  EXPECT_EQ(a.bad_words, b.bad_words);
  EXPECT_EQ(a.allowed_token_ids, b.allowed_token_ids);
  EXPECT_EQ(a.json_schema, b.json_schema);
  EXPECT_EQ(a.choice, b.choice);
  EXPECT_EQ(a.regex, b.regex);
  EXPECT_EQ(a.disable_any_whitespace, b.disable_any_whitespace);
  EXPECT_EQ(a.json_schema_after_token, b.json_schema_after_token);
  EXPECT_EQ(a.seed, b.seed);
  EXPECT_EQ(a.max_tokens, b.max_tokens);
  EXPECT_EQ(a.min_tokens, b.min_tokens);
  EXPECT_EQ(a.ignore_eos, b.ignore_eos);
  EXPECT_EQ(a.stop_token_ids, b.stop_token_ids);
}

TEST(ConvertTest, SchedulerOutputRoundTripsThroughBytes) {
  sched::SchedulerOutput in = MakeOutput();
  v1::SchedulerOutput proto;
  ToProto(in, &proto);
  std::string bytes = proto.SerializeAsString();
  v1::SchedulerOutput parsed;
  ASSERT_TRUE(parsed.ParseFromString(bytes));
  sched::SchedulerOutput out;
  ASSERT_TRUE(FromProto(parsed, &out).ok());

  EXPECT_EQ(out.step_id, 42u);
  ASSERT_EQ(out.scheduled_new_reqs.size(), 1u);
  const auto& n = out.scheduled_new_reqs[0];
  EXPECT_EQ(n.request_id, "a");
  EXPECT_EQ(n.prompt_token_ids, (std::vector<int32_t>{1, 5, 9}));
  EXPECT_EQ(n.output_token_ids, (std::vector<int32_t>{11, 12}));
  ExpectEqual(n.sampling, in.scheduled_new_reqs[0].sampling);
  EXPECT_EQ(n.block_ids, (std::vector<int32_t>{7, 8}));
  EXPECT_EQ(n.num_computed_tokens, 16);
  ASSERT_EQ(out.scheduled_cached_reqs.size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    const auto& a = in.scheduled_cached_reqs[i];
    const auto& b = out.scheduled_cached_reqs[i];
    EXPECT_EQ(a.request_id, b.request_id);
    EXPECT_EQ(a.resumed_from_preemption, b.resumed_from_preemption);
    EXPECT_EQ(a.new_block_ids, b.new_block_ids);
    EXPECT_EQ(a.all_token_ids, b.all_token_ids);
    EXPECT_EQ(a.num_computed_tokens, b.num_computed_tokens);
    EXPECT_EQ(a.num_output_placeholders, b.num_output_placeholders);
  }
  EXPECT_EQ(out.num_scheduled_tokens, in.num_scheduled_tokens);
  EXPECT_EQ(out.total_num_scheduled_tokens, 7);
  EXPECT_EQ(out.finished_req_ids, in.finished_req_ids);
  EXPECT_EQ(out.preempted_req_ids, in.preempted_req_ids);
  ASSERT_EQ(out.kv_connector_metadata.loads.size(), 1u);
  EXPECT_EQ(out.kv_connector_metadata.loads[0].block_hashes[0], Hash(1));
  EXPECT_EQ(out.kv_connector_metadata.loads[0].block_ids, (std::vector<int32_t>{7}));
  ASSERT_EQ(out.kv_connector_metadata.stores.size(), 1u);
  EXPECT_EQ(out.kv_connector_metadata.stores[0].block_hashes,
            (std::vector<BlockHash>{Hash(2), Hash(3)}));
  EXPECT_EQ(out.kv_connector_metadata.stores[0].block_ids, (std::vector<int32_t>{2, 3}));
}

TEST(ConvertTest, RejectsMismatchedTokenCounts) {
  sched::SchedulerOutput in = MakeOutput();
  in.num_scheduled_tokens.pop_back();
  v1::SchedulerOutput proto;
  ToProto(in, &proto);
  sched::SchedulerOutput out;
  absl::Status s = FromProto(proto, &out);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(s.message()).find("num_scheduled_tokens has 2 entries for 3"),
            std::string::npos)
      << s;
}

TEST(ConvertTest, RejectsShortBlockHash) {
  v1::SchedulerOutput proto;
  v1::KvLoad* load = proto.mutable_kv_connector_metadata()->add_loads();
  load->set_request_id("r");
  load->add_block_hashes("short");
  load->add_block_ids(1);
  sched::SchedulerOutput out;
  EXPECT_EQ(FromProto(proto, &out).code(), absl::StatusCode::kInvalidArgument);
}

TEST(ConvertTest, ModelRunnerOutputRoundTrips) {
  sched::ModelRunnerOutput in{.step_id = 9,
                              .sampled = {{.request_id = "a", .token_ids = {5}},
                                          {.request_id = "b", .token_ids = {}}},
                              .kv_connector_report = {.finished_recving = {"a"},
                                                      .finished_sending = {"b", "c"},
                                                      .failed_sending = {"c"},
                                                      .invalid_block_ids = {4, 5},
                                                      .num_load_failed_not_found = 1,
                                                      .num_load_failed_checksum = 2,
                                                      .num_load_failed_rpc = 3},
                              .error = "step 9 failed",
                              .rejected = true};
  v1::ModelRunnerOutput proto;
  ToProto(in, &proto);
  v1::ModelRunnerOutput parsed;
  ASSERT_TRUE(parsed.ParseFromString(proto.SerializeAsString()));
  sched::ModelRunnerOutput out;
  ASSERT_TRUE(FromProto(parsed, &out).ok());
  EXPECT_EQ(out.step_id, 9u);
  ASSERT_EQ(out.sampled.size(), 2u);
  EXPECT_EQ(out.sampled[0].request_id, "a");
  EXPECT_EQ(out.sampled[0].token_ids, (std::vector<int32_t>{5}));
  EXPECT_TRUE(out.sampled[1].token_ids.empty());
  EXPECT_EQ(out.kv_connector_report.finished_recving, (std::vector<std::string>{"a"}));
  EXPECT_EQ(out.kv_connector_report.finished_sending, (std::vector<std::string>{"b", "c"}));
  EXPECT_EQ(out.kv_connector_report.failed_sending, (std::vector<std::string>{"c"}));
  EXPECT_EQ(out.kv_connector_report.invalid_block_ids, (std::vector<int32_t>{4, 5}));
  EXPECT_EQ(out.kv_connector_report.num_load_failed_not_found, 1);
  EXPECT_EQ(out.kv_connector_report.num_load_failed_checksum, 2);
  EXPECT_EQ(out.kv_connector_report.num_load_failed_rpc, 3);
  EXPECT_EQ(out.error, "step 9 failed");
  EXPECT_TRUE(out.rejected);
  // A rejection must say why.
  v1::ModelRunnerOutput silent;
  silent.set_step_id(9);
  silent.set_rejected(true);
  EXPECT_EQ(FromProto(silent, &out).code(), absl::StatusCode::kInvalidArgument);

  // A report of counts alone still travels; an empty one adds nothing.
  sched::ModelRunnerOutput counts_only{.step_id = 10,
                                       .kv_connector_report = {.num_load_failed_rpc = 4}};
  proto.Clear();
  ToProto(counts_only, &proto);
  EXPECT_EQ(proto.kv_connector_report().num_load_failed_rpc(), 4);
  proto.Clear();
  ToProto(sched::ModelRunnerOutput{.step_id = 11}, &proto);
  EXPECT_FALSE(proto.has_kv_connector_report());
}

TEST(ConvertTest, SamplingDefaultsFromProto3Zeroes) {
  v1::SamplingParams p;
  p.set_max_tokens(3);
  SamplingParams s = FromProto(p, /*default_seed=*/77);
  EXPECT_EQ(s.top_p, 1.0f);  // proto3 zero read as "off"
  EXPECT_EQ(s.repetition_penalty, 1.0f);
  EXPECT_EQ(s.presence_penalty, 0.0f);
  EXPECT_EQ(s.seed, 77u);    // no seed given: the server's
  EXPECT_EQ(s.max_tokens, 3);
  EXPECT_FALSE(s.json_schema_after_token);  // token 0 only with its has_ flag
  p.set_has_seed(true);
  p.set_seed(5);
  EXPECT_EQ(FromProto(p, 77).seed, 5u);
}

TEST(ConvertTest, LogprobsRoundTripAndZeroMeansTheTokensOwnNotNone) {
  const TokenLogprobs lp{.token_id = 7,
                         .logprob = -0.25f,
                         .rank = 2,
                         .top_token_ids = {3, 7},
                         .top_logprobs = {-0.1f, -0.25f}};
  sched::ModelRunnerOutput in{.step_id = 4};
  in.sampled.push_back({.request_id = "a",
                        .token_ids = {7},
                        .logprobs = {lp},
                        .prompt_logprobs = {lp, lp},
                        .prompt_logprobs_start = 5,
                        .error = "no token can go on"});
  v1::ModelRunnerOutput proto;
  ToProto(in, &proto);
  v1::ModelRunnerOutput parsed;
  ASSERT_TRUE(parsed.ParseFromString(proto.SerializeAsString()));
  sched::ModelRunnerOutput out;
  ASSERT_TRUE(FromProto(parsed, &out).ok());
  ASSERT_EQ(out.sampled.size(), 1u);
  EXPECT_EQ(out.sampled[0].logprobs, std::vector<TokenLogprobs>{lp});
  EXPECT_EQ(out.sampled[0].prompt_logprobs, (std::vector<TokenLogprobs>{lp, lp}));
  EXPECT_EQ(out.sampled[0].prompt_logprobs_start, 5);
  EXPECT_EQ(out.sampled[0].error, "no token can go on");
  // Logprobs not parallel to the tokens, or top lists of two lengths: refused.
  parsed.mutable_sampled(0)->add_logprobs();
  EXPECT_EQ(FromProto(parsed, &out).code(), absl::StatusCode::kInvalidArgument);
  parsed.mutable_sampled(0)->mutable_logprobs()->RemoveLast();
  parsed.mutable_sampled(0)->mutable_prompt_logprobs(1)->add_top_logprobs(0.0f);
  EXPECT_EQ(FromProto(parsed, &out).code(), absl::StatusCode::kInvalidArgument);

  // Sampling: 0 asks for the token's own logprob; unset is -1; a negative
  // count with its flag set stays invalid.
  SamplingParams sp{.logprobs = 0, .prompt_logprobs = -1};
  v1::SamplingParams p;
  ToProto(sp, &p);
  EXPECT_TRUE(p.has_logprobs());
  EXPECT_FALSE(p.has_prompt_logprobs());
  const SamplingParams back = FromProto(p);
  EXPECT_EQ(back.logprobs, 0);
  EXPECT_EQ(back.prompt_logprobs, -1);
  p.set_has_prompt_logprobs(true);
  p.set_prompt_logprobs(-1);
  EXPECT_FALSE(FromProto(p).Validate(100).ok());
}

TEST(ConvertTest, GenerationDefaultsKeepUnsetFieldsUnsetThroughBytes) {
  auto round_trip = [](const GenerationDefaults& in) {
    v1::GenerationDefaults proto;
    ToProto(in, &proto);
    v1::GenerationDefaults parsed;
    EXPECT_TRUE(parsed.ParseFromString(proto.SerializeAsString()));
    return FromProto(parsed);
  };
  // A default equal to proto3's zero is still a default (temperature 0 =
  // greedy, top_k 0 = off): presence, not the value, says "set".
  GenerationDefaults zeroes = round_trip({.temperature = 0.0f, .top_k = 0});
  EXPECT_EQ(zeroes.temperature, 0.0f);
  EXPECT_EQ(zeroes.top_k, 0);
  EXPECT_FALSE(zeroes.top_p);
  EXPECT_FALSE(zeroes.min_p);
  EXPECT_FALSE(zeroes.repetition_penalty);
  EXPECT_FALSE(zeroes.max_new_tokens);
  GenerationDefaults all = round_trip({.temperature = 0.6f,
                                       .top_p = 0.9f,
                                       .top_k = 64,
                                       .min_p = 0.05f,
                                       .repetition_penalty = 1.1f,
                                       .max_new_tokens = 512});
  EXPECT_EQ(all.max_new_tokens, 512);
  EXPECT_EQ(all.temperature, 0.6f);
  EXPECT_EQ(all.top_p, 0.9f);
  EXPECT_EQ(all.top_k, 64);
  EXPECT_EQ(all.min_p, 0.05f);
  EXPECT_EQ(all.repetition_penalty, 1.1f);
  EXPECT_TRUE(round_trip({}).empty());
  v1::GenerationDefaults reused;
  ToProto(all, &reused);
  ToProto({.top_p = 0.5f}, &reused);  // overwrites, never merges
  EXPECT_FALSE(FromProto(reused).temperature);
}

TEST(ConvertTest, FinishReasonsRoundTripAndUnknownIsNone) {
  for (FinishReason r :
       {FinishReason::kStop, FinishReason::kLength, FinishReason::kAbort, FinishReason::kError}) {
    EXPECT_EQ(FromProto(ToProto(r)), r) << FinishReasonName(r);
    EXPECT_NE(ToProto(r), v1::FINISH_REASON_UNSPECIFIED) << FinishReasonName(r);
  }
  EXPECT_EQ(ToProto(FinishReason::kNone), v1::FINISH_REASON_UNSPECIFIED);
  EXPECT_EQ(FromProto(v1::FINISH_REASON_UNSPECIFIED), FinishReason::kNone);
  EXPECT_EQ(FromProto(static_cast<v1::FinishReason>(99)), FinishReason::kNone);
}

// GetModelInfo through bytes: every field the frontend reads arrives.
TEST(ConvertTest, ModelInfoRoundTripsThroughBytes) {
  ModelInfo in{.ready = true,
               .model_name = "m",
               .model_fingerprint = "fp",
               .vocab_size = 32000,
               .max_model_len = 4096,
               .block_size = 16,
               .num_kv_blocks = 900,
               .eos_token_id = 2,
               .extra_eos_token_ids = {7, 9},
               .generation = {.temperature = 0.6f, .top_p = 0.9f},
               .max_logprobs = 20};
  v1::GetModelInfoResponse proto;
  ToProto(in, &proto);
  v1::GetModelInfoResponse parsed;
  ASSERT_TRUE(parsed.ParseFromString(proto.SerializeAsString()));
  const ModelInfo out = FromProto(parsed);
  EXPECT_TRUE(out.ready);
  EXPECT_EQ(out.model_name, "m");
  EXPECT_EQ(out.model_fingerprint, "fp");
  EXPECT_EQ(out.vocab_size, 32000);
  EXPECT_EQ(out.max_model_len, 4096);
  EXPECT_EQ(out.block_size, 16);
  EXPECT_EQ(out.num_kv_blocks, 900);
  EXPECT_EQ(out.eos_token_id, 2);
  EXPECT_EQ(out.extra_eos_token_ids, (std::vector<int32_t>{7, 9}));
  EXPECT_EQ(out.generation.temperature, 0.6f);
  EXPECT_EQ(out.generation.top_p, 0.9f);
  EXPECT_FALSE(out.generation.top_k.has_value());
  EXPECT_EQ(out.max_logprobs, 20);
}

// The frontend's Generate request: has_seed exactly when it has a seed (the
// scheduler's own seed otherwise).
TEST(ConvertTest, GenerateRequestSendsASeedOnlyWhenItHasOne) {
  GenerateRequest in{.request_id = "cmpl-1-0",
                     .prompt_token_ids = {1, 5, 9},
                     .sampling = {.temperature = 0.7f, .max_tokens = 8, .logprobs = 2},
                     .priority = 3,
                     .cache_salt = "tenant:a"};
  v1::GenerateRequest proto;
  ToProto(in, &proto);
  EXPECT_EQ(proto.request_id(), "cmpl-1-0");
  EXPECT_EQ(proto.prompt_token_ids_size(), 3);
  EXPECT_EQ(proto.priority(), 3);
  EXPECT_EQ(proto.cache_salt(), "tenant:a");
  EXPECT_FALSE(proto.sampling().has_seed());
  EXPECT_EQ(proto.sampling().seed(), 0u);
  EXPECT_TRUE(proto.sampling().has_logprobs());
  EXPECT_FALSE(proto.sampling().has_prompt_logprobs());
  EXPECT_EQ(FromProto(proto.sampling(), 77).seed, 77u);
  in.sampling.seed = 11;
  ToProto(in, &proto);
  EXPECT_TRUE(proto.sampling().has_seed());
  EXPECT_EQ(FromProto(proto.sampling(), 77).seed, 11u);
  EXPECT_EQ(FromProto(proto.sampling(), 77).max_tokens, 8);
}

TEST(ConvertTest, GenerateResponseKeepsTokensAndCutsUnevenTopLists) {
  v1::GenerateResponse proto;
  proto.add_token_ids(4);
  proto.add_token_ids(6);
  v1::TokenLogprobs* lp = proto.add_logprobs();
  lp->set_token_id(4);
  lp->set_logprob(-0.5f);
  lp->set_rank(2);
  lp->add_top_token_ids(3);
  lp->add_top_token_ids(4);
  lp->add_top_logprobs(-0.1f);  // one short
  proto.set_finish_reason(v1::FINISH_REASON_LENGTH);
  proto.mutable_usage()->set_output_tokens(2);
  proto.mutable_usage()->set_cached_tokens_external(16);
  const GenerateResponse out = FromProto(proto);
  EXPECT_EQ(out.token_ids, (std::vector<int32_t>{4, 6}));
  ASSERT_EQ(out.logprobs.size(), 1u);
  EXPECT_EQ(out.logprobs[0].rank, 2);
  EXPECT_EQ(out.logprobs[0].top_token_ids, std::vector<int32_t>{3});
  EXPECT_EQ(out.logprobs[0].top_logprobs, std::vector<float>{-0.1f});
  EXPECT_EQ(out.finish_reason, FinishReason::kLength);
  ASSERT_TRUE(out.usage.has_value());
  EXPECT_EQ(out.usage->output_tokens, 2);
  EXPECT_EQ(out.usage->cached_tokens_external, 16);
  EXPECT_EQ(FromProto(v1::GenerateResponse()).finish_reason, FinishReason::kNone);
}

TEST(StatusTest, CodesAndMessagesSurviveBothWays) {
  absl::Status a = absl::ResourceExhaustedError("queue full: 10 waiting");
  grpc::Status g = ToGrpcStatus(a);
  EXPECT_EQ(g.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_EQ(g.error_message(), "queue full: 10 waiting");
  EXPECT_EQ(FromGrpcStatus(g), a);
  EXPECT_TRUE(ToGrpcStatus(absl::OkStatus()).ok());
  absl::Status c = FromGrpcStatus(grpc::Status(grpc::StatusCode::UNAVAILABLE, "down"), "worker");
  EXPECT_EQ(c.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(c.message(), "worker: down");
}

// The scheduler's side of the same call: what the frontend sends arrives
// whole, and the scheduler's own seed stands in for a missing one.
TEST(ConvertTest, GenerateRequestRoundTripsToTheScheduler) {
  GenerateRequest in{.request_id = "cmpl-2-1",
                     .prompt_token_ids = {3, 1, 4, 1, 5},
                     .sampling = {.temperature = 0.5f, .top_k = 7, .max_tokens = 9},
                     .priority = -2,
                     .cache_salt = "tenant:b"};
  v1::GenerateRequest proto;
  ToProto(in, &proto);
  GenerateRequest back = FromProto(proto, 77);
  EXPECT_EQ(back.request_id, in.request_id);
  EXPECT_EQ(back.prompt_token_ids, in.prompt_token_ids);
  EXPECT_EQ(back.priority, -2);
  EXPECT_EQ(back.cache_salt, "tenant:b");
  EXPECT_EQ(back.sampling.top_k, 7);
  EXPECT_EQ(back.sampling.max_tokens, 9);
  EXPECT_EQ(back.sampling.seed, 77u);  // none sent: the scheduler's
  in.sampling.seed = 5;
  ToProto(in, &proto);
  EXPECT_EQ(FromProto(proto, 77).sampling.seed, 5u);
}

// What the scheduler streams reads back the same on the frontend: tokens,
// logprobs, prompt logprobs, the finish reason, and usage only when sent.
TEST(ConvertTest, GenerateResponseRoundTripsToTheFrontend) {
  const TokenLogprobs lp{.token_id = 9,
                         .logprob = -0.25f,
                         .rank = 1,
                         .top_token_ids = {9, 2},
                         .top_logprobs = {-0.25f, -2.0f}};
  GenerateResponse in{.token_ids = {9, 8},
                      .logprobs = {lp, lp},
                      .prompt_logprobs = {lp},
                      .finish_reason = FinishReason::kStop,
                      .usage = GenerateUsage{.prompt_tokens = 5,
                                             .output_tokens = 2,
                                             .cached_tokens_local = 16,
                                             .cached_tokens_external = 32}};
  v1::GenerateResponse proto;
  ToProto(in, &proto);
  GenerateResponse back = FromProto(proto);
  EXPECT_EQ(back.token_ids, in.token_ids);
  EXPECT_EQ(back.logprobs, in.logprobs);
  EXPECT_EQ(back.prompt_logprobs, in.prompt_logprobs);
  EXPECT_EQ(back.finish_reason, FinishReason::kStop);
  ASSERT_TRUE(back.usage.has_value());
  EXPECT_EQ(back.usage->prompt_tokens, 5);
  EXPECT_EQ(back.usage->output_tokens, 2);
  EXPECT_EQ(back.usage->cached_tokens_local, 16);
  EXPECT_EQ(back.usage->cached_tokens_external, 32);
  // A message before the last: no reason, no usage.
  v1::GenerateResponse tokens_only;
  ToProto(GenerateResponse{.token_ids = {1}}, &tokens_only);
  EXPECT_FALSE(tokens_only.has_usage());
  EXPECT_EQ(tokens_only.finish_reason(), v1::FINISH_REASON_UNSPECIFIED);
  EXPECT_FALSE(FromProto(tokens_only).usage.has_value());
}

// GetStats: the engine's counters, the scheduler's and the connector's only
// while present.
TEST(ConvertTest, EngineStatsFillGetStats) {
  engine::EngineStats e{.worker_connected = true,
                        .num_requests = 3,
                        .max_steps_in_flight = 2,
                        .num_steps_sent = 40,
                        .load_failed_checksum = 6};
  v1::GetStatsResponse out;
  ToProto(e, &out);
  EXPECT_TRUE(out.worker_connected());
  EXPECT_EQ(out.num_active_streams(), 3);
  EXPECT_EQ(out.max_steps_in_flight(), 2);
  EXPECT_EQ(out.num_steps_sent(), 40u);
  EXPECT_EQ(out.external_load_failed_checksum(), 6u);
  EXPECT_EQ(out.num_total_blocks(), 0);
  e.has_scheduler = true;
  e.num_total_blocks = 100;
  e.scheduler.num_preemptions_total = 4;
  e.has_kv_connector = true;
  e.kv_connector.lookups = 12;
  e.kv_connector.lookup_latency_ns_sum = 3'000'000'000;
  ToProto(e, &out);
  EXPECT_EQ(out.num_total_blocks(), 100);
  EXPECT_EQ(out.num_preemptions(), 4u);
  EXPECT_EQ(out.external_lookups(), 12u);
  EXPECT_DOUBLE_EQ(out.external_lookup_latency_seconds_sum(), 3.0);
}

}  // namespace
}  // namespace tandem::rpc
