// A small JSON reader (RFC 8259 subset: no surrogate-pair decoding beyond
// UTF-8 passthrough of \u escapes below 0x800) for config.json, safetensors
// headers and the reference outputs. Not for untrusted multi-megabyte input.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace tandem::model {

class JsonValue {
 public:
  enum class Type { kNull, kBool, kNumber, kString, kArray, kObject };

  static absl::StatusOr<JsonValue> Parse(const std::string& text);

  Type type() const { return type_; }
  bool is_null() const { return type_ == Type::kNull; }
  bool is_number() const { return type_ == Type::kNumber; }
  bool is_string() const { return type_ == Type::kString; }
  bool is_array() const { return type_ == Type::kArray; }
  bool is_object() const { return type_ == Type::kObject; }
  bool is_bool() const { return type_ == Type::kBool; }

  double number() const { return number_; }
  bool boolean() const { return bool_; }
  const std::string& str() const { return string_; }
  const std::vector<JsonValue>& array() const { return array_; }
  // Members in key order.
  const std::map<std::string, JsonValue>& object() const { return object_; }
  // Member `key` of an object, or nullptr.
  const JsonValue* Find(const std::string& key) const;

 private:
  friend class JsonParser;
  Type type_ = Type::kNull;
  bool bool_ = false;
  double number_ = 0;
  std::string string_;
  std::vector<JsonValue> array_;
  std::map<std::string, JsonValue> object_;
};

// Serializes a string as a JSON string literal (with quotes).
std::string JsonQuote(const std::string& s);

}  // namespace tandem::model
