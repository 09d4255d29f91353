// What the frontend_*_test.cc files share: the model paths, plain HTTP
// helpers, the SSE parser and the FrontendTest fixture (worker, scheduler and
// frontend on loopback, with random32k and its reference).
#pragma once

#include <cstdint>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "../integration/harness.h"
#include "gtest/gtest.h"
#include "httplib.h"
#include "nlohmann/json.hpp"

namespace tandem::testing {

using Json = nlohmann::json;

inline const std::string kShared = TANDEM_SHARED_DIR;
inline const std::string kModels = kShared + "/models";

// The frontends' Llama 2 tokenizer. A sanitizer build cannot load
// SentencePiece beside gRPC's protobuf (its runtime refuses the module's
// RTLD_DEEPBIND: libs/tokenizer/sentencepiece_shim.h), so there they read
// llama2.c's tokenizer.bin of the same vocabulary, from which run.c made
// random32k.reference.json.
#ifdef TANDEM_SANITIZER_BUILD
inline const std::string kLlama2Tokenizer = kModels + "/tokenizer.bin";
#else
inline const std::string kLlama2Tokenizer = kModels + "/tokenizer.model";
#endif

inline Json ReadJson(const std::string& path) {
  std::ifstream f(path);
  return Json::parse(f);
}

struct HttpResult {
  int status = -1;
  Json body;
  std::string raw;
};

inline HttpResult Post(const std::string& address, const std::string& path, const Json& body,
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

inline std::string Get(const std::string& address, const std::string& path) {
  httplib::Client client("http://" + address);
  auto res = client.Get(path);
  return res ? res->body : "";
}

// The value of an unlabelled Prometheus series, or -1.
inline double Metric(const std::string& text, const std::string& name) {
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
inline Streamed ParseSse(const std::string& body) {
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

}  // namespace tandem::testing
