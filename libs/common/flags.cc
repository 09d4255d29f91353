#include "tandem/common/flags.h"

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <sstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "tandem/common/logging.h"

namespace tandem {
namespace {

absl::Status BadValue(const std::string& name, const std::string& value, const char* want) {
  return absl::InvalidArgumentError(absl::StrCat("flag --", name, ": '", value, "' is not ", want));
}

}  // namespace

FlagSet::FlagSet(std::string program, std::string description)
    : program_(std::move(program)), description_(std::move(description)) {}

void FlagSet::Add(const std::string& name, std::string* value, const std::string& doc) {
  flags_.push_back({name, doc, "\"" + *value + "\"", false, [value](const std::string& v) {
                      *value = v;
                      return absl::OkStatus();
                    }});
}

void FlagSet::Add(const std::string& name, int32_t* value, const std::string& doc) {
  flags_.push_back({name, doc, std::to_string(*value), false, [name, value](const std::string& v) {
                      int32_t x;
                      if (!absl::SimpleAtoi(v, &x)) return BadValue(name, v, "a 32-bit integer");
                      *value = x;
                      return absl::OkStatus();
                    }});
}

void FlagSet::Add(const std::string& name, int64_t* value, const std::string& doc) {
  flags_.push_back({name, doc, std::to_string(*value), false, [name, value](const std::string& v) {
                      int64_t x;
                      if (!absl::SimpleAtoi(v, &x)) return BadValue(name, v, "an integer");
                      *value = x;
                      return absl::OkStatus();
                    }});
}

void FlagSet::Add(const std::string& name, double* value, const std::string& doc) {
  std::ostringstream def;
  def << *value;
  flags_.push_back({name, doc, def.str(), false, [name, value](const std::string& v) {
                      double x;
                      if (!absl::SimpleAtod(v, &x)) return BadValue(name, v, "a number");
                      *value = x;
                      return absl::OkStatus();
                    }});
}

void FlagSet::Add(const std::string& name, bool* value, const std::string& doc) {
  flags_.push_back(
      {name, doc, *value ? "true" : "false", true, [name, value](const std::string& v) {
         if (v == "true" || v == "1" || v == "yes") {
           *value = true;
         } else if (v == "false" || v == "0" || v == "no") {
           *value = false;
         } else {
           return BadValue(name, v, "true or false");
         }
         return absl::OkStatus();
       }});
}

void FlagSet::Alias(const std::string& alias, const std::string& name) {
  Flag* flag = Find(name);
  TANDEM_CHECK(flag != nullptr) << "alias --" << alias << " of unknown flag --" << name;
  flag->aliases.push_back(alias);
}

void FlagSet::MirrorsVllm(std::initializer_list<const char*> names) {
  for (const char* name : names) {
    Flag* flag = Find(name);
    TANDEM_CHECK(flag != nullptr) << "unknown flag --" << name;
    flag->mirrors_vllm = true;
  }
}

void FlagSet::Add(const std::string& name, std::vector<std::string>* values,
                  const std::string& doc) {
  flags_.push_back({name, doc, "none (repeatable)", false, [values](const std::string& v) {
                      values->push_back(v);
                      return absl::OkStatus();
                    }});
}

FlagSet::Flag* FlagSet::Find(const std::string& name) {
  for (Flag& f : flags_) {
    if (f.name == name) return &f;
    for (const std::string& a : f.aliases) {
      if (a == name) return &f;
    }
  }
  return nullptr;
}

absl::Status FlagSet::Parse(int argc, char** argv, int first) {
  for (int i = first; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--") {
      for (++i; i < argc; ++i) positional_.push_back(argv[i]);
      break;
    }
    if (arg == "--help" || arg == "-h" || arg == "-help") {
      help_requested_ = true;
      continue;
    }
    if (arg.size() < 2 || arg[0] != '-') {
      positional_.push_back(arg);
      continue;
    }
    std::string body = arg.substr(arg[1] == '-' ? 2 : 1);
    std::string name = body;
    std::string value;
    bool has_value = false;
    if (size_t eq = body.find('='); eq != std::string::npos) {
      name = body.substr(0, eq);
      value = body.substr(eq + 1);
      has_value = true;
    }
    for (char& c : name) {
      if (c == '_') c = '-';
    }
    Flag* flag = Find(name);
    if (flag == nullptr && !has_value && name.rfind("no", 0) == 0) {
      Flag* negated = Find(name.substr(name.rfind("no-", 0) == 0 ? 3 : 2));
      if (negated != nullptr && negated->is_bool) {
        absl::Status s = negated->set("false");
        if (!s.ok()) return s;
        continue;
      }
    }
    if (flag == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("unknown flag --", name));
    }
    if (!has_value) {
      if (flag->is_bool) {
        value = "true";
      } else if (i + 1 < argc) {
        value = argv[++i];
      } else {
        return absl::InvalidArgumentError(absl::StrCat("flag --", name, " needs a value"));
      }
    }
    absl::Status s = flag->set(value);
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

void FlagSet::ParseOrExit(int argc, char** argv, int first) {
  absl::Status s = Parse(argc, argv, first);
  if (help_requested_) {
    std::cout << Help();
    std::exit(0);
  }
  if (!s.ok()) Fail(std::string(s.message()));
  // No Tandem program takes positional arguments: one is a mistake (a model
  // path without --model, a second --served-model-name value) that would
  // otherwise be ignored without a word.
  if (!positional_.empty()) {
    Fail("unexpected argument '" + positional_.front() + "': every argument is a --flag");
  }
}

void FlagSet::Fail(const std::string& message) const {
  std::cerr << program_ << ": " << message << " (see --help)\n";
  std::exit(2);
}

std::string FlagSet::Help() const {
  std::ostringstream out;
  out << "Usage: " << program_ << " [flags]\n" << description_ << "\n\nFlags:\n";
  bool any_vllm = false;
  for (const Flag& f : flags_) {
    out << "  --" << f.name;
    if (f.is_bool) out << ", --no-" << f.name;
    for (const std::string& a : f.aliases) out << ", --" << a;
    out << " (default: " << f.default_value << ")";
    if (f.mirrors_vllm) out << " [vLLM]";
    out << "\n      " << f.doc << "\n";
    any_vllm |= f.mirrors_vllm;
  }
  out << "  --help\n      Print this text and exit.\n";
  if (any_vllm) {
    out << "\nFlags marked [vLLM] take the same name, values and meaning as vLLM's (`vllm serve "
           "--help`).\n";
  }
  return out.str();
}

}  // namespace tandem
