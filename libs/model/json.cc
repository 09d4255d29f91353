#include "tandem/model/json.h"

#include <string>

#include "absl/strings/str_cat.h"

namespace tandem::model {

absl::StatusOr<nlohmann::json> ParseJson(std::string_view text) {
  bool too_deep = false;
  nlohmann::json::parser_callback_t depth_check =
      [&too_deep](int depth, nlohmann::json::parse_event_t, nlohmann::json&) {
        if (depth > kMaxJsonDepth) too_deep = true;
        return !too_deep;
      };
  try {
    nlohmann::json doc = nlohmann::json::parse(text, depth_check);
    if (too_deep) {
      return absl::InvalidArgumentError(
          absl::StrCat("JSON parse error at byte 0: nested deeper than ", kMaxJsonDepth));
    }
    return doc;
  } catch (const nlohmann::json::parse_error& e) {
    return absl::InvalidArgumentError(
        absl::StrCat("JSON parse error at byte ", e.byte, ": ", std::string(e.what())));
  } catch (const nlohmann::json::exception& e) {
    // out_of_range: a number past a double's range (fuzz_json found it).
    return absl::InvalidArgumentError(absl::StrCat("JSON parse error: ", std::string(e.what())));
  }
}

const nlohmann::json* JsonMember(const nlohmann::json& object, std::string_view key) {
  if (!object.is_object()) return nullptr;
  auto it = object.find(std::string(key));
  return it == object.end() ? nullptr : &*it;
}

}  // namespace tandem::model
