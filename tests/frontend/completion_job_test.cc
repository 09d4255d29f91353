// The completion job in process (tandem/frontend/completion_job.h): a fake
// transport that records the calls the job starts and lets the test play
// each call's messages and end, a sink that records the response, and the
// real llama2.c tokenizer for the text.
#include "tandem/frontend/completion_job.h"

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_split.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tandem/frontend/openai_responses.h"
#include "tandem/tokenizer/chat_template.h"
#include "tandem/tokenizer/tokenizer.h"

namespace tandem::frontend {
namespace {

using Json = nlohmann::json;

const std::string kTokenizer = std::string(TANDEM_SHARED_DIR) + "/models/tokenizer.bin";

struct FakeCall final : GenerateCall {
  void Cancel() override { ++cancels; }
  int cancels = 0;
};

// Replicas "r0", "r1", ... (the first not excluded serves a call), or none.
class FakeTransport final : public GenerateTransport {
 public:
  struct Call {
    CallId id;
    GenerateRequest request;
    std::vector<std::string> exclude;
    std::string replica;
    std::shared_ptr<FakeCall> handle;
  };
  explicit FakeTransport(int num_replicas) : num_replicas_(num_replicas) {}

  std::optional<Started> StartCall(std::shared_ptr<CompletionJob> job, CallId id,
                                   const GenerateRequest& request,
                                   const std::vector<std::string>& exclude) override {
    for (int r = 0; r < num_replicas_; ++r) {
      const std::string name = "r" + std::to_string(r);
      if (std::find(exclude.begin(), exclude.end(), name) != exclude.end()) continue;
      calls.push_back({id, request, exclude, name, std::make_shared<FakeCall>()});
      return Started{.replica = name, .call = calls.back().handle};
    }
    return std::nullopt;
  }

  std::vector<Call> calls;  // in start order

 private:
  int num_replicas_;
};

struct Recording {
  bool stream_started = false;
  bool ended = false;
  std::optional<std::string> body;  // Respond
  std::optional<ApiError> error;    // RespondError
  std::vector<std::string> events;  // Write
  std::function<void()> gone;
  std::vector<int> responses;  // CompletionJobMetrics::OnResponse
  int retries = 0;
};

class RecordingSink final : public CompletionSink {
 public:
  explicit RecordingSink(Recording* r) : r_(r) {}
  void Respond(const std::string& json) override { r_->body = json; }
  void RespondError(const ApiError& error) override { r_->error = error; }
  void StartStream() override {
    EXPECT_FALSE(r_->stream_started);
    r_->stream_started = true;
  }
  void Write(const std::string& event) override {
    EXPECT_TRUE(r_->stream_started);
    EXPECT_FALSE(r_->ended);
    r_->events.push_back(event);
  }
  void End() override { r_->ended = true; }
  void WatchClientGone(std::function<void()> gone) override { r_->gone = std::move(gone); }

 private:
  Recording* r_;
};

class RecordingMetrics final : public CompletionJobMetrics {
 public:
  explicit RecordingMetrics(Recording* r) : r_(r) {}
  void OnResponse(int http_status) override { r_->responses.push_back(http_status); }
  void OnRetry() override { ++r_->retries; }

 private:
  Recording* r_;
};

class CompletionJobTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto tok = tokenizer::LoadTokenizer(kTokenizer);
    ASSERT_TRUE(tok.ok()) << tok.status();
    auto chat = tokenizer::ChatTemplate::Builtin("llama-2");  // for /v1/responses
    ASSERT_TRUE(chat.ok()) << chat.status();
    served_ = new ServedTokenizer(std::shared_ptr<const tokenizer::Tokenizer>(std::move(*tok)),
                                  *std::move(chat));
  }
  static void TearDownTestSuite() { delete served_; }

  // Starts a /v1/completions (or /v1/responses) job for `body` with
  // `num_replicas` replicas.
  void Start(const Json& body, int num_replicas = 3, Endpoint endpoint = Endpoint::kCompletions) {
    CompletionRequest request;
    auto e = endpoint == Endpoint::kResponses
                 ? ParseResponsesRequest(body.dump(), &request)
                 : ParseCompletionRequest(body.dump(), endpoint, &request);
    ASSERT_FALSE(e) << e->message;
    auto transport = std::make_unique<FakeTransport>(num_replicas);
    transport_ = transport.get();
    job_ = std::make_shared<CompletionJob>(
        *served_, std::move(transport), std::make_unique<RecordingSink>(&rec_),
        std::make_unique<RecordingMetrics>(&rec_), std::move(request));
    job_->Start(ModelInfo{.model_name = "stories",
                          .vocab_size = served_->tokenizer().vocab_size(),
                          .max_model_len = 256,
                          .max_logprobs = 20},
                std::vector<std::string>{"stories"});
  }

