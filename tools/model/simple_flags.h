// A tiny --name=value / --name value flag parser for the offline model tools.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <functional>
#include <iostream>
#include <map>
#include <string>
#include <vector>

namespace tandem::tools {

class SimpleFlags {
 public:
  explicit SimpleFlags(std::string usage) : usage_(std::move(usage)) {}

  // `apply` parses the value and returns false when it is malformed.
  void Add(const std::string& name, const std::string& default_text, const std::string& help,
           std::function<bool(const std::string&)> apply, bool is_bool = false) {
    flags_[name] = Flag{default_text, help, std::move(apply), is_bool};
    order_.push_back(name);
  }
  void String(const std::string& name, std::string* v, const std::string& help) {
    Add(name, *v, help, [v](const std::string& s) {
      *v = s;
      return true;
    });
  }
  void Int(const std::string& name, int64_t* v, const std::string& help) {
    Add(name, std::to_string(*v), help, [v](const std::string& s) {
      char* end = nullptr;
      *v = std::strtoll(s.c_str(), &end, 10);
      return !s.empty() && *end == '\0';
    });
  }
  void Float(const std::string& name, double* v, const std::string& help) {
    Add(name, std::to_string(*v), help, [v](const std::string& s) {
      char* end = nullptr;
      *v = std::strtod(s.c_str(), &end);
      return !s.empty() && *end == '\0';
    });
  }
  void Bool(const std::string& name, bool* v, const std::string& help) {
    Add(
        name, *v ? "true" : "false", help,
        [v](const std::string& s) {
          if (s.empty() || s == "true" || s == "1")
            *v = true;
          else if (s == "false" || s == "0")
            *v = false;
          else
            return false;
          return true;
        },
        /*is_bool=*/true);
  }

  // Parses argv; on --help prints usage and exits 0; on error prints it and exits 2.
  void Parse(int argc, char** argv) {
    for (int i = 1; i < argc; ++i) {
      std::string arg = argv[i];
      if (arg == "--help" || arg == "-h") {
        PrintHelp(std::cout);
        std::exit(0);
      }
      if (arg.rfind("--", 0) != 0) Fail("unexpected argument '" + arg + "'");
      std::string name = arg.substr(2), value;
      const size_t eq = name.find('=');
      bool has_value = eq != std::string::npos;
      if (has_value) {
        value = name.substr(eq + 1);
        name = name.substr(0, eq);
      }
      auto it = flags_.find(name);
      if (it == flags_.end()) Fail("unknown flag --" + name);
      if (!has_value && !it->second.is_bool) {
        if (i + 1 >= argc) Fail("flag --" + name + " needs a value");
        value = argv[++i];
      }
      if (!it->second.apply(value)) Fail("bad value '" + value + "' for --" + name);
    }
  }

  void PrintHelp(std::ostream& os) const {
    os << usage_ << "\n\nFlags:\n";
    for (const std::string& n : order_) {
      const Flag& f = flags_.at(n);
      os << "  --" << n << "  " << f.help
         << " (default: " << (f.default_text.empty() ? "\"\"" : f.default_text) << ")\n";
    }
  }

  [[noreturn]] void Fail(const std::string& msg) const {
    std::cerr << "error: " << msg << "\n\n";
    PrintHelp(std::cerr);
    std::exit(2);
  }

 private:
  struct Flag {
    std::string default_text, help;
    std::function<bool(const std::string&)> apply;
    bool is_bool = false;
  };
  std::string usage_;
  std::map<std::string, Flag> flags_;
  std::vector<std::string> order_;
};

}  // namespace tandem::tools
