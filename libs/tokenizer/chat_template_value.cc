#include "chat_template_value.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <set>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace tandem::tokenizer::internal::jinja {

bool Truthy(const Value& v) {
  if (v.undefined) return false;
  const Json& j = v.json;
  switch (j.type()) {
    case Json::value_t::null:
      return false;
    case Json::value_t::boolean:
      return j.get<bool>();
    case Json::value_t::number_integer:
    case Json::value_t::number_unsigned:
      return j.get<int64_t>() != 0;
    case Json::value_t::number_float:
      return j.get<double>() != 0;
    case Json::value_t::string:
      return !j.get_ref<const std::string&>().empty();
    case Json::value_t::array:
    case Json::value_t::object:
      return !j.empty();
    default:
      return false;
  }
}

std::string ToJson(const Json& j, int indent, bool sort_keys, int depth) {
  if (!j.is_array() && !j.is_object()) return j.dump();
  if (j.empty()) return j.is_array() ? "[]" : "{}";
  std::vector<std::string> parts;
  if (j.is_array()) {
    for (const Json& x : j) parts.push_back(ToJson(x, indent, sort_keys, depth + 1));
  } else {
    std::vector<std::pair<std::string, const Json*>> items;
    for (const auto& [k, x] : j.items()) items.emplace_back(k, &x);
    if (sort_keys) std::sort(items.begin(), items.end());
    for (const auto& [k, x] : items) {
      parts.push_back(absl::StrCat(Json(k).dump(), ": ", ToJson(*x, indent, sort_keys, depth + 1)));
    }
  }
  const char* open = j.is_array() ? "[" : "{";
  const char* close = j.is_array() ? "]" : "}";
  if (indent < 0) return absl::StrCat(open, absl::StrJoin(parts, ", "), close);
  const std::string inner = "\n" + std::string(static_cast<size_t>(indent * (depth + 1)), ' ');
  const std::string outer = "\n" + std::string(static_cast<size_t>(indent * depth), ' ');
  return absl::StrCat(open, inner, absl::StrJoin(parts, "," + inner), outer, close);
}

std::string ToString(const Value& v) {
  if (v.undefined || v.json.is_null()) return "";
  const Json& j = v.json;
  if (j.is_string()) return j.get<std::string>();
  if (j.is_boolean()) return j.get<bool>() ? "true" : "false";
  if (j.is_number_integer()) return std::to_string(j.get<int64_t>());
  return ToJson(j);
}

std::vector<std::string> Chars(const std::string& s) {
  std::vector<std::string> chars;
  for (size_t i = 0; i < s.size();) {
    size_t n = 1;
    while (i + n < s.size() && (static_cast<unsigned char>(s[i + n]) & 0xC0) == 0x80) ++n;
    chars.push_back(s.substr(i, n));
    i += n;
  }
  return chars;
}

bool IsInt(const Json& j) { return j.is_number_integer() || j.is_number_unsigned(); }

bool IsPythonSpace(std::string_view c) {
  if (c.size() == 1) {
    const unsigned char b = static_cast<unsigned char>(c[0]);
    return b == ' ' || (b >= '\t' && b <= '\r') || (b >= 0x1c && b <= 0x1f);
  }
  static const std::set<std::string_view> kWide = {"\u0085", "\u00a0", "\u1680", "\u2000", "\u2001",
                                                   "\u2002", "\u2003", "\u2004", "\u2005", "\u2006",
                                                   "\u2007", "\u2008", "\u2009", "\u200a", "\u2028",
                                                   "\u2029", "\u202f", "\u205f", "\u3000"};
  return kWide.contains(c);
}

std::string Strip(std::string s, bool left, bool right, const std::optional<std::string>& chars) {
  // By character, as Python strips (chars: any of its characters; none:
  // Unicode whitespace, str.isspace).
  const std::vector<std::string> set = chars ? Chars(*chars) : std::vector<std::string>{};
  auto strip_it = [&](const std::string& c) {
    return chars ? std::find(set.begin(), set.end(), c) != set.end() : IsPythonSpace(c);
  };
  std::vector<std::string> cs = Chars(s);
  size_t begin = 0, end = cs.size();
  if (left) {
    while (begin < end && strip_it(cs[begin])) ++begin;
  }
  if (right) {
    while (end > begin && strip_it(cs[end - 1])) --end;
  }
  std::string out;
  for (size_t k = begin; k < end; ++k) out += cs[k];
  return out;
}

std::vector<std::string> SplitWhitespace(const std::string& s, int64_t maxsplit) {
  std::vector<std::string> out;
  std::string word;
  bool in_word = false;
  const std::vector<std::string> cs = Chars(s);
  for (size_t k = 0; k < cs.size(); ++k) {
    if (maxsplit >= 0 && std::ssize(out) == maxsplit && in_word == false && !IsPythonSpace(cs[k])) {
      // The rest as it is, trailing whitespace kept (Python's rule).
      std::string rest;
      for (size_t j = k; j < cs.size(); ++j) rest += cs[j];
      out.push_back(std::move(rest));
      return out;
    }
    if (IsPythonSpace(cs[k])) {
      if (in_word) out.push_back(std::move(word));
      word.clear();
      in_word = false;
    } else {
      word += cs[k];
      in_word = true;
    }
  }
  if (in_word) out.push_back(std::move(word));
  return out;
}

