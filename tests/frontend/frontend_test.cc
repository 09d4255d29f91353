// tandem-frontend end to end: the real worker, scheduler and frontend
// binaries on loopback, driven by the npm `openai` SDK (a client we did not
// write) and by plain HTTP.
//   - random32k with the Llama 2 tokenizer: every reference case, streamed
//     and not, gives the reference ids and SentencePiece's text of them,
//     and the same ids as the gRPC path;
//   - every error case has its status and OpenAI error body, and a stream
//     running beside them is unaffected;
//   - a client that disconnects mid-stream aborts its request on the
//     scheduler, which frees its blocks;
//   - a client that reads late still gets the whole stream, in order;
//   - randomized concurrent clients (hang-ups, slow readers, pipelining,
//     bad bodies) get whole answers and leave nothing behind;
//   - calls to a replica spread over --connections-per-replica connections;
//   - --model DIR alone gives the tokenizer and chat template
//     (chat_template.jinja) of the directory; --chat-template overrides;
//   - three replicas: prefix affinity hits the local prefix cache at least
//     twice as often as round-robin, and a replica killed with SIGKILL loses
//     no request that had not started streaming.
// tools/test.sh also runs it against binaries built with ThreadSanitizer;
// there the frontends read tokenizer.bin (kLlama2Tokenizer) and the
// randomized test runs fewer clients.
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <filesystem>
#include <map>
#include <mutex>
#include <optional>
#include <random>
#include <fstream>
#include <set>
#include <sstream>
#include <thread>

#include "../integration/harness.h"
#include "gtest/gtest.h"
#include "httplib.h"
#include "nlohmann/json.hpp"
#include "tandem/tokenizer/tokenizer.h"

namespace tandem::testing {
namespace {

using Json = nlohmann::json;

const std::string kShared = TANDEM_SHARED_DIR;
const std::string kModels = kShared + "/models";

// The frontends' Llama 2 tokenizer. A sanitizer build cannot load
// SentencePiece beside gRPC's protobuf (its runtime refuses the module's
// RTLD_DEEPBIND: libs/tokenizer/sentencepiece_shim.h), so there they read
// llama2.c's tokenizer.bin of the same vocabulary, from which run.c made
// random32k.reference.json.
#ifdef TANDEM_SANITIZER_BUILD
const std::string kLlama2Tokenizer = kModels + "/tokenizer.bin";
#else
const std::string kLlama2Tokenizer = kModels + "/tokenizer.model";
#endif

Json ReadJson(const std::string& path) {
  std::ifstream f(path);
  return Json::parse(f);
}

struct HttpResult {
  int status = -1;
  Json body;
  std::string raw;
};

HttpResult Post(const std::string& address, const std::string& path, const Json& body,
                const httplib::Headers& headers = {}) {
  httplib::Client client("http://" + address);
  client.set_read_timeout(120, 0);
  auto res = client.Post(path, headers, body.dump(), "application/json");
  HttpResult out;
  if (!res) return out;
  out.status = res->status;
  out.raw = res->body;
  out.body = Json::parse(res->body, nullptr, false);
  return out;
}

std::string Get(const std::string& address, const std::string& path) {
  httplib::Client client("http://" + address);
  auto res = client.Get(path);
  return res ? res->body : "";
}

// The value of an unlabelled Prometheus series, or -1.
double Metric(const std::string& text, const std::string& name) {
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(name + " ", 0) == 0) return std::stod(line.substr(name.size() + 1));
  }
  return -1;
}

// The ids and text of an SSE completion stream's body.
struct Streamed {
  std::vector<int32_t> ids;
  std::string text;
  std::string finish_reason;
  bool done = false;
};
Streamed ParseSse(const std::string& body) {
  Streamed out;
  std::istringstream in(body);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("data: ", 0) != 0) continue;
    const std::string data = line.substr(6);
    if (data == "[DONE]") {
      out.done = true;
      continue;
    }
    const Json chunk = Json::parse(data);
    for (const Json& c : chunk["choices"]) {
      out.text += c.value("text", "");
      for (const Json& id : c.value("token_ids", Json::array())) out.ids.push_back(id);
      if (!c["finish_reason"].is_null()) out.finish_reason = c["finish_reason"];
    }
  }
  return out;
}

// The text of `output` generated after `prompt`: Decode(prompt + output)
// minus Decode(prompt), as vLLM's detokenizer gives it (the first word
// keeps its leading space).
std::string Continuation(const tokenizer::Tokenizer& tok, const std::vector<int32_t>& prompt,
                         const std::vector<int32_t>& output) {
  std::vector<int32_t> all = prompt;
  all.insert(all.end(), output.begin(), output.end());
  const std::string whole = tok.Decode(all, {.skip_special_tokens = true}).value();
  const std::string head = tok.Decode(prompt, {.skip_special_tokens = true}).value();
  EXPECT_EQ(whole.substr(0, head.size()), head);
  return whole.substr(head.size());
}

// Shrinks a socket's receive buffer and segment size (SO_RCVBUF,
// TCP_MAXSEG: on loopback the peer's send buffer grows with the segment
// size), so that a peer's sends fill it soon.
void SmallBuffers(int fd) {
  const int receive_buffer = 2048, segment = 536;
  setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &receive_buffer, sizeof(receive_buffer));
  setsockopt(fd, IPPROTO_TCP, TCP_MAXSEG, &segment, sizeof(segment));
}