  static std::vector<int32_t> Ids(const std::string& text) {
    auto ids = served_->tokenizer().Encode(text, {.add_special_tokens = false});
    EXPECT_TRUE(ids.ok());
    return *ids;
  }
  // The text `ids` add after `prompt` (what the job's detokenizer gives).
  static std::string TextAfter(std::vector<int32_t> prompt, const std::vector<int32_t>& ids) {
    const std::string before = *served_->tokenizer().Decode(prompt);
    prompt.insert(prompt.end(), ids.begin(), ids.end());
    return served_->tokenizer().Decode(prompt)->substr(before.size());
  }

  // Plays a message of call `k` (in start order).
  void Tokens(size_t k, std::vector<int32_t> ids) {
    job_->OnCallMessage(transport_->calls.at(k).id, {.token_ids = std::move(ids)});
  }
  void Finish(size_t k, std::vector<int32_t> ids, FinishReason reason, int32_t output_tokens,
              int32_t cached = 0) {
    job_->OnCallMessage(
        transport_->calls.at(k).id,
        {.token_ids = std::move(ids),
         .finish_reason = reason,
         .usage = GenerateUsage{.output_tokens = output_tokens, .cached_tokens_local = cached}});
  }
  void End(size_t k, absl::Status status = absl::OkStatus()) {
    job_->OnCallDone(transport_->calls.at(k).id, transport_->calls.at(k).replica, status);
  }

  // The stream's events as JSON, without [DONE] (checked to be last).
  std::vector<Json> Events() const {
    std::vector<Json> out;
    EXPECT_FALSE(rec_.events.empty());
    if (rec_.events.empty()) return out;
    EXPECT_EQ(rec_.events.back(), kStreamDone);
    for (size_t i = 0; i + 1 < rec_.events.size(); ++i) {
      EXPECT_TRUE(absl::StartsWith(rec_.events[i], "data: ")) << rec_.events[i];
      out.push_back(Json::parse(rec_.events[i].substr(6)));
    }
    return out;
  }
  // Each choice's streamed text, by index.
  std::map<int, std::string> StreamedText() const {
    std::map<int, std::string> text;
    for (const Json& e : Events()) {
      for (const Json& c : e["choices"])
        text[c["index"].get<int>()] += c["text"].get<std::string>();
    }
    return text;
  }

  static ServedTokenizer* served_;
  Recording rec_;
  FakeTransport* transport_ = nullptr;
  std::shared_ptr<CompletionJob> job_;
};

ServedTokenizer* CompletionJobTest::served_ = nullptr;

