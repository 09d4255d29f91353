// The regexes are xgrammar's (json_schema_converter.cc,
// JSONFormatToRegexPattern, 2026-08), written out here as the language to
// match: vLLM's answers are the reference. Each reads only printable ASCII
// other than '"' and '\', so the value needs no escape and the text between
// the quotes is the value.
#include "json_formats.h"

#include <map>

namespace tandem::grammar::internal {
namespace {

const std::map<std::string, std::string, std::less<>>& HeldFormats() {
  static const auto* formats = [] {
    auto* m = new std::map<std::string, std::string, std::less<>>;
    const std::string date = R"((\d{4}-(0[1-9]|1[0-2])-(0[1-9]|[1-2]\d|3[01])))";
    const std::string time =
        R"(([01]\d|2[0-3]):[0-5]\d:([0-5]\d|60)(\.\d+)?(Z|[+-]([01]\d|2[0-3]):[0-5]\d))";
    (*m)["date"] = "^" + date + "$";
    (*m)["time"] = "^" + time + "$";
    (*m)["date-time"] = "^" + date + "T" + time + "$";
    const std::string hms = R"((\d+S|\d+M(\d+S)?|\d+H(\d+M(\d+S)?)?))";
    (*m)["duration"] =
        R"(^P((\d+D|\d+M(\d+D)?|\d+Y(\d+M(\d+D)?)?)(T)" + hms + ")?|T" + hms + R"(|\d+W)$)";
    const std::string byte = R"((25[0-5]|2[0-4]\d|[0-1]?\d?\d))";
    (*m)["ipv4"] = "^(" + byte + R"(\.){3})" + byte + "$";
    const std::string h = "[0-9a-fA-F]{1,4}";
    const std::string v4 = R"(((25[0-5]|(2[0-4]|1{0,1}[0-9]){0,1}[0-9])\.){3,3})"
                           "(25[0-5]|(2[0-4]|1{0,1}[0-9]){0,1}[0-9])";
    (*m)["ipv6"] = "((" + h + ":){7,7}" + h + "|(" + h + ":){1,7}:|(" + h + ":){1,6}:" + h + "|(" +
                   h + ":){1,5}(:" + h + "){1,2}|(" + h + ":){1,4}(:" + h + "){1,3}|(" + h +
                   ":){1,3}(:" + h + "){1,4}|(" + h + ":){1,2}(:" + h + "){1,5}|" + h + ":((:" + h +
                   "){1,6})|:((:" + h + "){1,7}|:)|::(ffff(:0{1,4}){0,1}:){0,1}" + v4 + "|(" + h +
                   ":){1,4}:" + v4 + ")";
    (*m)["hostname"] = R"(^([a-z0-9]([a-z0-9-]*[a-z0-9])?)(\.[a-z0-9]([a-z0-9-]*[a-z0-9])?)*$)";
    (*m)["uuid"] = "^[0-9A-Fa-f]{8}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{12}$";
    // RFC 3986.
    const std::string pct = "%[0-9A-Fa-f][0-9A-Fa-f]";
    const std::string pchar = R"(([\w\.~!$&'()*+,;=:@-]|)" + pct + ")";
    const std::string qf = R"(([\w\.~!$&'()*+,;=:@/\?-]|)" + pct + ")*";
    const std::string query = R"((\?)" + qf + ")?";
    const std::string fragment = "(#" + qf + ")?";
    const std::string path_abempty = "(/" + pchar + "*)*";
    const std::string userinfo = R"(([\w\.~!$&'()*+,;=:-]|)" + pct + ")*";
    const std::string host = R"(([\w\.~!$&'()*+,;=-]|)" + pct + ")*";
    const std::string authority = "(" + userinfo + "@)?" + host + R"((:\d*)?)";
    const std::string rootless = "/?(" + pchar + "+(/" + pchar + "*)*)?";
    (*m)["uri"] = R"(^[a-zA-Z][a-zA-Z+\.-]*:(//)" + authority + path_abempty + "|" + rootless +
                  ")" + query + fragment + "$";
    const std::string absolute = "/(" + pchar + "+(/" + pchar + "*)*)?";
    const std::string noscheme = R"(([\w\.~!$&'()*+,;=@-]|)" + pct + ")+(/" + pchar + "*)*";
    (*m)["uri-reference"] = "^(//" + authority + path_abempty + "|" + absolute + "|" + noscheme +
                            ")?" + query + fragment + "$";
    const std::string literals =
        R"(([\x21\x23-\x24\x26\x28-\x3B\x3D\x3F-\x5B\x5D\x5F\x61-\x7A\x7E]|)" + pct + ")";
    const std::string varchar = R"((\w|)" + pct + ")";
    const std::string varspec = varchar + R"((\.?)" + varchar + R"()*(:[1-9]\d?\d?\d?|\*)?)";
    (*m)["uri-template"] =
        "^(" + literals + R"(|\{([+#\./;\?&=,!@|])?)" + varspec + "(," + varspec + R"()*\})*$)";
    return m;
  }();
  return *formats;
}

}  // namespace

FormatRule JsonFormat(std::string_view format) {
  if (auto it = HeldFormats().find(format); it != HeldFormats().end()) {
    return {.kind = FormatRule::kHeld, .regex = it->second};
  }
  if (format == "email") {
    return {.kind = FormatRule::kRefused,
            .why =
                "xgrammar's email admits a quoted local part whose backslashes are not JSON "
                "escapes"};
  }
  if (format == "json-pointer" || format == "relative-json-pointer") {
    return {.kind = FormatRule::kRefused,
            .why = "xgrammar's " + std::string(format) +
                   " admits control characters, '\"' and '\\' unescaped"};
  }
  return {};
}

}  // namespace tandem::grammar::internal