// An HTTP/1.1 POST of `body` as JSON; `headers` ("Name: value\r\n" lines)
// are added to the head.
std::string PostRequest(const std::string& path, const Json& body,
                        const std::string& headers = "") {
  const std::string text = body.dump();
  return "POST " + path + " HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n" +
         headers + "Content-Length: " + std::to_string(text.size()) + "\r\n\r\n" + text;
}

// The body of a chunked HTTP response (`response` from its status line
// on); nullopt when the framing is broken or cut short.
std::optional<std::string> Dechunk(const std::string& response) {
  const size_t head_end = response.find("\r\n\r\n");
  if (head_end == std::string::npos) return std::nullopt;
  std::string body;
  for (size_t at = head_end + 4; at < response.size();) {
    const size_t eol = response.find("\r\n", at);
    if (eol == std::string::npos) return std::nullopt;
    size_t size = 0;
    try {
      size = std::stoul(response.substr(at, eol - at), nullptr, 16);
    } catch (const std::exception&) {
      return std::nullopt;
    }
    if (size == 0) return body;
    if (eol + 2 + size + 2 > response.size()) return std::nullopt;
    body += response.substr(eol + 2, size);
    at = eol + 2 + size + 2;
  }
  return std::nullopt;
}

// Reads until the peer closes, the text holds `until` (when not empty) or
// `limit` bytes arrived; `pause` sleeps before each read (a slow client).
std::string ReadFrom(int fd, const std::string& until = "", size_t limit = SIZE_MAX,
                     std::chrono::microseconds pause = {}) {
  std::string received;
  char buf[4096];
  while (received.size() < limit && (until.empty() || received.find(until) == std::string::npos)) {
    if (pause.count() > 0) std::this_thread::sleep_for(pause);
    const ssize_t n = recv(fd, buf, pause.count() > 0 ? 512 : sizeof(buf), 0);
    if (n <= 0) break;
    received.append(buf, static_cast<size_t>(n));
  }
  return received;
}

class FrontendTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = MakeTempDir("frontend");
    worker_ = StartWorker(dir_, "worker", {"--model", kModels + "/random32k.bin"});
    scheduler_ = StartScheduler(dir_, "scheduler", worker_.address(), {});
    frontend_ =
        StartFrontend(dir_, "frontend", {scheduler_.address()},
                      {"--tokenizer", kLlama2Tokenizer, "--chat-template", "llama-2"});
    reference_ = ReadJson(kModels + "/random32k.reference.json");
  }

  std::string dir_;
  Service worker_, scheduler_, frontend_;
  Json reference_;
};

TEST_F(FrontendTest, OpenAiSdkGetsTheReferenceTokensAndTextStreamedOrNot) {
#ifdef TANDEM_SANITIZER_BUILD
  GTEST_SKIP() << "compares with libsentencepiece, which a sanitizer build cannot load";
#endif
  const std::string npm = std::string(TANDEM_BINARY_DIR) + "/frontend_npm";
  const std::string out = dir_ + "/openai_cases.json";
  std::string log;
  const int rc = RunCommand(
      {"/usr/bin/env", "NODE_PATH=" + npm + "/node_modules", "node", npm + "/openai_cases.mjs",
       "http://" + frontend_.address() + "/v1", kModels + "/random32k.reference.json", out},
      &log, std::chrono::seconds(300));
  ASSERT_EQ(rc, 0) << log << "\nfrontend log: " << frontend_.log_path;
  const Json got = ReadJson(out);
  auto tok = tokenizer::LoadTokenizer(kModels + "/tokenizer.model");  // libsentencepiece
  ASSERT_TRUE(tok.ok()) << tok.status();
  auto stub = GenerationStub(scheduler_.address());
  ASSERT_EQ(got["cases"].size(), reference_.size());
  for (size_t i = 0; i < reference_.size(); ++i) {
    const Json& ref = reference_[i];
    const Json& c = got["cases"][i];
    const std::vector<int32_t> expected = ref["expected_output_token_ids"];
    const std::string text = Continuation(*tok.value(), ref["prompt_token_ids"], expected);
    SCOPED_TRACE("case " + std::to_string(i) + ": " + ref["prompt_text"].get<std::string>());
    EXPECT_EQ(c["nonstream"]["prompt_token_ids"], ref["prompt_token_ids"]);
    EXPECT_EQ(c["nonstream"]["token_ids"].get<std::vector<int32_t>>(), expected);
    EXPECT_EQ(c["stream"]["token_ids"].get<std::vector<int32_t>>(), expected);
    EXPECT_EQ(c["nonstream"]["text"], text);
    EXPECT_EQ(c["stream"]["text"], text);
    EXPECT_EQ(c["nonstream"]["usage"]["completion_tokens"], expected.size());
    EXPECT_EQ(c["stream"]["usage"]["completion_tokens"], expected.size());
    EXPECT_EQ(c["nonstream"]["usage"]["prompt_tokens"], ref["prompt_token_ids"].size());
    // The gRPC path gives the same ids.
    const GenerateResult direct =
        RunGenerate(stub.get(), MakeRequest(ref["prompt_token_ids"], ref["max_tokens"]));
    ASSERT_TRUE(direct.status.ok()) << direct.status.error_message();
    EXPECT_EQ(direct.tokens, expected);
  }
  const Json& chat = got["chat"];
  EXPECT_EQ(chat["nonstream"]["role"], "assistant");
  EXPECT_EQ(chat["stream"]["roles"], Json::array({"assistant"}));
  EXPECT_EQ(chat["stream"]["token_ids"], chat["nonstream"]["token_ids"]);
  EXPECT_EQ(chat["stream"]["text"], chat["nonstream"]["text"]);
  const std::vector<int32_t> chat_ids = chat["nonstream"]["token_ids"];
  EXPECT_EQ(chat["nonstream"]["text"],
            Continuation(*tok.value(), chat["nonstream"]["prompt_token_ids"], chat_ids));
  // Llama 2's template: "<s>[INST] prompt [/INST]", BOS as the id.
  const std::vector<int32_t> prompt = chat["nonstream"]["prompt_token_ids"];
  const std::vector<int32_t> rendered =
      tok.value()
          ->Encode("[INST] " + reference_[0]["prompt_text"].get<std::string>() + " [/INST]")
          .value();
  EXPECT_EQ(prompt, rendered);
}