TEST_F(CompletionJobTest, FansOutNSamplesOfEachPromptAsIndexPromptTimesNPlusSample) {
  Start({{"prompt", {"Once upon a time", "The cat"}}, {"n", 2}, {"seed", 10}, {"max_tokens", 5}});
  ASSERT_EQ(transport_->calls.size(), 4u);
  const std::vector<std::vector<int32_t>> prompts = {
      *served_->tokenizer().Encode("Once upon a time"), *served_->tokenizer().Encode("The cat")};
  for (int k = 0; k < 4; ++k) {
    const FakeTransport::Call& call = transport_->calls[k];
    EXPECT_EQ(call.id.choice, k);
    EXPECT_EQ(call.id.attempt, 1);
    EXPECT_TRUE(absl::EndsWith(call.request.request_id, "-" + std::to_string(k)));
    EXPECT_EQ(call.request.prompt_token_ids, prompts[k / 2]) << k;
    EXPECT_EQ(call.request.sampling.seed, std::optional<uint64_t>(10 + k % 2)) << k;  // seed + j
    EXPECT_EQ(call.request.sampling.max_tokens, 5);
  }
  // Each choice its own words, the messages interleaved.
  const std::vector<std::string> words = {" there was", " a dog", " sat down", " ran off"};
  for (int k : {3, 1, 0, 2}) Tokens(k, {Ids(words[k])[0]});
  for (int k : {0, 2, 1, 3}) {
    const std::vector<int32_t> ids = Ids(words[k]);
    Finish(k, {ids.begin() + 1, ids.end()}, FinishReason::kLength, static_cast<int32_t>(ids.size()),
           /*cached=*/k);
  }
  ASSERT_TRUE(rec_.body) << (rec_.error ? rec_.error->message : "no response");
  EXPECT_FALSE(rec_.stream_started);
  const Json body = Json::parse(*rec_.body);
  ASSERT_EQ(body["choices"].size(), 4u);
  int64_t completion_tokens = 0;
  for (int k = 0; k < 4; ++k) {
    const Json& c = body["choices"][k];
    EXPECT_EQ(c["index"], k);
    EXPECT_EQ(c["text"], TextAfter(prompts[k / 2], Ids(words[k]))) << k;
    EXPECT_EQ(c["finish_reason"], "length");
    completion_tokens += static_cast<int64_t>(Ids(words[k]).size());
  }
  // Each prompt counts once, every sample's tokens count; cached: the most
  // any sample of a prompt found.
  EXPECT_EQ(body["usage"]["prompt_tokens"], prompts[0].size() + prompts[1].size());
  EXPECT_EQ(body["usage"]["completion_tokens"], completion_tokens);
  EXPECT_EQ(body["usage"]["total_tokens"],
            prompts[0].size() + prompts[1].size() + completion_tokens);
  EXPECT_EQ(body["usage"]["prompt_tokens_details"]["cached_tokens"], 1 + 3);
  EXPECT_EQ(rec_.responses, std::vector<int>{200});
}

TEST_F(CompletionJobTest, StreamsEachChoiceUnderItsIndexThenUsageThenDone) {
  Start({{"prompt", "Once upon a time"},
         {"n", 2},
         {"stream", true},
         {"stream_options", {{"include_usage", true}}}});
  ASSERT_EQ(transport_->calls.size(), 2u);
  EXPECT_EQ(transport_->calls[0].request.sampling.seed, std::nullopt);  // no seed: the server's
  const std::vector<int32_t> prompt = transport_->calls[0].request.prompt_token_ids;
  const std::vector<int32_t> a = Ids(" there was a dog"), b = Ids(" the sun shone");
  Tokens(1, {b[0]});
  EXPECT_TRUE(rec_.stream_started);  // with the first token
  Tokens(0, {a[0], a[1]});
  Finish(0, {a.begin() + 2, a.end()}, FinishReason::kStop, static_cast<int32_t>(a.size()));
  EXPECT_FALSE(rec_.ended);
  Finish(1, {b.begin() + 1, b.end()}, FinishReason::kLength, static_cast<int32_t>(b.size()));
  EXPECT_TRUE(rec_.ended);
  EXPECT_EQ(StreamedText(),
            (std::map<int, std::string>{{0, TextAfter(prompt, a)}, {1, TextAfter(prompt, b)}}));
  const std::vector<Json> events = Events();
  std::map<int, std::string> finish;
  for (const Json& e : events) {
    for (const Json& c : e["choices"]) {
      if (!c["finish_reason"].is_null()) finish[c["index"].get<int>()] = c["finish_reason"];
    }
  }
  EXPECT_EQ(finish, (std::map<int, std::string>{{0, "stop"}, {1, "length"}}));
  const Json& usage = events.back()["usage"];
  EXPECT_TRUE(events.back()["choices"].empty());
  EXPECT_EQ(usage["prompt_tokens"], prompt.size());
  EXPECT_EQ(usage["completion_tokens"], a.size() + b.size());
  EXPECT_EQ(usage["total_tokens"], prompt.size() + a.size() + b.size());
}

TEST_F(CompletionJobTest, RetriesOnAnotherReplicaWhenUnavailableBeforeAnyToken) {
  Start({{"prompt", "Once upon a time"}, {"stream", true}});
  ASSERT_EQ(transport_->calls.size(), 1u);
  End(0, absl::UnavailableError("connection refused"));
  ASSERT_EQ(transport_->calls.size(), 2u);
  EXPECT_EQ(transport_->calls[1].id.attempt, 2);
  EXPECT_EQ(transport_->calls[1].exclude, std::vector<std::string>{"r0"});
  EXPECT_EQ(transport_->calls[1].replica, "r1");
  EXPECT_EQ(transport_->calls[1].request.request_id, transport_->calls[0].request.request_id);
  EXPECT_EQ(rec_.retries, 1);
  EXPECT_FALSE(rec_.stream_started);  // nothing was sent: the client sees no retry
  const std::vector<int32_t> ids = Ids(" there was");
  Tokens(0, {ids[0]});  // a late message of the first attempt: ignored
  EXPECT_FALSE(rec_.stream_started);
  Finish(1, ids, FinishReason::kLength, static_cast<int32_t>(ids.size()));
  End(1);
  EXPECT_EQ(StreamedText()[0], TextAfter(transport_->calls[0].request.prompt_token_ids, ids));
  EXPECT_EQ(rec_.responses, std::vector<int>{200});
}

