// Cancels half of 200 concurrent streams at random moments (client cancel,
// and a few through the Abort RPC). The others finish with exactly the tokens
// they get when sent alone, and afterwards neither the scheduler nor the
// worker holds any request state and every KV block is free.
//
// Abort RPC (generation_service.h): for a running request it answers
// found=true and the request's stream ends OK with FINISH_REASON_ABORT and
// the tokens streamed so far; for an unknown or finished id found=false.
#include <atomic>
#include <random>
#include <thread>

#include "gtest/gtest.h"
#include "harness.h"

namespace tandem::testing {
namespace {

TEST(AbortTest, CancelHalfOfTwoHundredStreams) {
  const std::string dir = MakeTempDir("tandem-abort");
  Service worker = StartWorker(dir, "worker", {});
  Service scheduler = StartScheduler(dir, "scheduler", worker.address(), {});
  auto stub = GenerationStub(scheduler.address());

  constexpr int kNum = 200;
  std::mt19937 rng(99);
  std::vector<v1::GenerateRequest> requests;
  for (int i = 0; i < kNum; ++i) {
    std::vector<int32_t> prompt{1, static_cast<int32_t>(2 + i % 7), 300, 301};
    const int extra = static_cast<int>(rng() % 40);
    for (int j = 0; j < extra; ++j) prompt.push_back(static_cast<int32_t>(2 + rng() % 510));
    v1::GenerateRequest r = MakeRequest(prompt, 20 + static_cast<int32_t>(rng() % 80),
                                        i % 3 == 0 ? 0.8f : 0.0f, /*seed=*/7 * i,
                                        /*ignore_eos=*/true);
    r.set_request_id("a" + std::to_string(i));
    requests.push_back(r);
  }
  std::vector<int> cancel_after_us(kNum, -1);
  for (int i = 1; i < kNum; i += 2) cancel_after_us[i] = static_cast<int>(rng() % 60000);
  // Every fifth cancelled request goes through the Abort RPC, once it has
  // streamed a token; it asks for more tokens than it can get before that.
  auto by_rpc = [](int i) { return i % 10 == 1; };
  for (int i = 0; i < kNum; ++i) {
    if (by_rpc(i)) requests[i].mutable_sampling()->set_max_tokens(400);
  }

  struct Outcome {
    grpc::Status status;
    std::vector<int32_t> tokens;
    v1::FinishReason reason = v1::FINISH_REASON_UNSPECIFIED;
    v1::Usage usage;
    grpc::Status abort_status;  // of the Abort RPC
    bool abort_found = false;
  };
  std::vector<Outcome> outcomes(kNum);
  std::vector<std::atomic<bool>> streamed(kNum);
  std::vector<std::thread> threads;
  for (int i = 0; i < kNum; ++i) {
    threads.emplace_back([&, i] {
      grpc::ClientContext context;
      context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(120));
      auto reader = stub->Generate(&context, requests[i]);
      std::thread canceller;
      if (cancel_after_us[i] >= 0) {
        canceller = std::thread([&, i] {
          if (by_rpc(i)) {
            while (!streamed[i].load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
          }
          std::this_thread::sleep_for(std::chrono::microseconds(cancel_after_us[i]));
          if (by_rpc(i)) {
            grpc::ClientContext abort_context;
            abort_context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
            v1::AbortRequest abort;
            abort.set_request_id(requests[i].request_id());
            v1::AbortResponse response;
            outcomes[i].abort_status = stub->Abort(&abort_context, abort, &response);
            outcomes[i].abort_found = response.found();
          } else {
            context.TryCancel();
          }
        });
      }
      v1::GenerateResponse msg;
      while (reader->Read(&msg)) {
        outcomes[i].tokens.insert(outcomes[i].tokens.end(), msg.token_ids().begin(),
                                  msg.token_ids().end());
        if (!outcomes[i].tokens.empty()) streamed[i].store(true);
        if (msg.finish_reason() != v1::FINISH_REASON_UNSPECIFIED) {
          outcomes[i].reason = msg.finish_reason();
          outcomes[i].usage = msg.usage();
        }
      }
      streamed[i].store(true);  // the canceller must not wait for a failed stream
      outcomes[i].status = reader->Finish();
      if (canceller.joinable()) canceller.join();
    });
  }
  for (auto& t : threads) t.join();

  int cancelled = 0, aborted = 0, num_by_rpc = 0;
  for (int i = 0; i < kNum; ++i) {
    SCOPED_TRACE("request " + std::to_string(i));
    const Outcome& o = outcomes[i];
    if (cancel_after_us[i] < 0) {
      ASSERT_TRUE(o.status.ok()) << o.status.error_message();
      EXPECT_EQ(o.reason, v1::FINISH_REASON_LENGTH);
      EXPECT_EQ(static_cast<int32_t>(o.tokens.size()), requests[i].sampling().max_tokens());
      continue;
    }
    if (by_rpc(i)) {
      // Aborted while running: found, and the stream ends normally with
      // reason ABORT, the tokens so far and their usage.
      ++num_by_rpc;
      ASSERT_TRUE(o.abort_status.ok()) << o.abort_status.error_message();
      EXPECT_TRUE(o.abort_found) << "Abort did not find a running request";
      ASSERT_TRUE(o.status.ok()) << o.status.error_code() << " " << o.status.error_message();
      EXPECT_EQ(o.reason, v1::FINISH_REASON_ABORT);
      EXPECT_GE(o.tokens.size(), 1u);
      EXPECT_LT(static_cast<int32_t>(o.tokens.size()), requests[i].sampling().max_tokens());
      EXPECT_EQ(o.usage.output_tokens(), static_cast<int32_t>(o.tokens.size()));
      EXPECT_EQ(o.usage.prompt_tokens(), requests[i].prompt_token_ids_size());
      if (o.abort_found && o.reason == v1::FINISH_REASON_ABORT) ++aborted;
      continue;
    }
    if (o.status.error_code() == grpc::StatusCode::CANCELLED) {
      ++cancelled;
    } else {
      // The request finished before the client got round to cancelling.
      ASSERT_TRUE(o.status.ok()) << o.status.error_code() << " " << o.status.error_message();
      EXPECT_EQ(static_cast<int32_t>(o.tokens.size()), requests[i].sampling().max_tokens());
    }
  }
  EXPECT_GT(cancelled, 0);
  EXPECT_EQ(num_by_rpc, kNum / 10);
  EXPECT_EQ(aborted, num_by_rpc) << "every Abort RPC must abort its running request";

  // Abort of an id that is not running (finished, or never seen) finds nothing.
  for (const std::string& id : {requests[0].request_id(), std::string("no-such-request")}) {
    grpc::ClientContext abort_context;
    v1::AbortRequest abort;
    abort.set_request_id(id);
    v1::AbortResponse response;
    ASSERT_TRUE(stub->Abort(&abort_context, abort, &response).ok());
    EXPECT_FALSE(response.found()) << id;
  }

  // Survivors against the same requests sent one at a time.
  for (int i = 0; i < kNum; i += 2) {
    GenerateResult alone = RunGenerate(stub.get(), requests[i]);
    ASSERT_TRUE(alone.status.ok()) << alone.status.error_message();
    EXPECT_EQ(outcomes[i].tokens, alone.tokens) << "request " << i;
  }

  // No state left anywhere.
  auto worker_stub = WorkerStub(worker.address());
  EXPECT_TRUE(WaitFor([&] {
    v1::GetStatsResponse s = GetStats(stub.get());
    return s.num_active_streams() == 0 && s.num_running() == 0 && s.num_waiting() == 0 &&
           s.num_free_blocks() == s.num_total_blocks() && s.num_total_blocks() > 0;
  })) << GetStats(stub.get()).DebugString();
  EXPECT_TRUE(WaitFor([&] { return Describe(worker_stub.get()).num_active_requests() == 0; }))
      << Describe(worker_stub.get()).DebugString();
  std::printf("cancelled %d, aborted via RPC %d\n", cancelled, aborted);
}

}  // namespace
}  // namespace tandem::testing