// `tandem bench --http` (tools/bench_frontend's default HTTP client) reads
// every streamed token through the frontend and reports the server's errors.
TEST_F(FrontendTest, BenchOverHttpCountsEveryStreamedTokenAndReportsErrors) {
  const std::string tandem = BinaryPath("tools/cli/tandem");
  const std::string json_path = dir_ + "/bench_http.json";
  std::string out;
  ASSERT_EQ(RunCommand({tandem, "bench", "--server", scheduler_.address(), "--http",
                        "http://" + frontend_.address(), "--concurrency", "4", "--num-requests",
                        "8", "--prompt-len", "12", "--output-len", "7", "--json", json_path},
                       &out),
            0)
      << out;
  EXPECT_NE(out.find("concurrency=4 requests=8 failed=0 prompt_len=12 output_len=7 "
                     "shared_prefix=0 wrong_token_count=0 via=http"),
            std::string::npos)
      << out;
  const Json result = ReadJson(json_path);
  EXPECT_EQ(result["via"], "http");
  EXPECT_EQ(result["output_tokens"], 8 * 7);
  EXPECT_GT(result["p50_ttft_ms"].get<double>(), 0.0);
  EXPECT_GT(result["p50_itl_ms"].get<double>(), 0.0);

  // A wrong base path: every request fails with the server's 404 and body.
  ASSERT_EQ(RunCommand({tandem, "bench", "--server", scheduler_.address(), "--http",
                        "http://" + frontend_.address() + "/nope", "--concurrency", "1",
                        "--num-requests", "2", "--output-len", "3"},
                       &out),
            1)
      << out;
  EXPECT_NE(out.find("failed=2"), std::string::npos) << out;
  EXPECT_NE(out.find("first error: HTTP 404: {\"error\""), std::string::npos) << out;

  // --vocab-size: the prompts need no scheduler; without it the bench asks one.
  const std::vector<std::string> no_scheduler = {tandem,           "bench",
                                                 "--server",       "127.0.0.1:1",
                                                 "--http",         "http://" + frontend_.address(),
                                                 "--concurrency",  "1",
                                                 "--num-requests", "1",
                                                 "--output-len",   "2"};
  EXPECT_EQ(RunCommand(no_scheduler, &out), 1) << out;
  EXPECT_NE(out.find("GetModelInfo"), std::string::npos) << out;
  std::vector<std::string> with_vocab = no_scheduler;
  with_vocab.insert(with_vocab.end(), {"--vocab-size", "512"});
  EXPECT_EQ(RunCommand(with_vocab, &out), 0) << out;
}

TEST_F(FrontendTest, ErrorsHaveTheirStatusAndBodyAndLeaveAConcurrentStreamAlone) {
  const Json& ref = reference_[0];
  Streamed stream;
  std::thread streamer([&] {
    const HttpResult r = Post(frontend_.address(), "/v1/completions",
                              {{"prompt", ref["prompt_text"]},
                               {"max_tokens", ref["max_tokens"]},
                               {"temperature", 0},
                               {"stream", true},
                               {"return_token_ids", true}});
    EXPECT_EQ(r.status, 200);
    stream = ParseSse(r.raw);
  });
  struct Case {
    Json body;
    int status;
    std::string param;
    std::string code;
  };
  Json too_long = Json::array();
  for (int i = 0; i < 300; ++i) too_long.push_back(100);
  const std::vector<Case> cases = {
      {{{"prompt", "x"}, {"n", 0}}, 400, "n", ""},
      {{{"prompt", "x"}, {"temperature", -1}}, 400, "temperature", ""},
      {{{"prompt", "x"}, {"model", "no-such-model"}}, 404, "model", "model_not_found"},
      {{{"prompt", too_long}}, 400, "prompt", "context_length_exceeded"},
      {{{"prompt", "x"}, {"max_tokens", 100000}}, 400, "max_tokens", "context_length_exceeded"},
      {{{"prompt", {1, 99999}}}, 400, "prompt", ""},
      {{{"prompt", "x"}, {"logprobs", 2}}, 400, "logprobs", ""},
      {{{"prompt", "x"}, {"stream_options", {{"include_usage", true}}}}, 400, "stream_options", ""},
  };
  for (const Case& c : cases) {
    const HttpResult r = Post(frontend_.address(), "/v1/completions", c.body);
    SCOPED_TRACE(c.body.dump());
    EXPECT_EQ(r.status, c.status) << r.raw;
    ASSERT_TRUE(r.body.contains("error")) << r.raw;
    EXPECT_FALSE(r.body["error"]["message"].get<std::string>().empty());
    EXPECT_EQ(r.body["error"]["param"], c.param.empty() ? Json() : Json(c.param));
    EXPECT_EQ(r.body["error"]["code"], c.code.empty() ? Json() : Json(c.code));
  }
  httplib::Client client("http://" + frontend_.address());
  auto bad_json = client.Post("/v1/chat/completions", "{not json", "application/json");
  ASSERT_TRUE(bad_json);
  EXPECT_EQ(bad_json->status, 400);
  auto wrong_method = client.Get("/v1/completions");
  ASSERT_TRUE(wrong_method);
  EXPECT_EQ(wrong_method->status, 405);
  auto no_route = client.Get("/v2/nothing");
  ASSERT_TRUE(no_route);
  EXPECT_EQ(no_route->status, 404);
  streamer.join();
  EXPECT_TRUE(stream.done);
  EXPECT_EQ(stream.ids, ref["expected_output_token_ids"].get<std::vector<int32_t>>());
  EXPECT_EQ(stream.finish_reason, "length");
}