TEST_F(CompletionJobTest, UnavailableAfterATokenEndsTheStreamWithAnErrorEvent) {
  Start({{"prompt", "Once upon a time"}, {"stream", true}});
  Tokens(0, Ids(" there"));
  End(0, absl::UnavailableError("replica died"));
  EXPECT_EQ(transport_->calls.size(), 1u);  // no retry: the client has text
  EXPECT_EQ(rec_.retries, 0);
  ASSERT_TRUE(rec_.ended);
  const std::vector<Json> events = Events();
  ASSERT_FALSE(events.empty());
  EXPECT_EQ(events.back()["error"]["message"], "replica died");
  EXPECT_EQ(rec_.responses, std::vector<int>{503});
}

// /v1/responses streams OpenAI's typed events ("event: T" and "data:"
// lines) and ends with the response object, without [DONE]; a replica lost
// after text ends the stream with an error event, also without [DONE].
TEST_F(CompletionJobTest, AResponsesStreamEndsWithTheResponseAndNoDoneMarker) {
  for (const bool dies : {false, true}) {
    SCOPED_TRACE(dies ? "the replica dies" : "the answer ends");
    rec_ = Recording{};
    Start({{"input", "Once upon a time"}, {"stream", true}}, 1, Endpoint::kResponses);
    ASSERT_EQ(transport_->calls.size(), 1u);
    const std::vector<int32_t> prompt = transport_->calls[0].request.prompt_token_ids;
    const std::vector<int32_t> a = Ids(" there was a dog");
    Tokens(0, {a[0], a[1]});
    if (dies) {
      End(0, absl::UnavailableError("replica died"));
    } else {
      Finish(0, {a.begin() + 2, a.end()}, FinishReason::kStop, static_cast<int32_t>(a.size()));
    }
    ASSERT_TRUE(rec_.ended);
    std::string deltas;
    std::vector<Json> events;
    for (const std::string& sse : rec_.events) {
      EXPECT_EQ(sse.find("[DONE]"), std::string::npos) << sse;
      for (const std::string& event :
           std::vector<std::string>(absl::StrSplit(sse, "\n\n", absl::SkipEmpty()))) {
        const size_t data = event.find("\ndata: ");
        ASSERT_NE(data, std::string::npos) << event;
        events.push_back(Json::parse(event.substr(data + 7)));
        EXPECT_EQ(event.substr(0, data), "event: " + events.back()["type"].get<std::string>());
        if (events.back()["type"] == "response.output_text.delta") {
          deltas += events.back()["delta"].get<std::string>();
        }
      }
    }
    ASSERT_FALSE(events.empty());
    EXPECT_EQ(events.front()["type"], "response.created");
    if (dies) {
      EXPECT_EQ(deltas, TextAfter(prompt, {a[0], a[1]}));
      EXPECT_EQ(events.back()["type"], "error");
      EXPECT_EQ(events.back()["message"], "replica died");
      EXPECT_EQ(rec_.responses, std::vector<int>{503});
    } else {
      EXPECT_EQ(deltas, TextAfter(prompt, a));
      EXPECT_EQ(events.back()["type"], "response.completed");
      const Json& response = events.back()["response"];
      EXPECT_EQ(response["output"][0]["content"][0]["text"], deltas);
      EXPECT_EQ(response["usage"]["input_tokens"], prompt.size());
      EXPECT_EQ(response["usage"]["output_tokens"], a.size());
      EXPECT_EQ(rec_.responses, std::vector<int>{200});
    }
  }
}

