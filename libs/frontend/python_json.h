// Python's json module as vLLM's tool parsers run it: json.loads and
// JSONDecoder.raw_decode read a model's JSON, json.dumps writes a call's
// arguments. Our own, not nlohmann's: Python reads what nlohmann refuses
// (NaN, Infinity, -Infinity) and keeps what nlohmann rounds (integers past
// 64 bits, written back digit for digit), a repeated key keeps its first
// place and its last value, and floats are written as Python's repr
// (1e15 as 1000000000000000.0, where nlohmann writes 1e+15).
// A lone surrogate escape (\ud800 without its pair) is kept, as Python
// keeps it, but cannot be written out: vLLM's response would not encode,
// and here the call is refused (its answer stays content).
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace tandem::frontend::internal {

struct PyJsonMember;

struct PyJson {
  enum class Type { kNull, kBool, kNumber, kString, kArray, kObject };
  Type type = Type::kNull;
  // kBool and kNumber: as json.dumps writes the value ("true", "1e+16");
  // kString: the value, UTF-8.
  std::string text;
  std::vector<PyJson> items;                             // kArray
  std::vector<PyJsonMember> members;  // kObject, each key once

  // kObject's member `key`, or nullptr.
  [[nodiscard]] const PyJson* Find(std::string_view key) const;
};

struct PyJsonMember {
  std::string key;
  PyJson value;
};

// JSONDecoder.raw_decode(text[pos:]): the value that starts at pos and the
// offset just past it (whatever follows); nullopt where Python raises.
[[nodiscard]] std::optional<std::pair<PyJson, size_t>> PyJsonRawDecode(std::string_view text,
                                                                       size_t pos);

// json.loads(text): one value with JSON's whitespace around it.
[[nodiscard]] std::optional<PyJson> PyJsonLoads(std::string_view text);

// json.dumps(value, ensure_ascii=...): ", " and ": " separators; nullopt
// where a string holds a lone surrogate (see the top of this file).
[[nodiscard]] std::optional<std::string> PyJsonDumps(const PyJson& value, bool ensure_ascii);
// Whether a string PyJson read holds a lone surrogate.
[[nodiscard]] bool PyJsonHasLoneSurrogate(std::string_view utf8);

// json.dumps of one string (`utf8`): its quotes and escapes.
[[nodiscard]] std::string PyJsonQuote(std::string_view utf8, bool ensure_ascii);

// Python's repr of a float as json.dumps writes it: the shortest digits
// that read back, exponent form below 1e-4 and from 1e16 on ("1e-05",
// "1e+16"), ".0" on integral values, Infinity and NaN.
[[nodiscard]] std::string PythonFloatRepr(double value);

}  // namespace tandem::frontend::internal
