// tandem-frontend's HTTP as clients other than the OpenAI SDKs meet it,
// through the real binary and a fake scheduler:
//   - HEAD answers a GET's head without its body (RFC 9110 9.3.2), and a
//     405 names the methods the route takes in Allow (15.5.6);
//   - an HTTP/1.0 client's stream has no chunked coding (RFC 9112 6.1) and
//     ends with the connection;
//   - vLLM's /ping and /version;
//   - /tokenize as vLLM's: it counts a prompt longer than the context,
//     gives token_strs when asked, and a model it does not serve is a 404;
//   - paths a client makes up never become label values of
//     tandem_frontend_requests_total (a 401 or 405 per invented path grew
//     the registry without bound);
//   - "Expect: 100-continue" is answered before the body is read;
//   - CORS as vLLM's default (any origin) and with an allow list;
//   - vLLM's request ids: X-Request-Id or the body's request_id names the
//     response, and --enable-request-id-headers echoes it;
//   - --metrics-from whose upstream accepts and never answers: /metrics
//     still answers, after the relay's timeout.
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <set>
#include <string>
#include <vector>

#include "../integration/harness.h"
#include "fake_scheduler.h"
#include "gtest/gtest.h"
#include "httplib.h"
#include "nlohmann/json.hpp"
#include "tandem/tokenizer/tokenizer.h"

namespace tandem::testing {
namespace {

using Json = nlohmann::json;

const std::string kTokenizer = std::string(TANDEM_SHARED_DIR) + "/models/tokenizer.bin";

// Sends `request` on a new connection and reads until the server closes it
// (or 10 s pass).
std::string Exchange(const std::string& address, const std::string& request) {
  const int fd = ConnectTcp(address, [](int fd) {
    timeval tv{.tv_sec = 10, .tv_usec = 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  });
  if (fd < 0) return "";
  for (size_t sent = 0; sent < request.size();) {
    const ssize_t n = send(fd, request.data() + sent, request.size() - sent, MSG_NOSIGNAL);
    if (n <= 0) break;
    sent += static_cast<size_t>(n);
  }
  std::string received;
  char buf[4096];
  for (;;) {
    const ssize_t n = recv(fd, buf, sizeof(buf), 0);
    if (n <= 0) break;
    received.append(buf, static_cast<size_t>(n));
  }
  close(fd);
  return received;
}

std::string HeadOf(const std::string& response) {
  return response.substr(0, response.find("\r\n\r\n") + 4);
}

class FrontendHttpRoutesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto tok = tokenizer::LoadTokenizer(kTokenizer);
    ASSERT_TRUE(tok.ok()) << tok.status();
    tok_ = *std::move(tok);
    dir_ = MakeTempDir("frontend-routes");
    scheduler_ = std::make_unique<FakeScheduler>(FakeModelInfo("routes"));  // 256 tokens
    frontend_ = StartFrontend(dir_, "frontend", {scheduler_->address()},
                              {"--tokenizer", kTokenizer});
  }

  Json PostJson(const std::string& address, const std::string& path, const Json& body,
                int* status) {
    httplib::Client client("http://" + address);
    client.set_read_timeout(20, 0);
    auto res = client.Post(path, body.dump(), "application/json");
    *status = res ? res->status : -1;
    return res ? Json::parse(res->body, nullptr, false) : Json();
  }