// A response not streamed has shown the client nothing: a replica that dies
// after some tokens costs a run on another, not the request. What the first
// call took (text, ids, logprobs, usage) is dropped.
TEST_F(CompletionJobTest, UnavailableAfterTokensRunsANonStreamedChoiceAgainElsewhere) {
  Start({{"prompt", "Once upon a time"}, {"logprobs", 1}});
  const std::vector<int32_t> lost = Ids(" a dragon");
  Tokens(0, lost);
  End(0, absl::UnavailableError("replica died"));
  ASSERT_EQ(transport_->calls.size(), 2u);
  EXPECT_EQ(transport_->calls[1].replica, "r1");
  EXPECT_EQ(rec_.retries, 1);
  EXPECT_FALSE(rec_.body);
  EXPECT_FALSE(rec_.error);
  const std::vector<int32_t> ids = Ids(" there was");
  Finish(1, ids, FinishReason::kLength, static_cast<int32_t>(ids.size()));
  End(1);
  ASSERT_TRUE(rec_.body);
  const Json body = Json::parse(*rec_.body);
  const std::vector<int32_t>& prompt = transport_->calls[0].request.prompt_token_ids;
  EXPECT_EQ(body["choices"][0]["text"], TextAfter(prompt, ids));
  EXPECT_EQ(body["choices"][0]["logprobs"]["tokens"].size(), ids.size());
  EXPECT_EQ(body["usage"]["completion_tokens"], ids.size());
  EXPECT_EQ(rec_.responses, std::vector<int>{200});
}

TEST_F(CompletionJobTest, TriesEveryReplicaOnceThenAnswers503) {
  Start({{"prompt", "Once upon a time"}}, /*num_replicas=*/3);
  for (size_t k = 0; k < 3; ++k) {
    ASSERT_EQ(transport_->calls.size(), k + 1);
    End(k, absl::UnavailableError("draining"));
  }
  EXPECT_EQ(transport_->calls.size(), 3u);
  EXPECT_EQ(transport_->calls[2].exclude, (std::vector<std::string>{"r0", "r1"}));
  ASSERT_TRUE(rec_.error);
  EXPECT_EQ(rec_.error->http_status, 503);
  EXPECT_EQ(rec_.error->message, "no scheduler replica is serving (last: r2: draining)");
  EXPECT_EQ(rec_.responses, std::vector<int>{503});
}

TEST_F(CompletionJobTest, SchedulerErrorsKeepTheirStatusBeforeTheStreamStarts) {
  Start({{"prompt", "Once upon a time"}, {"stream", true}, {"n", 2}});
  End(1, absl::InvalidArgumentError("min_tokens is larger than max_tokens"));
  EXPECT_FALSE(rec_.stream_started);
  ASSERT_TRUE(rec_.error);
  EXPECT_EQ(rec_.error->http_status, 400);
  EXPECT_EQ(transport_->calls[0].handle->cancels, 1);  // the other choice's call
  EXPECT_EQ(transport_->calls.size(), 2u);
}

TEST_F(CompletionJobTest, AStreamEndedWithoutFinishReasonIsA500) {
  Start({{"prompt", "Once upon a time"}});
  Tokens(0, Ids(" there"));
  End(0);
  ASSERT_TRUE(rec_.error);
  EXPECT_EQ(rec_.error->http_status, 500);
}

// "cat sat" arrives as " the cat" then " sat down" (the tokenizer adds the
// leading spaces): the text stops before
// it, finish_reason "stop", and the call is cancelled.
TEST_F(CompletionJobTest, StopStringAcrossTwoMessagesEndsTheChoiceAndCancelsItsCall) {
  for (bool stream : {false, true}) {
    SCOPED_TRACE(stream ? "stream" : "non-stream");
    rec_ = {};
    Start({{"prompt", "Once upon a time"}, {"stop", {"cat sat"}}, {"stream", stream}});
    const std::vector<int32_t> prompt = transport_->calls[0].request.prompt_token_ids;
    const std::vector<int32_t> first = Ids("the cat"), second = Ids("sat down");
    Tokens(0, first);
    EXPECT_EQ(transport_->calls[0].handle->cancels, 0);
    Tokens(0, second);
    EXPECT_EQ(transport_->calls[0].handle->cancels, 1);
    Tokens(0, Ids(" more"));  // in flight before the cancel: ignored
    End(0, absl::CancelledError("cancelled"));
    std::string text = TextAfter(prompt, first);
    text.erase(text.find("cat"));
    Json choice;
    if (stream) {
      ASSERT_TRUE(rec_.ended);
      EXPECT_EQ(StreamedText()[0], text);
      choice = Events().back()["choices"][0];
    } else {
      ASSERT_TRUE(rec_.body);
      choice = Json::parse(*rec_.body)["choices"][0];
      EXPECT_EQ(choice["text"], text);
      // Up to the token that completed the stop string (" sat").
      EXPECT_EQ(Json::parse(*rec_.body)["usage"]["completion_tokens"], first.size() + 1);
    }
    EXPECT_EQ(choice["finish_reason"], "stop");
    EXPECT_EQ(choice["stop_reason"], "cat sat");
    EXPECT_EQ(rec_.responses, std::vector<int>{200});
  }
}