TEST_F(FrontendTest, ApiKeyDnsTargetsAndNoReplica) {
  const std::string key_file = dir_ + "/key";
  std::ofstream(key_file) << "sk-test-123\n";
  Service keyed =
      StartFrontend(dir_, "keyed", {scheduler_.address()},
                    {"--tokenizer", kLlama2Tokenizer, "--api-key-file", key_file});
  const Json body = {{"prompt", "Once"}, {"max_tokens", 2}, {"temperature", 0}};
  HttpResult r = Post(keyed.address(), "/v1/completions", body);
  EXPECT_EQ(r.status, 401);
  // tandem bench --http sends --api-key as the Bearer token.
  std::string out;
  const std::vector<std::string> bench = {BinaryPath("tools/cli/tandem"),
                                          "bench",
                                          "--server",
                                          scheduler_.address(),
                                          "--http",
                                          "http://" + keyed.address(),
                                          "--concurrency",
                                          "1",
                                          "--num-requests",
                                          "1",
                                          "--output-len",
                                          "2"};
  EXPECT_EQ(RunCommand(bench, &out), 1) << out;
  EXPECT_NE(out.find("first error: HTTP 401"), std::string::npos) << out;
  std::vector<std::string> keyed_bench = bench;
  keyed_bench.insert(keyed_bench.end(), {"--api-key", "sk-test-123"});
  EXPECT_EQ(RunCommand(keyed_bench, &out), 0) << out;
  EXPECT_EQ(r.body["error"]["code"], "invalid_api_key");
  r = Post(keyed.address(), "/v1/completions", body, {{"Authorization", "Bearer wrong"}});
  EXPECT_EQ(r.status, 401);
  r = Post(keyed.address(), "/v1/completions", body, {{"Authorization", "Bearer sk-test-123"}});
  EXPECT_EQ(r.status, 200) << r.raw;
  EXPECT_EQ(HttpGetStatus(keyed.address(), "/health"), 200);  // not behind the key

  // dns:///name:port: every address the name resolves to is a replica
  // (localhost: 127.0.0.1, and ::1 where the host has it, which stays not
  // serving: the scheduler listens on 127.0.0.1 only).
  Service by_dns =
      StartFrontend(dir_, "by_dns", {"dns:///localhost:" + std::to_string(scheduler_.port)},
                    {"--tokenizer", kLlama2Tokenizer});
  r = Post(by_dns.address(), "/v1/completions", body);
  EXPECT_EQ(r.status, 200) << r.raw;
  EXPECT_NE(Get(by_dns.address(), "/metrics")
                .find("tandem_frontend_replica_serving{replica=\"127.0.0.1:" +
                      std::to_string(scheduler_.port) + "\"} 1"),
            std::string::npos);

  // A frontend whose only replica is not there: 503 and /health 503.
  Service lonely =
      StartFrontend(dir_, "lonely", {"127.0.0.1:1"}, {"--tokenizer", kLlama2Tokenizer},
                    /*wait_for_serving=*/false);
  EXPECT_EQ(HttpGetStatus(lonely.address(), "/health"), 503);
  EXPECT_EQ(HttpGetStatus(lonely.address(), "/health?live=1"), 200);
  r = Post(lonely.address(), "/v1/completions", body);
  EXPECT_EQ(r.status, 503) << r.raw;
  EXPECT_EQ(r.body["error"]["type"], "server_error");
}

