#include "tandem/model/json.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace tandem::model {

class JsonParser {
 public:
  explicit JsonParser(const std::string& text) : s_(text) {}

  absl::StatusOr<JsonValue> ParseDocument() {
    JsonValue v;
    if (!ParseValue(&v, 0)) return Error();
    SkipSpace();
    if (pos_ != s_.size()) {
      error_ = "trailing characters";
      return Error();
    }
    return v;
  }

 private:
  absl::Status Error() const {
    return absl::InvalidArgumentError(absl::StrCat("JSON parse error at byte ", pos_, ": ",
                                                   error_.empty() ? "bad syntax" : error_));
  }
  void SkipSpace() {
    while (pos_ < s_.size() &&
           (s_[pos_] == ' ' || s_[pos_] == '\t' || s_[pos_] == '\n' || s_[pos_] == '\r')) {
      ++pos_;
    }
  }
  bool Literal(const char* word) {
    const size_t n = std::strlen(word);
    if (s_.compare(pos_, n, word) != 0) return false;
    pos_ += n;
    return true;
  }
  bool ParseValue(JsonValue* v, int depth) {
    if (depth > 64) {
      error_ = "nesting too deep";
      return false;
    }
    SkipSpace();
    if (pos_ >= s_.size()) {
      error_ = "unexpected end";
      return false;
    }
    const char c = s_[pos_];
    if (c == '{') return ParseObject(v, depth);
    if (c == '[') return ParseArray(v, depth);
    if (c == '"') {
      v->type_ = JsonValue::Type::kString;
      return ParseString(&v->string_);
    }
    if (Literal("null")) {
      v->type_ = JsonValue::Type::kNull;
      return true;
    }
    if (Literal("true")) {
      v->type_ = JsonValue::Type::kBool;
      v->bool_ = true;
      return true;
    }
    if (Literal("false")) {
      v->type_ = JsonValue::Type::kBool;
      v->bool_ = false;
      return true;
    }
    if (c == '-' || (c >= '0' && c <= '9')) {
      const char* begin = s_.c_str() + pos_;
      char* end = nullptr;
      v->number_ = std::strtod(begin, &end);
      if (end == begin) {
        error_ = "bad number";
        return false;
      }
      pos_ += static_cast<size_t>(end - begin);
      v->type_ = JsonValue::Type::kNumber;
      return true;
    }
    error_ = absl::StrCat("unexpected character '", std::string(1, c), "'");
    return false;
  }
  bool ParseString(std::string* out) {
    ++pos_;  // opening quote
    while (pos_ < s_.size()) {
      const char c = s_[pos_++];
      if (c == '"') return true;
      if (c != '\\') {
        out->push_back(c);
        continue;
      }
      if (pos_ >= s_.size()) break;
      const char e = s_[pos_++];
      switch (e) {
        case '"':
          out->push_back('"');
          break;
        case '\\':
          out->push_back('\\');
          break;
        case '/':
          out->push_back('/');
          break;
        case 'b':
          out->push_back('\b');
          break;
        case 'f':
          out->push_back('\f');
          break;
        case 'n':
          out->push_back('\n');
          break;
        case 'r':
          out->push_back('\r');
          break;
        case 't':
          out->push_back('\t');
          break;
        case 'u': {
          if (pos_ + 4 > s_.size()) {
            error_ = "bad \\u escape";
            return false;
          }
          const unsigned cp =
              static_cast<unsigned>(std::strtoul(s_.substr(pos_, 4).c_str(), nullptr, 16));
          pos_ += 4;
          if (cp < 0x80) {
            out->push_back(static_cast<char>(cp));
          } else if (cp < 0x800) {
            out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
            out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
          } else {
            out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
            out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
            out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
          }
          break;
        }
        default:
          error_ = "bad escape";
          return false;
      }
    }
    error_ = "unterminated string";
    return false;
  }
  bool ParseArray(JsonValue* v, int depth) {
    ++pos_;
    v->type_ = JsonValue::Type::kArray;
    SkipSpace();
    if (pos_ < s_.size() && s_[pos_] == ']') {
      ++pos_;
      return true;
    }
    while (true) {
      JsonValue item;
      if (!ParseValue(&item, depth + 1)) return false;
      v->array_.push_back(std::move(item));
      SkipSpace();
      if (pos_ < s_.size() && s_[pos_] == ',') {
        ++pos_;
        continue;
      }
      if (pos_ < s_.size() && s_[pos_] == ']') {
        ++pos_;
        return true;
      }
      error_ = "expected ',' or ']'";
      return false;
    }
  }
  bool ParseObject(JsonValue* v, int depth) {
    ++pos_;
    v->type_ = JsonValue::Type::kObject;
    SkipSpace();
    if (pos_ < s_.size() && s_[pos_] == '}') {
      ++pos_;
      return true;
    }
    while (true) {
      SkipSpace();
      if (pos_ >= s_.size() || s_[pos_] != '"') {
        error_ = "expected a string key";
        return false;
      }
      std::string key;
      if (!ParseString(&key)) return false;
      SkipSpace();
      if (pos_ >= s_.size() || s_[pos_] != ':') {
        error_ = "expected ':'";
        return false;
      }
      ++pos_;
      JsonValue item;
      if (!ParseValue(&item, depth + 1)) return false;
      v->object_[key] = std::move(item);
      SkipSpace();
      if (pos_ < s_.size() && s_[pos_] == ',') {
        ++pos_;
        continue;
      }
      if (pos_ < s_.size() && s_[pos_] == '}') {
        ++pos_;
        return true;
      }
      error_ = "expected ',' or '}'";
      return false;
    }
  }

  const std::string& s_;
  size_t pos_ = 0;
  std::string error_;
};

absl::StatusOr<JsonValue> JsonValue::Parse(const std::string& text) {
  return JsonParser(text).ParseDocument();
}

const JsonValue* JsonValue::Find(const std::string& key) const {
  if (type_ != Type::kObject) return nullptr;
  auto it = object_.find(key);
  return it == object_.end() ? nullptr : &it->second;
}

std::string JsonQuote(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') {
      out.push_back('\\');
      out.push_back(c);
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\u%04x", c);
      out += buf;
    } else {
      out.push_back(c);
    }
  }
  out.push_back('"');
  return out;
}

}  // namespace tandem::model