TEST_F(CompletionJobTest, ClientGoneCancelsEveryCall) {
  Start({{"prompt", {"Once upon a time", "The cat"}}, {"n", 3}, {"stream", true}});
  ASSERT_EQ(transport_->calls.size(), 6u);
  Tokens(2, Ids(" there"));
  const size_t written = rec_.events.size();
  ASSERT_TRUE(rec_.gone);
  rec_.gone();
  for (const FakeTransport::Call& call : transport_->calls) EXPECT_EQ(call.handle->cancels, 1);
  Tokens(4, Ids(" there"));
  End(5, absl::CancelledError("cancelled"));
  EXPECT_EQ(rec_.events.size(), written);  // nothing more for the client
  EXPECT_FALSE(rec_.ended);
  EXPECT_EQ(rec_.responses, std::vector<int>{499});
}

// Echo with max_tokens 0 (vLLM's echo without generation, which lm-eval's
// legacy loglikelihood asks): the prompt alone, with its logprobs; the one
// token the engine computes is neither shown nor counted.
TEST_F(CompletionJobTest, EchoWithMaxTokensZeroAnswersThePromptAlone) {
  for (const bool stream : {false, true}) {
    SCOPED_TRACE(stream ? "stream" : "not streamed");
    rec_ = {};
    Start({{"prompt", "Once upon a time"},
           {"echo", true},
           {"max_tokens", 0},
           {"logprobs", 1},
           {"stream", stream},
           {"return_token_ids", true}});
    ASSERT_FALSE(rec_.error) << rec_.error->message;
    ASSERT_EQ(transport_->calls.size(), 1u);
    EXPECT_EQ(transport_->calls[0].request.sampling.max_tokens, 1);
    const size_t prompt_len = transport_->calls[0].request.prompt_token_ids.size();
    Finish(0, Ids(" there"), FinishReason::kLength, 1);
    End(0);
    Json choice;
    if (stream) {
      const std::vector<Json> events = Events();
      ASSERT_EQ(events.size(), 1u);
      choice = events[0]["choices"][0];
    } else {
      ASSERT_TRUE(rec_.body);
      const Json body = Json::parse(*rec_.body);
      EXPECT_EQ(body["usage"]["completion_tokens"], 0);
      choice = body["choices"][0];
    }
    EXPECT_EQ(choice["text"], "Once upon a time");
    EXPECT_EQ(choice["finish_reason"], "length");
    EXPECT_TRUE(choice["token_ids"].empty()) << choice.dump();
    EXPECT_EQ(choice["logprobs"]["tokens"].size(), prompt_len) << choice.dump();
  }
  // Without echo, 0 is no request.
  rec_ = {};
  CompletionRequest r;
  auto e = ParseCompletionRequest(Json{{"prompt", "x"}, {"max_tokens", 0}}.dump(),
                                  Endpoint::kCompletions, &r);
  ASSERT_TRUE(e);
  EXPECT_EQ(e->param, "max_tokens");
}

TEST_F(CompletionJobTest, ErrorsBeforeAnyCallNameTheField) {
  Start({{"prompt", "Once upon a time"}, {"model", "gpt-4"}});
  ASSERT_TRUE(rec_.error);
  EXPECT_EQ(rec_.error->http_status, 404);
  EXPECT_EQ(rec_.error->code, "model_not_found");
  rec_ = {};
  Start({{"prompt", "Once upon a time"}, {"max_tokens", 300}});
  ASSERT_TRUE(rec_.error);
  EXPECT_EQ(rec_.error->code, "context_length_exceeded");
  EXPECT_TRUE(transport_->calls.empty());
  rec_ = {};
  Start({{"prompt", "Once upon a time"}}, /*num_replicas=*/0);
  ASSERT_TRUE(rec_.error);
  EXPECT_EQ(rec_.error->http_status, 503);
}

}  // namespace
}  // namespace tandem::frontend