// `vllm serve DIR`'s defaults: with --model DIR and no --tokenizer, the
// tokenizer and the chat template are the directory's (here a
// chat_template.jinja, as transformers >= 4.43 saves it, and no
// tokenizer_config.json); --chat-template still overrides the template.
TEST_F(FrontendTest, ModelDirectoryGivesTheTokenizerAndTheChatTemplate) {
  const std::string model_dir = dir_ + "/hf_model";
  std::filesystem::create_directories(model_dir);
  const std::filesystem::path tokenizer(kLlama2Tokenizer);
  std::filesystem::copy_file(tokenizer, model_dir + "/" + tokenizer.filename().string());
  std::filesystem::copy_file(
      std::string(TANDEM_SOURCE_DIR) + "/tests/tokenizer/data/chat_templates/chatml.jinja",
      model_dir + "/chat_template.jinja");
  Service from_model =
      StartFrontend(dir_, "from_model", {scheduler_.address()}, {"--model", model_dir});
  const Json chat = {{"messages", {{{"role", "user"}, {"content", "Once upon a time"}}}},
                     {"max_tokens", 2},
                     {"temperature", 0},
                     {"return_token_ids", true}};
  const HttpResult chatml = Post(from_model.address(), "/v1/chat/completions", chat);
  ASSERT_EQ(chatml.status, 200) << chatml.raw;
  ASSERT_FALSE(chatml.body["prompt_token_ids"].empty()) << chatml.raw;
  // chatml.jinja's rendering, tokenized as the chat prompt is (no BOS added).
  const HttpResult want =
      Post(from_model.address(), "/tokenize",
           {{"prompt", "<|im_start|>user\nOnce upon a time<|im_end|>\n<|im_start|>assistant\n"},
            {"add_special_tokens", false}});
  ASSERT_EQ(want.status, 200) << want.raw;
  EXPECT_EQ(chatml.body["prompt_token_ids"], want.body["tokens"]);
  EXPECT_EQ(chatml.body["usage"]["prompt_tokens"], want.body["count"]);

  // --chat-template overrides: llama-2 renders as on the fixture's frontend
  // (--tokenizer, --chat-template llama-2).
  Service overridden = StartFrontend(dir_, "overridden", {scheduler_.address()},
                                     {"--model", model_dir, "--chat-template", "llama-2"});
  const HttpResult llama2 = Post(overridden.address(), "/v1/chat/completions", chat);
  ASSERT_EQ(llama2.status, 200) << llama2.raw;
  const HttpResult fixture = Post(frontend_.address(), "/v1/chat/completions", chat);
  ASSERT_EQ(fixture.status, 200) << fixture.raw;
  EXPECT_EQ(llama2.body["prompt_token_ids"], fixture.body["prompt_token_ids"]);
  EXPECT_NE(llama2.body["prompt_token_ids"], chatml.body["prompt_token_ids"]);

  // A --model that is no directory, or holds no tokenizer, stops the start
  // with its path; neither flag at all names both.
  const std::string binary = BinaryPath("services/frontend/tandem-frontend");
  const std::string not_a_dir = model_dir + "/chat_template.jinja";
  const std::string no_tokenizer = dir_ + "/no_tokenizer";
  std::filesystem::create_directories(no_tokenizer);
  struct Case {
    std::vector<std::string> args;
    std::string message;
  };
  for (const Case& c : std::vector<Case>{
           {{"--model", not_a_dir}, "--model " + not_a_dir + " is not a directory"},
           {{"--model", no_tokenizer}, no_tokenizer + ": holds no tokenizer.json"},
           {{}, "--model (a Hugging Face model directory) or --tokenizer is required"}}) {
    std::vector<std::string> argv = {binary, "--scheduler", scheduler_.address()};
    argv.insert(argv.end(), c.args.begin(), c.args.end());
    std::string out;
    EXPECT_EQ(RunCommand(argv, &out), 2) << out;
    EXPECT_NE(out.find(c.message), std::string::npos) << out;
  }
}

// The worker here sleeps 20 ms before each step, so that the 250 tokens
// take at least 5 s whatever the build's speed (a sanitizer build of the
// frontend took longer to deliver the first event than a plain worker takes
// for all 250): the request is surely running when the client hangs up, and
// a request that was not aborted would run all 250 steps.
TEST_F(FrontendTest, ClientDisconnectMidStreamFreesTheRequestOnTheScheduler) {
  constexpr int kMaxTokens = 250;
  Service worker = StartWorker(dir_, "slow_worker", {"--model", kModels + "/random32k.bin",
                                                     "--debug-step-delay-us", "20000"});
  Service scheduler = StartScheduler(dir_, "slow_scheduler", worker.address(), {});
  Service frontend =
      StartFrontend(dir_, "slow_frontend", {scheduler.address()}, {"--tokenizer", kLlama2Tokenizer});
  auto stub = GenerationStub(scheduler.address());
  const v1::GetStatsResponse before = GetStats(stub.get());
  // A raw socket, so that we can hang up after the first event.
  const int fd = ConnectTcp(frontend.address());
  ASSERT_GE(fd, 0);
  const std::string request = PostRequest("/v1/completions", Json({{"prompt", "Once upon a time"},
                                                                    {"max_tokens", kMaxTokens},
                                                                    {"ignore_eos", true},
                                                                    {"temperature", 0},
                                                                    {"stream", true}}));
  ASSERT_EQ(send(fd, request.data(), request.size(), 0), static_cast<ssize_t>(request.size()));
  ASSERT_NE(ReadFrom(fd, "data: ").find("data: "), std::string::npos);
  EXPECT_EQ(GetStats(stub.get()).num_running(), 1);
  close(fd);
  // The scheduler aborts it: nothing running, every block free again, and
  // far fewer steps than the request's 250 tokens would have taken.
  EXPECT_TRUE(WaitFor([&] {
    const v1::GetStatsResponse s = GetStats(stub.get());
    return s.num_running() == 0 && s.num_waiting() == 0 &&
           s.num_free_blocks() == s.num_total_blocks();
  }));
  const v1::GetStatsResponse after = GetStats(stub.get());
  EXPECT_EQ(after.num_requests_finished(), before.num_requests_finished() + 1);
  EXPECT_LT(after.num_steps() - before.num_steps(), static_cast<uint64_t>(kMaxTokens / 2))
      << "the request was not aborted when its client hung up";
  EXPECT_EQ(
      Metric(Get(frontend.address(), "/metrics"), "tandem_frontend_client_disconnects_total"), 1);
}