std::string Title(const std::string& s) {
  std::string out = s;
  bool start = true;
  for (char& c : out) {
    c = start ? absl::ascii_toupper(c) : absl::ascii_tolower(c);
    start = !absl::ascii_isalnum(c);
  }
  return out;
}

const Json* Item(const Json& j, const Json& key, int line) {
  if (j.is_null()) return nullptr;
  if (j.is_object()) {
    if (!key.is_string()) return nullptr;
    auto it = j.find(key.get<std::string>());
    return it == j.end() ? nullptr : &*it;
  }
  if (j.is_array() && IsInt(key)) {
    int64_t k = key.get<int64_t>();
    if (k < 0) k += static_cast<int64_t>(j.size());
    if (k < 0 || k >= static_cast<int64_t>(j.size())) return nullptr;
    return &j[static_cast<size_t>(k)];
  }
  if (j.is_array() && key.is_string()) return nullptr;
  Fail(line, absl::StrCat("cannot index ", ToJson(j), " with ", ToJson(key)));
}

Value GetItem(const Value& v, const Json& key, int line) {
  // Jinja2's Undefined raises on any attribute or item (UndefinedError).
  if (v.undefined) Fail(line, absl::StrCat(ToJson(key), " of an undefined value"));
  const Json& j = v.json;
  if (j.is_string()) {
    if (!IsInt(key)) return Value::Undefined();
    const std::vector<std::string> chars = Chars(j.get<std::string>());
    int64_t k = key.get<int64_t>();
    if (k < 0) k += static_cast<int64_t>(chars.size());
    if (k < 0 || k >= static_cast<int64_t>(chars.size())) return Value::Undefined();
    return Value{chars[static_cast<size_t>(k)]};
  }
  const Json* item = Item(j, key, line);
  return item ? Value{*item} : Value::Undefined();
}

bool Contains(const Value& haystack, const Value& needle, int line) {
  const Json& h = haystack.json;
  if (h.is_string())
    return h.get_ref<const std::string&>().find(ToString(needle)) != std::string::npos;
  if (h.is_array()) return std::find(h.begin(), h.end(), needle.json) != h.end();
  if (h.is_object()) return needle.json.is_string() && h.contains(needle.json.get<std::string>());
  if (haystack.undefined || h.is_null()) return false;
  Fail(line, "'in' of a value that is not a string or collection");
}

Value BinaryOp(const std::string& op, const Value& a, const Value& b, int line) {
  const Json &x = a.json, &y = b.json;
  if (op == "==") return Value{a.undefined == b.undefined && x == y};
  if (op == "!=") return Value{!(a.undefined == b.undefined && x == y)};
  if (op == "in") return Value{Contains(b, a, line)};
  if (op == "not in") return Value{!Contains(b, a, line)};
  if (op == "~") return Value{ToString(a) + ToString(b)};
  if (op == "+" && (x.is_string() || y.is_string())) return Value{ToString(a) + ToString(b)};
  if (op == "+" && x.is_array() && y.is_array()) {
    Json out = x;
    out.insert(out.end(), y.begin(), y.end());
    return Value{std::move(out)};
  }
  if (op == "<" || op == ">" || op == "<=" || op == ">=") {
    if (!((x.is_number() && y.is_number()) || (x.is_string() && y.is_string()))) {
      Fail(line, absl::StrCat("cannot compare ", ToJson(x), " ", op, " ", ToJson(y)));
    }
    const bool lt = x < y, gt = y < x;
    return Value{op == "<" ? lt : op == ">" ? gt : op == "<=" ? !gt : !lt};
  }
  if (!x.is_number() || !y.is_number() || x.is_boolean() || y.is_boolean()) {
    Fail(line, absl::StrCat("'", op, "' of ", ToJson(x), " and ", ToJson(y)));
  }
  if (IsInt(x) && IsInt(y) && op != "/") {
    const int64_t p = x.get<int64_t>(), q = y.get<int64_t>();
    // Python's integers have no bound; ours refuse what int64 cannot hold.
    int64_t r = 0;
    if ((op == "+" && __builtin_add_overflow(p, q, &r)) ||
        (op == "-" && __builtin_sub_overflow(p, q, &r)) ||
        (op == "*" && __builtin_mul_overflow(p, q, &r)) ||
        ((op == "//" || op == "%") && p == INT64_MIN && q == -1)) {
      Fail(line, absl::StrCat(p, " ", op, " ", q, " does not fit in 64 bits"));
    }
    if (op == "+" || op == "-" || op == "*") return Value{r};
    if (q == 0) Fail(line, "division by zero");
    // Python's floor division and modulo.
    int64_t d = p / q;
    r = p % q;
    if (r != 0 && ((r < 0) != (q < 0))) {
      --d;
      r += q;
    }
    return Value{op == "//" ? d : r};
  }
  const double p = x.get<double>(), q = y.get<double>();
  if (op == "+") return Value{p + q};
  if (op == "-") return Value{p - q};
  if (op == "*") return Value{p * q};
  if (q == 0) Fail(line, "division by zero");
  if (op == "/") return Value{p / q};
  if (op == "//") return Value{std::floor(p / q)};
  return Value{p - q * std::floor(p / q)};
}

}  // namespace tandem::tokenizer::internal::jinja
