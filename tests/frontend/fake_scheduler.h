// An in-process tandem.v1.Generation server for tests of the real frontend
// binary: answers GetModelInfo with the model it is given, records every
// GenerateRequest, and answers each Generate with scripted output ids, one
// message per token, the last one carrying the finish reason and usage,
// and the logprobs a request asks for (FakeTokenLogprobs). HoldStreamEnds
// keeps each stream open after its last message until released.
#pragma once

#include <cmath>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "../integration/harness.h"
#include "gtest/gtest.h"
#include "tandem/rpc/server.h"

namespace tandem::testing {

// The fake's log-probabilities of token `id` at `position` (of the output,
// or of the prompt) with `n` alternatives: on even positions `id` is the most
// likely (rank 1, top_token_ids[0]); on odd ones it is outside the top n
// (rank n + 1); every fifth position scores -inf.
inline v1::TokenLogprobs FakeTokenLogprobs(int32_t id, int32_t position, int32_t n) {
  v1::TokenLogprobs lp;
  lp.set_token_id(id);
  const bool top = position % 2 == 0;
  const float own = position % 5 == 4 ? -INFINITY : -0.5f - 0.25f * static_cast<float>(position);
  lp.set_logprob(own);
  lp.set_rank(top ? 1 : n + 1);
  for (int32_t i = 0; i < n; ++i) {
    lp.add_top_token_ids(top && i == 0 ? id : 300 + 7 * position + i);
    lp.add_top_logprobs(top && i == 0 ? own : -0.125f * static_cast<float>(i + 1));
  }
  return lp;
}

class FakeScheduler final : public v1::Generation::Service {
 public:
  explicit FakeScheduler(v1::GetModelInfoResponse info) : info_(std::move(info)) {
    static const bool health = (rpc::EnableReflectionAndHealth(), true);  // once per process
    (void)health;
    grpc::ServerBuilder builder;
    builder.RegisterService(this);
    auto server = rpc::BuildAndStart(&builder, {.listen_address = "127.0.0.1:0"}, &port_);
    EXPECT_TRUE(server.ok()) << server.status();
    if (server.ok()) {
      server_ = std::move(server).value();
      rpc::SetServing(server_.get(), "tandem.v1.Generation", true);
    }
  }
  ~FakeScheduler() override {
    ReleaseStreamEnds();
    if (server_ != nullptr) server_->Shutdown();
  }

  std::string address() const { return "127.0.0.1:" + std::to_string(port_); }

  // What every later Generate call answers (default: token 100, STOP).
  // `last_token_stops`: the last id is the EOS or stop token that ended the
  // request, as the scheduler marks it.
  void SetOutput(std::vector<int32_t> ids, v1::FinishReason finish, bool last_token_stops = false) {
    std::lock_guard<std::mutex> lock(mu_);
    output_ = std::move(ids);
    finish_ = finish;
    last_token_stops_ = last_token_stops;
  }

  // The prefix-cache counts every later call reports (default: none).
  void SetCached(int32_t local, int32_t external) {
    std::lock_guard<std::mutex> lock(mu_);
    cached_local_ = local;
    cached_external_ = external;
  }

  // From now on each Generate call, once its last message is written (the
  // frontend has its answer), keeps the stream open until
  // ReleaseStreamEnds(): the call's end reaches the frontend later.
  void HoldStreamEnds() {
    std::lock_guard<std::mutex> lock(mu_);
    hold_ends_ = true;
  }
  void ReleaseStreamEnds() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      hold_ends_ = false;
    }
    ends_cv_.notify_all();
  }
  // Generate calls held at their end now.
  int held_ends() {
    std::lock_guard<std::mutex> lock(mu_);
    return held_ends_;
  }

  // Every Generate request, in arrival order.
  std::vector<v1::GenerateRequest> requests() {
    std::lock_guard<std::mutex> lock(mu_);
    return requests_;
  }
  std::vector<v1::SamplingParams> sampled() {
    std::vector<v1::SamplingParams> out;
    for (const v1::GenerateRequest& r : requests()) out.push_back(r.sampling());
    return out;
  }

  grpc::Status GetModelInfo(grpc::ServerContext*, const v1::GetModelInfoRequest*,
                            v1::GetModelInfoResponse* response) override {
    *response = info_;
    return grpc::Status::OK;
  }

  grpc::Status Generate(grpc::ServerContext*, const v1::GenerateRequest* request,
                        grpc::ServerWriter<v1::GenerateResponse>* writer) override {
    std::vector<int32_t> output;
    v1::FinishReason finish;
    bool last_token_stops = false;
    v1::Usage usage;
    {
      std::lock_guard<std::mutex> lock(mu_);
      requests_.push_back(*request);
      output = output_;
      finish = finish_;
      last_token_stops = last_token_stops_;
      usage.set_cached_tokens_local(cached_local_);
      usage.set_cached_tokens_external(cached_external_);
    }
    usage.set_prompt_tokens(request->prompt_token_ids_size());
    for (size_t i = 0; i < output.size(); ++i) {
      v1::GenerateResponse response;
      response.set_request_id(request->request_id());
      response.add_token_ids(output[i]);
      const v1::SamplingParams& sampling = request->sampling();
      if (sampling.has_logprobs()) {
        *response.add_logprobs() =
            FakeTokenLogprobs(output[i], static_cast<int32_t>(i), sampling.logprobs());
      }
      if (i == 0 && sampling.has_prompt_logprobs()) {
        for (int p = 1; p < request->prompt_token_ids_size(); ++p) {
          *response.add_prompt_logprobs() =
              FakeTokenLogprobs(request->prompt_token_ids(p), p, sampling.prompt_logprobs());
        }
      }
      // As the scheduler: the counts so far in every message.
      usage.set_output_tokens(static_cast<int32_t>(i + 1));
      *response.mutable_usage() = usage;
      if (i + 1 == output.size()) {
        response.set_finish_reason(finish);
        response.set_last_token_stops(last_token_stops);
      }
      if (!writer->Write(response)) break;  // the frontend cancelled
    }
    std::unique_lock<std::mutex> lock(mu_);
    ++held_ends_;
    ends_cv_.wait(lock, [&] { return !hold_ends_; });
    --held_ends_;
    return grpc::Status::OK;
  }

 private:
  const v1::GetModelInfoResponse info_;
  int port_ = 0;
  std::unique_ptr<grpc::Server> server_;
  std::mutex mu_;
  std::vector<v1::GenerateRequest> requests_;
  std::vector<int32_t> output_ = {100};
  v1::FinishReason finish_ = v1::FINISH_REASON_STOP;
  bool last_token_stops_ = false;
  int32_t cached_local_ = 0, cached_external_ = 0;
  bool hold_ends_ = false;
  int held_ends_ = 0;
  std::condition_variable ends_cv_;
};

// A model as GetModelInfo describes it, without generation defaults.
inline v1::GetModelInfoResponse FakeModelInfo(const std::string& fingerprint,
                                              int32_t vocab_size = 32000,
                                              int32_t max_model_len = 256) {
  v1::GetModelInfoResponse info;
  info.set_model_name("fake");
  info.set_model_fingerprint(fingerprint);
  info.set_vocab_size(vocab_size);
  info.set_max_model_len(max_model_len);
  info.set_block_size(16);
  info.set_num_kv_blocks(64);
  info.set_eos_token_id(2);
  info.set_max_logprobs(20);  // the scheduler's default --max-logprobs
  return info;
}

}  // namespace tandem::testing