// A client that does not read fills its socket: the frontend's non-blocking
// sends stop short, the rest goes out asynchronously and later chunks queue
// behind it. Every chunk still arrives, whole and in order.
TEST_F(FrontendTest, AClientThatReadsLateGetsTheWholeStreamInOrder) {
  const Json body = {{"prompt", "Once upon a time"},
                     {"max_tokens", 250},
                     {"ignore_eos", true},
                     {"temperature", 0},
                     {"return_token_ids", true}};
  const HttpResult whole = Post(frontend_.address(), "/v1/completions", body);
  ASSERT_EQ(whole.status, 200) << whole.raw;
  const std::vector<int32_t> want = whole.body["choices"][0]["token_ids"];
  ASSERT_EQ(want.size(), 250u);

  const int fd = ConnectTcp(frontend_.address(), SmallBuffers);
  ASSERT_GE(fd, 0);
  Json streamed_body = body;
  streamed_body["stream"] = true;
  const std::string request = PostRequest("/v1/completions", streamed_body);
  ASSERT_EQ(send(fd, request.data(), request.size(), 0), static_cast<ssize_t>(request.size()));
  // Let the whole stream be generated while nothing is read.
  auto stub = GenerationStub(scheduler_.address());
  EXPECT_TRUE(WaitFor([&] { return GetStats(stub.get()).num_requests_finished() >= 2; }));
  const std::string received = ReadFrom(fd, "0\r\n\r\n");
  close(fd);
  const std::optional<std::string> events = Dechunk(received);
  ASSERT_TRUE(events.has_value()) << received.size() << " bytes: " << received.substr(0, 300);
  const Streamed got = ParseSse(*events);
  EXPECT_TRUE(got.done);
  EXPECT_EQ(got.ids, want);
  EXPECT_EQ(got.text, whole.body["choices"][0]["text"]);
}

// Randomized: rounds of concurrent clients over raw sockets, each one of:
// reads its stream to the end; hangs up after a random number of bytes;
// reads slowly through small buffers; pipelines a stream and a plain
// request; sends a body that is not JSON. Prompts, lengths and n are
// random. Every stream that is read to the end is whole (n * max_tokens
// ids, [DONE], the chunked end), every pipelined pair is answered in order,
// and afterwards nothing is left: no request running or waiting on the
// scheduler, every KV block free, none in flight in the frontend.
TEST_F(FrontendTest, ConcurrentClientsThatHangUpReadSlowlyOrPipelineLeaveNothingBehind) {
  const uint32_t seed = std::random_device{}();
  SCOPED_TRACE("seed " + std::to_string(seed));
  enum Mode { kFull, kHangUp, kSlow, kPipeline, kGarbage };
  std::mutex mu;
  std::map<std::string, int> outcomes;
  std::vector<std::string> failures;
  auto note = [&](const std::string& outcome, const std::string& failure = "") {
    std::lock_guard<std::mutex> lock(mu);
    ++outcomes[outcome];
    if (!failure.empty()) failures.push_back(outcome + ": " + failure);
  };
  auto client = [&](uint32_t client_seed) {
    std::mt19937 rng(client_seed);
    auto pick = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
    const Mode mode = static_cast<Mode>(pick(0, 4));
    Json prompt = Json::array({1});
    for (int i = pick(1, 30); i > 0; --i) prompt.push_back(pick(2, 31999));
    // A slow reader's stream is long enough to fill its small socket.
    const int max_tokens = mode == kSlow ? pick(150, 200) : pick(1, 60);
    const int n = pick(1, 3) == 3 ? 2 : 1;
    const Json body = {{"prompt", prompt}, {"max_tokens", max_tokens}, {"ignore_eos", true},
                 {"temperature", 0},  {"n", n},                  {"stream", true},
                 {"return_token_ids", true}};
    const int fd = ConnectTcp(frontend_.address(), mode == kSlow ? SmallBuffers : nullptr);
    if (fd < 0) return note("connect", "failed");
    std::string request;
    if (mode == kGarbage) {
      request = "POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                "Content-Length: 5\r\n\r\n{bad}";
    } else if (mode == kPipeline) {
      // The first request keeps the connection; the second closes it.
      Json plain_body = body;
      plain_body["stream"] = false;
      request = PostRequest("/v1/completions", body) +
                PostRequest("/v1/completions", plain_body, "Connection: close\r\n");
    } else {
      // A client that hangs up keeps the connection alive.
      request = PostRequest("/v1/completions", body,
                            mode == kHangUp ? "" : "Connection: close\r\n");
    }
    send(fd, request.data(), request.size(), MSG_NOSIGNAL);
    std::string received;
    if (mode == kHangUp) {
      // (Or at the stream's end: the connection is kept alive.)
      received = ReadFrom(fd, "0\r\n\r\n", static_cast<size_t>(pick(1, 4000)));
    } else {
      if (mode == kSlow) std::this_thread::sleep_for(std::chrono::milliseconds(pick(0, 300)));
      received = ReadFrom(fd, "", SIZE_MAX,
                          mode == kSlow ? std::chrono::microseconds(2000) : std::chrono::microseconds{});
    }
    close(fd);
    const size_t want_ids = static_cast<size_t>(max_tokens) * n;
    switch (mode) {
      case kHangUp:
        return note("hang up");
      case kGarbage:
        return note("garbage", received.rfind("HTTP/1.1 400 ", 0) == 0 ? "" : received.substr(0, 80));
      case kFull:
      case kSlow: {
        const std::optional<std::string> events = Dechunk(received);
        const Streamed got = events ? ParseSse(*events) : Streamed{};
        const bool ok = events && got.done && got.ids.size() == want_ids;
        return note(mode == kFull ? "full" : "slow",
                    ok ? "" : absl::StrCat(received.size(), " bytes, ", got.ids.size(), " of ",
                                           want_ids, " ids"));
      }
      case kPipeline: {
        const size_t second = received.find("HTTP/1.1 200", 1);
        const std::optional<std::string> events =
            Dechunk(received.substr(0, second == std::string::npos ? received.size() : second));
        const Streamed got = events ? ParseSse(*events) : Streamed{};
        const size_t json_at =
            second == std::string::npos ? std::string::npos : received.find("\r\n\r\n", second);
        const Json plain = json_at == std::string::npos
                               ? Json()
                               : Json::parse(received.substr(json_at + 4), nullptr, false);
        const bool ok = got.done && got.ids.size() == want_ids && plain.is_object() &&
                        plain["usage"]["completion_tokens"] == static_cast<int>(want_ids);
        return note("pipeline", ok ? "" : received.substr(0, 200));
      }
    }
  };
#ifdef TANDEM_SANITIZER_BUILD
  const int rounds = 2, clients = 24;  // ThreadSanitizer: ~4 minutes for 3 x 48
#else
  const int rounds = 3, clients = 48;
#endif
  for (int round = 0; round < rounds; ++round) {
    std::vector<std::thread> threads;
    for (int i = 0; i < clients; ++i) {
      threads.emplace_back(client, seed + static_cast<uint32_t>(round * 1000 + i));
    }
    for (std::thread& t : threads) t.join();
  }
  for (const std::string& f : failures) ADD_FAILURE() << f;
  for (const auto& [outcome, count] : outcomes) std::cout << outcome << ": " << count << "\n";
  auto stub = GenerationStub(scheduler_.address());
  EXPECT_TRUE(WaitFor([&] {
    const v1::GetStatsResponse stats = GetStats(stub.get());
    return stats.num_running() == 0 && stats.num_waiting() == 0 &&
           stats.num_free_blocks() == stats.num_total_blocks();
  })) << GetStats(stub.get()).DebugString();
  EXPECT_TRUE(WaitFor([&] {
    return Metric(Get(frontend_.address(), "/metrics"), "tandem_frontend_requests_in_flight") == 0;
  }));
  EXPECT_TRUE(frontend_.process.running());
}

