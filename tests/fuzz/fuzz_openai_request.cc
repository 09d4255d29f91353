// tandem-frontend's request parsing (issue 16: "the frontend's HTTP request
// and JSON body parsing") on arbitrary bytes: the body as each endpoint's
// (/v1/responses too), then, when it parses, the response and chunk (or
// event) rendering of what it holds.
// An ApiError or a request, never a crash. (The HTTP framing itself is
// Boost.Beast's parser.)
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "tandem/frontend/openai.h"
#include "tandem/frontend/openai_responses.h"
#include "tandem/frontend/stop_strings.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tandem::frontend;
  using tandem::FinishReason;
  const std::string_view body(reinterpret_cast<const char*>(data), size);
  for (Endpoint endpoint : {Endpoint::kCompletions, Endpoint::kChat}) {
    CompletionRequest request;
    if (auto error = ParseCompletionRequest(body, endpoint, &request)) {
      (void)error->ToJson();
      continue;
    }
    const ResponseHead head{.id = "x", .created = 1, .model = "m"};
    std::string text(body.substr(0, 64));
    (void)CompletionResponse(request, head, {Choice{.text = text}}, Usage{}, {{1, 2}})
        .dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
    (void)StreamChunk(request, head, {.text = text, .first = true});
    StopStringMatcher stops(request.stop);
    for (size_t i = 0; i < text.size(); i += 3) (void)stops.Push(text.substr(i, 3));
    (void)stops.Finish();
  }
  CompletionRequest request;
  if (auto error = ParseResponsesRequest(body, &request)) {
    (void)error->ToJson();
    return 0;
  }
  const ResponseHead head{.id = "resp_x", .created = 1, .model = "m"};
  const ResponsesOutput output{.text = std::string(body.substr(0, 64)),
                               .finish = FinishReason::kLength};
  (void)ResponsesObject(request, head, {.message_id = "msg_x"}, &output)
      .dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
  ResponsesEvents events(request, head, {.message_id = "msg_x"});
  (void)events.Start();
  (void)events.Delta(output.text);
  (void)events.Finish(FinishReason::kStop, Usage{},
                      {ToolCall{.id = "chatcmpl-tool-x", .name = output.text, .arguments = "{}"}});
  return 0;
}
