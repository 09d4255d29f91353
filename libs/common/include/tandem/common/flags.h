// The command-line flag parser of every Tandem binary and tool (services,
// the CLI, the model tools).
//
//   int32_t port = 50051;
//   tandem::FlagSet flags("tandem-worker", "Runs the model for a scheduler.");
//   flags.Add("port", &port, "TCP port to listen on");
//   flags.ParseOrExit(argc, argv);   // --help prints every flag, its default and doc
//
// Accepted forms: --name=value, --name value, and for booleans --name,
// --no-name (vLLM's spelling), --noname, --name=true|false|1|0. The default printed by --help is
// the value the variable holds when it is registered. "--" ends flag parsing; other arguments are
// returned as positionals.
#pragma once

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace tandem {

class FlagSet {
 public:
  FlagSet(std::string program, std::string description);

  void Add(const std::string& name, std::string* value, const std::string& doc);
  void Add(const std::string& name, int32_t* value, const std::string& doc);
  void Add(const std::string& name, int64_t* value, const std::string& doc);
  void Add(const std::string& name, double* value, const std::string& doc);
  void Add(const std::string& name, bool* value, const std::string& doc);
  // Repeatable: each occurrence appends its value.
  void Add(const std::string& name, std::vector<std::string>* values, const std::string& doc);
  // Makes --alias another name of the registered flag --name.
  void Alias(const std::string& alias, const std::string& name);
  // Marks registered flags as mirroring vLLM's flags of the same name and
  // meaning; --help says so.
  void MirrorsVllm(std::initializer_list<const char*> names);

  // Parses argv[first..argc). Unknown flags and malformed values are
  // INVALID_ARGUMENT naming the flag. Sets help_requested() on --help / -h.
  [[nodiscard]] absl::Status Parse(int argc, char** argv, int first = 1);
  // Parse, then: on --help print Help() to stdout and exit(0); on error, or
  // on any positional argument (no Tandem program takes one), print the
  // message and a hint to stderr and exit(2).
  void ParseOrExit(int argc, char** argv, int first = 1);

  // A usage error found after parsing: prints "<program>: <message>" and a
  // hint to stderr and exits 2 (as ParseOrExit does for its own errors).
  [[noreturn]] void Fail(const std::string& message) const;

  [[nodiscard]] bool help_requested() const { return help_requested_; }
  [[nodiscard]] const std::vector<std::string>& positional() const { return positional_; }
  // "usage" text: description, then one entry per flag with default and doc.
  [[nodiscard]] std::string Help() const;

 private:
  struct Flag {
    std::string name;
    std::string doc;
    std::string default_value;
    bool is_bool = false;
    std::function<absl::Status(const std::string&)> set;
    bool mirrors_vllm = false;
    std::vector<std::string> aliases;
  };
  Flag* Find(const std::string& name);

  std::string program_;
  std::string description_;
  std::vector<Flag> flags_;
  std::vector<std::string> positional_;
  bool help_requested_ = false;
};

}  // namespace tandem