  std::unique_ptr<tokenizer::Tokenizer> tok_;
  std::string dir_;
  std::unique_ptr<FakeScheduler> scheduler_;
  Service frontend_;
};

TEST_F(FrontendHttpRoutesTest, HeadHasNoBodyAndA405NamesTheAllowedMethods) {
  // Two requests on one connection: a body after the HEAD's head would be
  // read as the start of the second answer.
  const std::string both = Exchange(frontend_.address(),
                                    "HEAD /health HTTP/1.1\r\nHost: x\r\n\r\n"
                                    "GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
  ASSERT_EQ(both.rfind("HTTP/1.1 200", 0), 0u) << both;
  const size_t head_end = both.find("\r\n\r\n") + 4;
  EXPECT_EQ(both.compare(head_end, 12, "HTTP/1.1 200"), 0) << "HEAD sent a body: " << both;
  EXPECT_NE(HeadOf(both).find("Content-Length: 2\r\n"), std::string::npos) << both;

  const std::string wrong =
      Exchange(frontend_.address(), "DELETE /v1/models HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
  EXPECT_EQ(wrong.rfind("HTTP/1.1 405", 0), 0u) << wrong;
  EXPECT_NE(HeadOf(wrong).find("Allow: GET, HEAD\r\n"), std::string::npos) << wrong;
  const std::string get_post = Exchange(
      frontend_.address(), "GET /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
  EXPECT_NE(HeadOf(get_post).find("Allow: POST\r\n"), std::string::npos) << get_post;
}

TEST_F(FrontendHttpRoutesTest, AnHttp10StreamIsNotChunkedAndEndsWithTheConnection) {
  scheduler_->SetOutput({tok_->Encode("fox")->back(), tok_->Encode("jumps")->back()},
                        v1::FINISH_REASON_LENGTH);
  const std::string body = Json{{"prompt", "The"}, {"stream", true}}.dump();
  const std::string r = Exchange(frontend_.address(),
                                 "POST /v1/completions HTTP/1.0\r\nContent-Type: "
                                 "application/json\r\nContent-Length: " +
                                     std::to_string(body.size()) + "\r\n\r\n" + body);
  ASSERT_EQ(r.rfind("HTTP/1.1 200", 0), 0u) << r;
  EXPECT_EQ(HeadOf(r).find("Transfer-Encoding"), std::string::npos) << r;
  EXPECT_NE(HeadOf(r).find("Connection: close\r\n"), std::string::npos) << r;
  const std::string events = r.substr(HeadOf(r).size());
  EXPECT_EQ(events.rfind("data: {", 0), 0u) << "a chunk size before the event: " << events;
  EXPECT_NE(events.find("data: [DONE]\n\n"), std::string::npos) << events;
}

TEST_F(FrontendHttpRoutesTest, PingAndVersionAnswerAsVllms) {
  httplib::Client client("http://" + frontend_.address());
  auto ping = client.Get("/ping");
  ASSERT_TRUE(ping);
  EXPECT_EQ(ping->status, 200);
  auto ping_post = client.Post("/ping", "", "application/json");
  ASSERT_TRUE(ping_post);
  EXPECT_EQ(ping_post->status, 200);
  auto version = client.Get("/version");
  ASSERT_TRUE(version);
  EXPECT_EQ(version->status, 200);
  const Json v = Json::parse(version->body, nullptr, false);
  ASSERT_TRUE(v.is_object()) << version->body;
  EXPECT_FALSE(v.value("version", "").empty()) << version->body;
}

// OpenAI's routes of a stored response (the SDKs' responses.retrieve,
// delete, cancel, inputItems.list): no response is stored here, so each
// answers a 404 naming the id, as vLLM answers without its store, and the
// requests count under one label whatever the id.
TEST_F(FrontendHttpRoutesTest, AStoredResponsesRoutesAnswerNotFoundNamingTheId) {
  httplib::Client client("http://" + frontend_.address());
  std::vector<httplib::Result> answers;
  answers.push_back(client.Get("/v1/responses/resp_abc"));
  answers.push_back(client.Delete("/v1/responses/resp_abc"));
  answers.push_back(client.Post("/v1/responses/resp_abc/cancel", "", "application/json"));
  answers.push_back(client.Get("/v1/responses/resp_abc/input_items"));
  for (const httplib::Result& r : answers) {
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 404) << r->body;
    const Json body = Json::parse(r->body, nullptr, false);
    EXPECT_EQ(body["error"]["message"],
              "Response with id 'resp_abc' not found: this server stores no responses")
        << r->body;
  }
  // A request is counted once its answer is written, which the client may
  // see first: the count is read until it arrives.
  std::string metrics;
  EXPECT_TRUE(WaitFor([&] {
    auto m = client.Get("/metrics");
    metrics = m ? m->body : "";
    return metrics.find(
               R"(tandem_frontend_requests_total{code="404",endpoint="/v1/responses/{id}"} 4)") !=
           std::string::npos;
  })) << metrics;
}

TEST_F(FrontendHttpRoutesTest, TokenizeCountsALongPromptGivesTokenStrsAndChecksTheModel) {
  std::string text;
  for (int i = 0; i < 120; ++i) text += "the quick brown fox ";
  const std::vector<int32_t> ids = *tok_->Encode(text);
  ASSERT_GT(ids.size(), 256u) << "the prompt must be longer than the context";
  int status = 0;
  Json r = PostJson(frontend_.address(), "/tokenize", {{"prompt", text}}, &status);
  EXPECT_EQ(status, 200) << r.dump();
  EXPECT_EQ(r["count"], ids.size());
  EXPECT_EQ(r["max_model_len"], 256);
  EXPECT_TRUE(r["token_strs"].is_null()) << r.dump();

  r = PostJson(frontend_.address(), "/tokenize",
               {{"prompt", "The quick"}, {"return_token_strs", true}}, &status);
  ASSERT_EQ(status, 200) << r.dump();
  ASSERT_TRUE(r["token_strs"].is_array()) << r.dump();
  ASSERT_EQ(r["token_strs"].size(), r["tokens"].size());
  for (size_t i = 0; i < r["tokens"].size(); ++i) {
    EXPECT_EQ(r["token_strs"][i], *tok_->IdToPiece(r["tokens"][i].get<int32_t>())) << i;
  }
  EXPECT_EQ(r["token_strs"].back(), " quick");  // llama2.c's vocabulary keeps the space

  r = PostJson(frontend_.address(), "/tokenize", {{"prompt", "x"}, {"return_token_strs", 3}},
               &status);
  EXPECT_EQ(status, 400) << r.dump();
  r = PostJson(frontend_.address(), "/tokenize", {{"prompt", "x"}, {"model", "nope"}}, &status);
  EXPECT_EQ(status, 404) << r.dump();
  EXPECT_EQ(r["error"]["code"], "model_not_found");
  r = PostJson(frontend_.address(), "/tokenize", {{"prompt", "x"}, {"model", "fake"}}, &status);
  EXPECT_EQ(status, 200) << r.dump();
}

// A client that asks "Expect: 100-continue" (curl, for a body over 1 MiB)
// sends the body only after the interim answer (or a second later); the
// server read on, waiting for the body, and each such request lost a second.
TEST_F(FrontendHttpRoutesTest, ExpectContinueIsAnsweredBeforeTheBody) {
  const int fd = ConnectTcp(frontend_.address(), [](int fd) {
    timeval tv{.tv_sec = 10, .tv_usec = 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  });
  ASSERT_GE(fd, 0);
  const std::string body = Json{{"prompt", "The quick"}}.dump();
  const std::string head =
      "POST /tokenize HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
      "Expect: 100-continue\r\nConnection: close\r\nContent-Length: " +
      std::to_string(body.size()) + "\r\n\r\n";
  ASSERT_EQ(send(fd, head.data(), head.size(), MSG_NOSIGNAL), static_cast<ssize_t>(head.size()));
  std::string interim;
  char buf[4096];
  while (interim.find("\r\n\r\n") == std::string::npos) {
    const ssize_t n = recv(fd, buf, sizeof(buf), 0);
    if (n <= 0) break;
    interim.append(buf, static_cast<size_t>(n));
  }
  EXPECT_EQ(interim, "HTTP/1.1 100 Continue\r\n\r\n");
  ASSERT_EQ(send(fd, body.data(), body.size(), MSG_NOSIGNAL), static_cast<ssize_t>(body.size()));
  std::string rest;
  for (;;) {
    const ssize_t n = recv(fd, buf, sizeof(buf), 0);
    if (n <= 0) break;
    rest.append(buf, static_cast<size_t>(n));
  }
  close(fd);
  EXPECT_EQ(rest.rfind("HTTP/1.1 200", 0), 0u) << rest;
  EXPECT_NE(rest.find("\"tokens\""), std::string::npos) << rest;

  // A body over the limit by its Content-Length: 413 at once, no 100.
  const std::string big = Exchange(frontend_.address(),
                                   "POST /tokenize HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\n"
                                   "Content-Length: 1000000000\r\n\r\n");
  EXPECT_EQ(big.rfind("HTTP/1.1 413", 0), 0u) << big;
}

// CORS as vLLM's default (--allowed-origins ["*"]): a browser's preflight
// is answered before any route or key check, with what it asks for; an
// answer to a request with an Origin carries Access-Control-Allow-Origin
// (errors too, so the page can read them). A list allows its origins only.
TEST_F(FrontendHttpRoutesTest, CorsAsVllmsDefaultsAndAnAllowList) {
  Service keyed = StartFrontend(dir_, "cors", {scheduler_->address()},
                                {"--tokenizer", kTokenizer, "--api-key", "sk-1"});
  const std::string preflight = Exchange(
      keyed.address(),
      "OPTIONS /v1/chat/completions HTTP/1.1\r\nHost: x\r\nOrigin: http://ui.example\r\n"
      "Access-Control-Request-Method: POST\r\nAccess-Control-Request-Headers: authorization, "
      "content-type\r\nConnection: close\r\n\r\n");
  ASSERT_EQ(preflight.rfind("HTTP/1.1 200", 0), 0u) << preflight;
  const std::string head = HeadOf(preflight);
  EXPECT_NE(head.find("Access-Control-Allow-Origin: *\r\n"), std::string::npos) << head;
  EXPECT_NE(head.find("Access-Control-Allow-Headers: authorization, content-type\r\n"),
            std::string::npos)
      << head;
  EXPECT_NE(head.find("POST"), std::string::npos) << head;

  const std::string refused = Exchange(keyed.address(),
                                       "GET /v1/models HTTP/1.1\r\nHost: x\r\nOrigin: "
                                       "http://ui.example\r\nConnection: close\r\n\r\n");
  ASSERT_EQ(refused.rfind("HTTP/1.1 401", 0), 0u) << refused;
  EXPECT_NE(HeadOf(refused).find("Access-Control-Allow-Origin: *\r\n"), std::string::npos)
      << refused;
  const std::string no_origin =
      Exchange(keyed.address(), "GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
  EXPECT_EQ(no_origin.find("Access-Control"), std::string::npos) << no_origin;

  Service listed =
      StartFrontend(dir_, "cors-listed", {scheduler_->address()},
                    {"--tokenizer", kTokenizer, "--allowed-origins", R"(["http://a.example"])"});
  auto get = [&](const std::string& origin) {
    return Exchange(listed.address(), "GET /v1/models HTTP/1.1\r\nHost: x\r\nOrigin: " + origin +
                                          "\r\nConnection: close\r\n\r\n");
  };
  const std::string a = get("http://a.example");
  EXPECT_NE(HeadOf(a).find("Access-Control-Allow-Origin: http://a.example\r\n"), std::string::npos)
      << a;
  EXPECT_NE(HeadOf(a).find("Vary: Origin\r\n"), std::string::npos) << a;
  const std::string b = get("http://b.example");
  EXPECT_EQ(b.rfind("HTTP/1.1 200", 0), 0u) << b;
  EXPECT_EQ(HeadOf(b).find("Access-Control"), std::string::npos) << b;
  // Not a preflight it answers: OPTIONS goes to the route, which takes GET.
  const std::string b_preflight =
      Exchange(listed.address(),
               "OPTIONS /v1/models HTTP/1.1\r\nHost: x\r\nOrigin: http://b.example\r\n"
               "Access-Control-Request-Method: GET\r\nConnection: close\r\n\r\n");
  EXPECT_EQ(b_preflight.rfind("HTTP/1.1 405", 0), 0u) << b_preflight;
}

// vLLM's request ids: the response's id is "chatcmpl-" / "cmpl-" and the
// X-Request-Id header (gateways such as Envoy set one), else the body's
// request_id; the scheduler's ids stay the frontend's own and unique, so two
// requests a gateway gave one id both run. /v1/responses names its own.
TEST_F(FrontendHttpRoutesTest, TheResponseIdIsTheClientsRequestIdAsVllms) {
  scheduler_->SetOutput({tok_->Encode("fox")->back()}, v1::FINISH_REASON_LENGTH);
  Service chat_frontend = StartFrontend(dir_, "request-id", {scheduler_->address()},
                                        {"--tokenizer", kTokenizer, "--chat-template", "llama-2"});
  const Json chat = {{"messages", {{{"role", "user"}, {"content", "The"}}}}};
  auto post = [&](const std::string& path, Json body, const std::string& header) {
    httplib::Client client("http://" + chat_frontend.address());
    client.set_read_timeout(20, 0);
    httplib::Headers headers;
    if (!header.empty()) headers.emplace("X-Request-Id", header);
    auto res = client.Post(path, headers, body.dump(), "application/json");
    return res ? std::make_pair(res->status, res->body) : std::make_pair(-1, std::string());
  };
  auto id_of = [](const std::pair<int, std::string>& r) {
    EXPECT_EQ(r.first, 200) << r.second;
    return Json::parse(r.second, nullptr, false).value("id", "");
  };
  Json with_id = chat;
  with_id["request_id"] = "body-1";
  EXPECT_EQ(id_of(post("/v1/chat/completions", with_id, "")), "chatcmpl-body-1");
  EXPECT_EQ(id_of(post("/v1/chat/completions", with_id, "gw-7")), "chatcmpl-gw-7");
  EXPECT_EQ(id_of(post("/v1/completions", {{"prompt", "The"}}, "gw-7")), "cmpl-gw-7");
  const auto streamed = post("/v1/completions", {{"prompt", "The"}, {"stream", true}}, "gw-7");
  ASSERT_EQ(streamed.first, 200);
  int chunks = 0;
  for (size_t at = streamed.second.find("data: {"); at != std::string::npos;
       at = streamed.second.find("data: {", at + 1), ++chunks) {
    const std::string line =
        streamed.second.substr(at + 6, streamed.second.find('\n', at) - at - 6);
    EXPECT_EQ(Json::parse(line).value("id", ""), "cmpl-gw-7") << line;
  }
  EXPECT_GT(chunks, 0) << streamed.second;
  const std::string own = id_of(post("/v1/chat/completions", chat, ""));
  EXPECT_EQ(own.rfind("chatcmpl-", 0), 0u) << own;
  EXPECT_GT(own.size(), std::string("chatcmpl-").size()) << own;

  // The scheduler saw five requests under five ids of the frontend's own.
  std::set<std::string> ids;
  for (const v1::GenerateRequest& r : scheduler_->requests()) {
    EXPECT_EQ(r.request_id().find("gw-7"), std::string::npos) << r.request_id();
    EXPECT_EQ(r.request_id().find("body-1"), std::string::npos) << r.request_id();
    ids.insert(r.request_id());
  }
  EXPECT_EQ(ids.size(), 5u);

  with_id["request_id"] = 5;
  const auto bad = post("/v1/chat/completions", with_id, "");
  EXPECT_EQ(bad.first, 400) << bad.second;
  EXPECT_EQ(Json::parse(bad.second, nullptr, false)["error"]["param"], "request_id") << bad.second;
  const Json responses = {{"input", "The"}, {"request_id", "r-1"}};
  const auto refused = post("/v1/responses", responses, "");
  EXPECT_EQ(refused.first, 400) << refused.second;
  EXPECT_EQ(Json::parse(refused.second, nullptr, false)["error"]["param"], "request_id")
      << refused.second;
  const std::string resp = id_of(post("/v1/responses", {{"input", "The"}}, "gw-7"));
  EXPECT_EQ(resp.rfind("resp_", 0), 0u) << resp;
  EXPECT_EQ(resp.find("gw-7"), std::string::npos) << resp;
}

// --enable-request-id-headers (vLLM's): every answer carries X-Request-Id,
// the request's own or a random one; without the flag, none.
TEST_F(FrontendHttpRoutesTest, RequestIdHeadersEchoTheRequestsIdOrMakeOne) {
  const std::string plain = Exchange(frontend_.address(),
                                     "GET /health HTTP/1.1\r\nHost: x\r\nX-Request-Id: a-1\r\n"
                                     "Connection: close\r\n\r\n");
  EXPECT_EQ(HeadOf(plain).find("X-Request-Id"), std::string::npos) << plain;

  Service ids = StartFrontend(dir_, "request-ids", {scheduler_->address()},
                              {"--tokenizer", kTokenizer, "--enable-request-id-headers"});
  auto head_of = [&](const std::string& request) {
    return HeadOf(Exchange(ids.address(), request));
  };
  const std::string echoed =
      head_of("GET /health HTTP/1.1\r\nHost: x\r\nX-Request-Id: a-1\r\nConnection: close\r\n\r\n");
  EXPECT_NE(echoed.find("\r\nX-Request-Id: a-1\r\n"), std::string::npos) << echoed;
  const std::string not_found =
      head_of("GET /nowhere HTTP/1.1\r\nHost: x\r\nX-Request-Id: a-2\r\nConnection: close\r\n\r\n");
  EXPECT_EQ(not_found.rfind("HTTP/1.1 404", 0), 0u) << not_found;
  EXPECT_NE(not_found.find("\r\nX-Request-Id: a-2\r\n"), std::string::npos) << not_found;
  scheduler_->SetOutput({tok_->Encode("fox")->back()}, v1::FINISH_REASON_LENGTH);
  const std::string body = Json{{"prompt", "The"}, {"stream", true}}.dump();
  const std::string stream = head_of(
      "POST /v1/completions HTTP/1.1\r\nHost: x\r\nX-Request-Id: a-3\r\nContent-Type: "
      "application/json\r\nConnection: close\r\nContent-Length: " +
      std::to_string(body.size()) + "\r\n\r\n" + body);
  EXPECT_EQ(stream.rfind("HTTP/1.1 200", 0), 0u) << stream;
  EXPECT_NE(stream.find("\r\nX-Request-Id: a-3\r\n"), std::string::npos) << stream;
  // Without one: 32 hex digits, another each time.
  std::set<std::string> made;
  for (int i = 0; i < 2; ++i) {
    const std::string h = head_of("GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    const size_t at = h.find("\r\nX-Request-Id: ");
    ASSERT_NE(at, std::string::npos) << h;
    const std::string id = h.substr(at + 16, h.find("\r\n", at + 2) - at - 16);
    EXPECT_EQ(id.size(), 32u) << id;
    EXPECT_EQ(id.find_first_not_of("0123456789abcdef"), std::string::npos) << id;
    made.insert(id);
  }
  EXPECT_EQ(made.size(), 2u);
}

TEST_F(FrontendHttpRoutesTest, InventedPathsAreNotLabelValues) {
  Service keyed = StartFrontend(dir_, "keyed", {scheduler_->address()},
                                {"--tokenizer", kTokenizer, "--api-key", "sk-1"});
  httplib::Client client("http://" + keyed.address());
  for (const char* path : {"/v1/invented-a", "/v1/invented-b"}) {
    auto r = client.Get(path);
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 401);
  }
  auto wrong_method = client.Get("/v1/completions");  // 401 before 405: no key
  ASSERT_TRUE(wrong_method);
  auto metrics = client.Get("/metrics");
  ASSERT_TRUE(metrics);
  EXPECT_EQ(metrics->body.find("invented"), std::string::npos) << metrics->body;
  EXPECT_NE(metrics->body.find("endpoint=\"other\""), std::string::npos) << metrics->body;
}

// The upstream is a listening socket nobody accepts on: the kernel completes
// the connection, and the request is never read or answered. The relay's
// blocking read used to wait for good, and /metrics with it.
TEST_F(FrontendHttpRoutesTest, AnUpstreamThatNeverAnswersDoesNotHoldMetrics) {
  const int listener = socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(listener, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(listen(listener, 16), 0);
  socklen_t len = sizeof(addr);
  ASSERT_EQ(getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  const std::string upstream =
      "http://127.0.0.1:" + std::to_string(ntohs(addr.sin_port)) + "/metrics";
  Service relaying = StartFrontend(dir_, "relaying", {scheduler_->address()},
                                   {"--tokenizer", kTokenizer, "--metrics-from", upstream});
  httplib::Client client("http://" + relaying.address());
  client.set_read_timeout(15, 0);
  for (int i = 0; i < 2; ++i) {  // the second scrape is not held by the first
    auto r = client.Get("/metrics");
    ASSERT_TRUE(r) << "no answer within 15 s";
    EXPECT_EQ(r->status, 200);
    EXPECT_NE(r->body.find("tandem_frontend_metrics_from_up 0"), std::string::npos) << r->body;
  }
  close(listener);
}

}  // namespace
}  // namespace tandem::testing