// The established TCP connections of process `pid` to local port
// `remote_port`: its sockets' inodes, looked up in /proc/net/tcp and tcp6
// (gRPC dials IPv4 through an IPv6 socket where it can).
int ConnectionsTo(pid_t pid, int remote_port) {
  std::set<std::string> inodes;
  const std::string fd_dir = "/proc/" + std::to_string(pid) + "/fd";
  for (const auto& entry : std::filesystem::directory_iterator(fd_dir)) {
    std::error_code ec;
    const std::string target = std::filesystem::read_symlink(entry.path(), ec).string();
    if (!ec && target.rfind("socket:[", 0) == 0) {
      inodes.insert(target.substr(8, target.size() - 9));
    }
  }
  int count = 0;
  for (const char* table : {"/proc/net/tcp", "/proc/net/tcp6"}) {
    std::ifstream tcp(table);
    std::string line;
    std::getline(tcp, line);  // the header
    while (std::getline(tcp, line)) {
      // sl local_address rem_address st tx:rx tr:when retrnsmt uid timeout inode
      std::istringstream fields(line);
      std::string sl, local, remote, state, queues, timer, retransmits, uid, timeout, inode;
      fields >> sl >> local >> remote >> state >> queues >> timer >> retransmits >> uid >>
          timeout >> inode;
      const int port = std::stoi(remote.substr(remote.find(':') + 1), nullptr, 16);
      if (state == "01" && port == remote_port && inodes.count(inode) > 0) ++count;
    }
  }
  return count;
}

TEST_F(FrontendTest, CallsSpreadOverTheConfiguredConnectionsToAReplica) {
  Service pooled =
      StartFrontend(dir_, "pooled", {scheduler_.address()},
                    {"--tokenizer", kLlama2Tokenizer, "--connections-per-replica", "3"});
  Service single =
      StartFrontend(dir_, "single", {scheduler_.address()},
                    {"--tokenizer", kLlama2Tokenizer, "--connections-per-replica", "1"});
  const Json body = {{"prompt", "Once"}, {"max_tokens", 2}, {"temperature", 0}};
  for (int i = 0; i < 6; ++i) {
    for (const Service* f : {&pooled, &single}) {
      const HttpResult r = Post(f->address(), "/v1/completions", body);
      ASSERT_EQ(r.status, 200) << r.raw;
    }
  }
  // Calls take the connections in turn; health checks use the first.
  EXPECT_EQ(ConnectionsTo(pooled.process.pid(), scheduler_.port), 3);
  EXPECT_EQ(ConnectionsTo(single.process.pid(), scheduler_.port), 1);

  std::string out;
  EXPECT_NE(RunCommand({BinaryPath("services/frontend/tandem-frontend"), "--scheduler",
                        scheduler_.address(), "--tokenizer", kLlama2Tokenizer,
                        "--listen", "127.0.0.1:0", "--connections-per-replica", "0"},
                       &out),
            0);
  EXPECT_NE(out.find("--connections-per-replica must be 1 to 64"), std::string::npos) << out;
}

// Three replicas of stories260K (scheduler + worker each) behind frontends.
class ReplicasTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = MakeTempDir("frontend_replicas");
    for (int i = 0; i < 3; ++i) {
      const std::string n = std::to_string(i);
      workers_.push_back(
          StartWorker(dir_, "worker" + n, {"--model", kModels + "/stories260K.bin"}));
      schedulers_.push_back(StartScheduler(dir_, "scheduler" + n, workers_.back().address(), {}));
      targets_.push_back(schedulers_.back().address());
    }
  }

  uint64_t PrefixCacheHits() {
    uint64_t hits = 0;
    for (Service& s : schedulers_) {
      if (!s.process.running()) continue;
      hits += GetStats(GenerationStub(s.address()).get()).prefix_cache_hits();
    }
    return hits;
  }

  // `groups` prompts of a 64-token prefix (4 blocks) each sent 4 times in a
  // row with different 8-token suffixes; returns the prefix-cache hit tokens
  // this added over every replica.
  uint64_t SharedPrefixWorkload(const std::string& frontend, int32_t first_token, int groups) {
    const uint64_t before = PrefixCacheHits();
    for (int g = 0; g < groups; ++g) {
      for (int r = 0; r < 4; ++r) {
        // The second token tells the workloads apart (block hashes chain).
        std::vector<int32_t> prompt = {1, first_token};
        for (int i = 2; i < 64; ++i) prompt.push_back(2 + (g * 64 + i) % 500);
        for (int i = 0; i < 8; ++i) prompt.push_back(2 + (r * 8 + i) % 500);
        const HttpResult res = Post(frontend, "/v1/completions",
                                    {{"prompt", prompt}, {"max_tokens", 2}, {"temperature", 0}});
        EXPECT_EQ(res.status, 200) << res.raw;
      }
    }
    return PrefixCacheHits() - before;
  }

  std::string dir_;
  std::vector<Service> workers_, schedulers_;
  std::vector<std::string> targets_;
};

TEST_F(ReplicasTest, AffinityHitsThePrefixCacheAtLeastTwiceAsOftenAsRoundRobin) {
  const std::vector<std::string> common = {"--tokenizer", kModels + "/tokenizer.bin"};
  std::vector<std::string> affinity_args = common, rr_args = common;
  affinity_args.insert(affinity_args.end(), {"--routing", "affinity"});
  rr_args.insert(rr_args.end(), {"--routing", "round-robin"});
  Service affinity = StartFrontend(dir_, "affinity", targets_, affinity_args);
  Service rr = StartFrontend(dir_, "rr", targets_, rr_args);
  // Different prefixes for each, so that neither finds the other's blocks.
  const uint64_t with_affinity = SharedPrefixWorkload(affinity.address(), 3, 8);
  const uint64_t with_rr = SharedPrefixWorkload(rr.address(), 4, 8);
  std::cout << "prefix-cache hit tokens: affinity " << with_affinity << ", round-robin " << with_rr
            << "\n";
  EXPECT_GT(with_rr, 0u);  // the workload does share prefixes
  EXPECT_GE(with_affinity, 2 * with_rr);
  const std::string metrics = Get(affinity.address(), "/metrics");
  EXPECT_NE(metrics.find("tandem_frontend_route_decisions_total{reason=\"affinity\""),
            std::string::npos)
      << metrics;
  EXPECT_NE(metrics.find("tandem_frontend_replica_outstanding_requests{replica=\""),
            std::string::npos);
}

TEST_F(ReplicasTest, AKilledReplicaLosesNoRequestThatHadNotStartedStreaming) {
  // Health checks far apart: the frontend learns of the death only from the
  // calls that fail, which must then go to another replica.
  Service frontend =
      StartFrontend(dir_, "frontend", targets_,
                    {"--tokenizer", kModels + "/tokenizer.bin", "--health-interval-s", "60"});
  schedulers_[1].process.Signal(SIGKILL);
  ASSERT_TRUE(schedulers_[1].process.Wait(std::chrono::seconds(10)).has_value());
  std::vector<HttpResult> results(24);
  std::vector<std::thread> threads;
  for (int i = 0; i < 24; ++i) {
    threads.emplace_back([&, i] {
      std::vector<int32_t> prompt = {1};
      for (int k = 1; k < 40; ++k) prompt.push_back(2 + (i * 131 + k * 7) % 500);
      results[i] = Post(frontend.address(), "/v1/completions",
                        {{"prompt", prompt},
                         {"max_tokens", 4},
                         {"temperature", 0},
                         {"ignore_eos", true},
                         {"stream", i % 2 == 0}});
    });
  }
  for (auto& t : threads) t.join();
  for (int i = 0; i < 24; ++i) {
    EXPECT_EQ(results[i].status, 200) << "request " << i << ": " << results[i].raw;
    if (i % 2 == 0) {
      const Streamed s = ParseSse(results[i].raw);
      EXPECT_TRUE(s.done);
      EXPECT_EQ(s.finish_reason, "length");
    } else {
      EXPECT_EQ(results[i].body["usage"]["completion_tokens"], 4) << results[i].raw;
    }
  }
  const double retries =
      Metric(Get(frontend.address(), "/metrics"), "tandem_frontend_retries_total");
  std::cout << "retries after the kill: " << retries << "\n";
  EXPECT_GE(retries, 1);  // some requests did go to the dead replica first
}

}  // namespace
}  // namespace tandem::testing
