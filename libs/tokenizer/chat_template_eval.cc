#include "chat_template_eval.h"

#include <algorithm>
#include <cstdint>
#include <ctime>
#include <map>
#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "chat_template_value.h"

namespace tandem::tokenizer::internal::jinja {
namespace {

class Renderer {
 public:
  explicit Renderer(const ChatTemplateInputs& inputs) : max_steps_(inputs.max_steps) {
    scopes_.emplace_back();
    auto& globals = scopes_.back();
    if (inputs.extra_context.is_object()) {
      for (const auto& [k, v] : inputs.extra_context.items()) globals[k] = Value{v};
    }
    globals["messages"] = Value{inputs.messages};
    globals["add_generation_prompt"] = Value{inputs.add_generation_prompt};
    globals["bos_token"] = Value{inputs.bos_token};
    globals["eos_token"] = Value{inputs.eos_token};
  }

  void Render(const NodeList& nodes, std::string& out) {
    for (const auto& n : nodes) {
      Step(n->line);
      if (out.size() > kMaxRenderedBytes) {
        Fail(n->line, absl::StrCat("the rendered prompt passed ", kMaxRenderedBytes, " bytes"));
      }
      switch (n->kind) {
        case Node::kText:
          out += n->text;
          break;
        case Node::kOutput:
          out += ToString(Eval(*n->exprs[0]));
          break;
        case Node::kIf: {
          size_t k = 0;
          while (k < n->exprs.size() && !Truthy(Eval(*n->exprs[k]))) ++k;
          if (k < n->bodies.size()) Render(n->bodies[k], out);
          break;
        }
        case Node::kFor:
          RenderFor(*n, out);
          break;
        case Node::kSet: {
          Value v = Eval(*n->exprs[0]);
          if (n->names.size() == 1) {
            scopes_.back()[n->names[0]] = std::move(v);
          } else {
            Value* target = Lookup(n->names[0]);
            if (target == nullptr || !target->json.is_object()) {
              Fail(n->line, absl::StrCat("'", n->names[0], "' is not a namespace"));
            }
            target->json[n->names[1]] = std::move(v.json);
          }
          break;
        }
      }
    }
  }

 private:
  // The functions a template may call without defining them.
  static bool IsGlobalFunction(const std::string& name) {
    return name == "strftime_now" || name == "raise_exception" || name == "namespace" ||
           name == "range";
  }

  Value* Lookup(const std::string& name) {
    for (auto it = scopes_.rbegin(); it != scopes_.rend(); ++it) {
      auto found = it->find(name);
      if (found != it->end()) return &found->second;
    }
    return nullptr;
  }

  std::vector<Json> Items(const Value& v, int line) {
    if (v.undefined || v.json.is_null()) return {};
    if (v.json.is_array()) return std::vector<Json>(v.json.begin(), v.json.end());
    if (v.json.is_object()) {  // a dict iterates over its keys
      std::vector<Json> keys;
      for (const auto& [k, x] : v.json.items()) keys.push_back(k);
      return keys;
    }
    if (v.json.is_string()) {
      std::vector<Json> chars;
      for (std::string& c : Chars(v.json.get<std::string>())) chars.push_back(std::move(c));
      return chars;
    }
    Fail(line, absl::StrCat("cannot iterate over ", ToJson(v.json)));
  }

  void RenderFor(const Node& n, std::string& out) {
    std::vector<Json> items = Items(Eval(*n.exprs[0]), n.line);
    scopes_.emplace_back();
    auto bind = [&](const Json& item) {
      auto& scope = scopes_.back();
      if (n.names.size() == 1) {
        scope[n.names[0]] = Value{item};
        return;
      }
      if (!item.is_array() || item.size() != n.names.size()) {
        Fail(n.line,
             absl::StrCat("cannot unpack ", ToJson(item), " into ", n.names.size(), " names"));
      }
      for (size_t k = 0; k < n.names.size(); ++k) scope[n.names[k]] = Value{item[k]};
    };
    if (n.exprs[1]) {  // `for x in xs if cond`: the loop sees only what passes
      std::vector<Json> kept;
      for (const Json& item : items) {
        bind(item);
        if (Truthy(Eval(*n.exprs[1]))) kept.push_back(item);
      }
      items = std::move(kept);
    }
    const int64_t length = static_cast<int64_t>(items.size());
    for (int64_t k = 0; k < length; ++k) {
      Step(n.line);
      scopes_.back().clear();
      bind(items[k]);
      Json loop = {{"index", k + 1},         {"index0", k},
                   {"revindex", length - k}, {"revindex0", length - k - 1},
                   {"first", k == 0},        {"last", k == length - 1},
                   {"length", length}};
      loop["previtem"] = k > 0 ? items[k - 1] : Json();
      loop["nextitem"] = k + 1 < length ? items[k + 1] : Json();
      scopes_.back()["loop"] = Value{std::move(loop)};
      Render(n.bodies[0], out);
    }
    scopes_.pop_back();
    if (length == 0 && n.bodies.size() > 1) Render(n.bodies[1], out);
  }

  // One unit of the render's work budget.
  void Step(int line) {
    if (++steps_ > max_steps_) {
      Fail(line, absl::StrCat("the template ran past ", max_steps_, " steps"));
    }
  }

  // Every value an expression makes is bounded, so a string or list that
  // doubles in a loop fails here rather than exhausting memory.
  Value Eval(const Expr& e) {
    Step(e.line);
    Value v = EvalUnbounded(e);
    const Json& j = v.json;
    if ((j.is_string() && j.get_ref<const std::string&>().size() > kMaxRenderedBytes) ||
        ((j.is_array() || j.is_object()) && j.size() > kMaxItems)) {
      Fail(e.line, absl::StrCat("a value passed ", j.is_string() ? kMaxRenderedBytes : kMaxItems,
                                j.is_string() ? " bytes" : " items"));
    }
    return v;
  }

  Value EvalUnbounded(const Expr& e) {
    switch (e.kind) {
      case Expr::kLiteral:
        return Value{e.value};
      case Expr::kName:
      case Expr::kAttr:
      case Expr::kIndex: {
        if (const Ref r = Resolve(e); r.resolved)
          return r.json ? Value{*r.json} : Value::Undefined();
        const Value base = Eval(*e.args[0]);
        return GetItem(base, e.kind == Expr::kAttr ? Json(e.name) : Eval(*e.args[1]).json, e.line);
      }
      case Expr::kSlice:
        return Slice(e);
      case Expr::kCall:
        return Call(e);
      case Expr::kFilter:
        return Filter(e);
      case Expr::kTest: {
        // The global functions are defined (a template asks before it calls
        // strftime_now, as Llama 3.2's does), unless a variable hides them.
        const Expr& operand = *e.args[0];
        if ((e.name == "defined" || e.name == "undefined") && operand.kind == Expr::kName &&
            IsGlobalFunction(operand.name) && Lookup(operand.name) == nullptr) {
          return Value{(e.name == "defined") != e.negated};
        }
        const bool result = Test(e.name, Eval(operand),
                                 e.args.size() > 1 ? Eval(*e.args[1]) : Value::Undefined(), e.line);
        return Value{result != e.negated};
      }
      case Expr::kNot:
        return Value{!Truthy(Eval(*e.args[0]))};
      case Expr::kNeg: {
        const Value v = Eval(*e.args[0]);
        if (IsInt(v.json)) {
          const int64_t i = v.json.get<int64_t>();
          if (i == INT64_MIN) Fail(e.line, absl::StrCat("-(", i, ") does not fit in 64 bits"));
          return Value{-i};
        }
        if (v.json.is_number()) return Value{-v.json.get<double>()};
        Fail(e.line, "'-' of a value that is not a number");
      }
      case Expr::kAnd: {
        Value a = Eval(*e.args[0]);
        return Truthy(a) ? Eval(*e.args[1]) : a;
      }
      case Expr::kOr: {
        Value a = Eval(*e.args[0]);
        return Truthy(a) ? a : Eval(*e.args[1]);
      }
      case Expr::kTernary:
        if (Truthy(Eval(*e.args[1]))) return Eval(*e.args[0]);
        return e.args[2] ? Eval(*e.args[2]) : Value::Undefined();
      case Expr::kBinary:
        return BinaryOp(e.name, Eval(*e.args[0]), Eval(*e.args[1]), e.line);
      case Expr::kList: {
        Json list = Json::array();
        for (const auto& x : e.args) list.push_back(Eval(*x).json);
        return Value{std::move(list)};
      }
      case Expr::kDict: {
        Json dict = Json::object();
        for (size_t k = 0; k + 1 < e.args.size(); k += 2) {
          dict[ToString(Eval(*e.args[k]))] = Eval(*e.args[k + 1]).json;
        }
        return Value{std::move(dict)};
      }
    }
    Fail(e.line, "bad expression");
  }

  // A chain of names, attributes and items resolved in place, so that
  // `messages[i].content` copies the content, not `messages`.
  struct Ref {
    bool resolved = false;       // false: not such a chain (or a string index)
    const Json* json = nullptr;  // nullptr: undefined
  };
  Ref Resolve(const Expr& e) {
    if (e.kind == Expr::kName) {
      const Value* v = Lookup(e.name);
      return {true, v && !v->undefined ? &v->json : nullptr};
    }
    if (e.kind != Expr::kAttr && e.kind != Expr::kIndex) return {};
    const Ref base = Resolve(*e.args[0]);
    if (!base.resolved || (base.json && base.json->is_string())) return {};
    if (!base.json) {
      // Jinja2's Undefined raises on any attribute or item (UndefinedError).
      Fail(e.line, absl::StrCat(e.kind == Expr::kAttr ? Json(e.name).dump() : "an item",
                                " of an undefined value"));
    }
    const Json key = e.kind == Expr::kAttr ? Json(e.name) : Eval(*e.args[1]).json;
    if (e.kind == Expr::kIndex && base.json->is_array() && key.is_string()) return {};
    return {true, Item(*base.json, key, e.line)};
  }

  Value Slice(const Expr& e) {
    const Value v = Eval(*e.args[0]);
    auto bound = [&](int k) -> std::optional<int64_t> {
      if (!e.args[k]) return std::nullopt;
      const Value b = Eval(*e.args[k]);
      if (b.undefined || b.json.is_null()) return std::nullopt;
      if (!IsInt(b.json)) Fail(e.line, "a slice bound is not an integer");
      return b.json.get<int64_t>();
    };
    const std::optional<int64_t> start = bound(1), stop = bound(2), step_opt = bound(3);
    const int64_t step = step_opt.value_or(1);
    if (step == 0) Fail(e.line, "slice step is zero");
    const bool is_string = v.json.is_string();
    if (!is_string && !v.json.is_array())
      Fail(e.line, "cannot slice a value that is not a list or string");
    const std::vector<std::string> chars =
        is_string ? Chars(v.json.get<std::string>()) : std::vector<std::string>();
    const int64_t size = static_cast<int64_t>(is_string ? chars.size() : v.json.size());
    // Python's slice.indices().
    auto clamp = [&](std::optional<int64_t> x, int64_t dflt) {
      if (!x) return dflt;
      int64_t k = *x < 0 ? *x + size : *x;
      if (step > 0) return std::clamp<int64_t>(k, 0, size);
      return std::clamp<int64_t>(k, -1, size - 1);
    };
    const int64_t lo = clamp(start, step > 0 ? 0 : size - 1);
    const int64_t hi = clamp(stop, step > 0 ? size : -1);
    Json out = is_string ? Json("") : Json::array();
    std::string s;
    for (int64_t k = lo; step > 0 ? k < hi : k > hi; k += step) {
      if (is_string) {
        s += chars[static_cast<size_t>(k)];
      } else {
        out.push_back(v.json[static_cast<size_t>(k)]);
      }
    }
    return is_string ? Value{s} : Value{out};
  }

  std::vector<Value> Args(const Expr& e, size_t from) {
    std::vector<Value> args;
    for (size_t k = from; k < e.args.size(); ++k) args.push_back(Eval(*e.args[k]));
    return args;
  }

  Value Call(const Expr& e) {
    const Expr& callee = *e.args[0];
    std::vector<Value> args = Args(e, 1);
    if (callee.kind == Expr::kName) {
      if (callee.name == "strftime_now") {
        // transformers' (and vLLM's): datetime.now().strftime(format), local time.
        if (args.size() != 1 || !args[0].json.is_string()) {
          Fail(e.line, "strftime_now() takes one format string");
        }
        const std::time_t now = std::time(nullptr);
        std::tm local{};
        localtime_r(&now, &local);
        char buf[256];
        const size_t n =
            std::strftime(buf, sizeof(buf), args[0].json.get<std::string>().c_str(), &local);
        if (n == 0 && !args[0].json.get<std::string>().empty()) {
          Fail(e.line, "strftime_now(): the format gives no text or more than 255 bytes");
        }
        return Value{std::string(buf, n)};
      }
      if (callee.name == "raise_exception") {
        Fail(e.line, absl::StrCat("raise_exception: ", args.empty() ? "" : ToString(args[0])));
      }
      if (callee.name == "namespace") {
        if (!args.empty()) Unsupported(e.line, "namespace() with a positional argument");
        Json ns = Json::object();
        for (const auto& [k, x] : e.kwargs) ns[k] = Eval(*x).json;
        return Value{std::move(ns)};
      }
      if (callee.name == "range") {
        std::vector<int64_t> b;
        for (const Value& a : args) {
          if (!IsInt(a.json)) Fail(e.line, "range() of a value that is not an integer");
          b.push_back(a.json.get<int64_t>());
        }
        if (b.empty() || b.size() > 3) Fail(e.line, "range() takes 1 to 3 arguments");
        const int64_t start = b.size() > 1 ? b[0] : 0, stop = b.size() > 1 ? b[1] : b[0];
        const int64_t step = b.size() > 2 ? b[2] : 1;
        if (step == 0) Fail(e.line, "range() step is zero");
        // Jinja's sandbox (transformers renders in one) refuses ranges
        // larger than MAX_RANGE.
        const __int128 span = step > 0 ? __int128{stop} - start : __int128{start} - stop;
        const __int128 count = span <= 0 ? 0 : (span - 1) / (step > 0 ? step : -__int128{step}) + 1;
        if (count > kMaxRange) {
          Fail(e.line, absl::StrCat("range() of more than ", kMaxRange,
                                    " items (Jinja's sandbox refuses it)"));
        }
        Json out = Json::array();
        for (int64_t k = start; step > 0 ? k < stop : k > stop; k += step) out.push_back(k);
        return Value{std::move(out)};
      }
      Unsupported(e.line, absl::StrCat("the function '", callee.name, "'"));
    }
    if (callee.kind != Expr::kAttr) Fail(e.line, "call of something that is not a function");
    const Value self = Eval(*callee.args[0]);
    const std::string& m = callee.name;
    // Python's methods take no keyword arguments here; more positional
    // ones than a method reads are refused, never dropped.
    auto arity = [&](size_t min, size_t max) {
      if (!e.kwargs.empty()) {
        Unsupported(e.line, absl::StrCat("the method '", m, "' with ", e.kwargs[0].first, "="));
      }
      if (args.size() < min || args.size() > max) {
        Unsupported(e.line, absl::StrCat("the method '", m, "' with ", args.size(), " arguments"));
      }
    };
    auto str_arg = [&](size_t k) -> std::optional<std::string> {
      if (k >= args.size() || args[k].json.is_null()) return std::nullopt;
      return ToString(args[k]);
    };
    auto int_arg = [&](size_t k, int64_t otherwise) -> int64_t {
      if (k >= args.size() || args[k].json.is_null()) return otherwise;
      if (!IsInt(args[k].json))
        Fail(e.line, absl::StrCat(m, "() of a count that is not an integer"));
      return args[k].json.get<int64_t>();
    };
    if (self.json.is_string()) {
      const std::string& s = self.json.get_ref<const std::string&>();
      if (m == "strip" || m == "lstrip" || m == "rstrip") {
        arity(0, 1);
        return Value{Strip(s, m != "rstrip", m != "lstrip", str_arg(0))};
      }
      if (m == "upper" || m == "lower" || m == "title") {
        arity(0, 0);
        return Value{m == "upper"   ? absl::AsciiStrToUpper(s)
                     : m == "lower" ? absl::AsciiStrToLower(s)
                                    : Title(s)};
      }
      if (m == "startswith" || m == "endswith") {
        arity(1, 1);
        // A tuple (a list here) of prefixes: any of them.
        std::vector<std::string> affixes;
        if (args[0].json.is_array()) {
          for (const Json& x : args[0].json) affixes.push_back(ToString(Value{x}));
        } else {
          affixes.push_back(ToString(args[0]));
        }
        return Value{std::any_of(affixes.begin(), affixes.end(), [&](const std::string& a) {
          return m == "startswith" ? s.starts_with(a) : s.ends_with(a);
        })};
      }
      if (m == "replace") {
        arity(2, 3);
        const std::string from = ToString(args[0]), to = ToString(args[1]);
        int64_t count = int_arg(2, -1);
        // Python inserts `to` between every character for ''.
        if (from.empty()) Unsupported(e.line, "the method 'replace' of ''");
        if (count < 0) return Value{absl::StrReplaceAll(s, {{from, to}})};
        std::string out;
        size_t at = 0;
        for (size_t found; count > 0 && (found = s.find(from, at)) != std::string::npos; --count) {
          out.append(s, at, found - at).append(to);
          at = found + from.size();
        }
        return Value{out.append(s, at, std::string::npos)};
      }
      if (m == "split") {
        arity(0, 2);
        const int64_t maxsplit = int_arg(1, -1);
        Json out = Json::array();
        if (const std::optional<std::string> sep = str_arg(0)) {
          if (sep->empty()) Fail(e.line, "split() of an empty separator");
          size_t at = 0;
          for (int64_t n = 0; maxsplit < 0 || n < maxsplit; ++n) {
            const size_t found = s.find(*sep, at);
            if (found == std::string::npos) break;
            out.push_back(s.substr(at, found - at));
            at = found + sep->size();
          }
          out.push_back(s.substr(at));
        } else {
          for (std::string& part : SplitWhitespace(s, maxsplit)) out.push_back(std::move(part));
        }
        return Value{std::move(out)};
      }
    }
    if (self.json.is_object()) {
      if (m == "items" || m == "keys" || m == "values") {
        arity(0, 0);
        Json out = Json::array();
        for (const auto& [k, x] : self.json.items()) {
          out.push_back(m == "items" ? Json::array({k, x}) : m == "keys" ? Json(k) : x);
        }
        return Value{std::move(out)};
      }
      if (m == "get") {
        arity(1, 2);
        Value v = GetItem(self, args[0].json, e.line);
        return v.undefined ? (args.size() > 1 ? args[1] : Value{nullptr}) : v;
      }
    }
    Unsupported(e.line, absl::StrCat("the method '", m, "'"));
  }

  Value Filter(const Expr& e) {
    const Value v = Eval(*e.args[0]);
    std::vector<Value> args = Args(e, 1);
    const std::string& f = e.name;
    auto kwarg = [&](const std::string& name) -> std::optional<Value> {
      for (const auto& [k, x] : e.kwargs) {
        if (k == name) return Eval(*x);
      }
      return std::nullopt;
    };
    // Jinja2's signatures: more positional arguments than a filter takes,
    // or a keyword it does not read, are refused, never dropped.
    auto arity = [&](size_t max, std::initializer_list<std::string_view> keywords) {
      if (args.size() > max) {
        Unsupported(e.line, absl::StrCat("the filter '", f, "' with ", args.size(), " arguments"));
      }
      for (const auto& [k, x] : e.kwargs) {
        if (std::find(keywords.begin(), keywords.end(), k) == keywords.end()) {
          Unsupported(e.line, absl::StrCat("the filter '", f, "' with ", k, "="));
        }
      }
    };
    if (f == "default" || f == "d") {
      arity(2, {"default_value", "boolean"});
      const std::optional<Value> fallback =
          args.empty() ? kwarg("default_value") : std::optional<Value>(args[0]);
      const std::optional<Value> boolean =
          args.size() > 1 ? std::optional<Value>(args[1]) : kwarg("boolean");
      if (v.undefined || (boolean && Truthy(*boolean) && !Truthy(v))) {
        return fallback.value_or(Value{""});
      }
      return v;
    }
    if (f == "length" || f == "count" || f == "string" || f == "lower" || f == "upper" ||
        f == "title" || f == "capitalize" || f == "items" || f == "list" || f == "first" ||
        f == "last" || f == "reverse" || f == "int") {
      arity(0, {});
    }
    if (f == "length" || f == "count") {
      if (v.json.is_string())
        return Value{static_cast<int64_t>(Chars(v.json.get<std::string>()).size())};
      if (v.json.is_array() || v.json.is_object())
        return Value{static_cast<int64_t>(v.json.size())};
      Fail(e.line, "length of a value that is neither a string nor a collection");
    }
    if (f == "string") return Value{ToString(v)};
    if (f == "tojson") {
      for (const auto& [k, x] : e.kwargs) {
        if (k != "indent" && k != "sort_keys")
          Unsupported(e.line, absl::StrCat("tojson(", k, "=)"));
      }
      const std::optional<Value> indent = args.empty() ? kwarg("indent") : args[0];
      if (indent && !indent->undefined && !indent->json.is_null() && !IsInt(indent->json)) {
        Fail(e.line, "tojson indent is not an integer");
      }
      const std::optional<Value> sort_keys = kwarg("sort_keys");
      return Value{ToJson(v.json, indent && IsInt(indent->json) ? indent->json.get<int>() : -1,
                          sort_keys && Truthy(*sort_keys))};
    }
    if (f == "trim") {
      arity(1, {"chars"});
      const std::optional<Value> chars = args.empty() ? kwarg("chars") : args[0];
      return Value{
          Strip(ToString(v), true, true,
                chars && !chars->json.is_null() ? std::optional(ToString(*chars)) : std::nullopt)};
    }
    if (f == "lower") return Value{absl::AsciiStrToLower(ToString(v))};
    if (f == "upper") return Value{absl::AsciiStrToUpper(ToString(v))};
    if (f == "title") return Value{Title(ToString(v))};
    if (f == "capitalize") {
      std::string s = absl::AsciiStrToLower(ToString(v));
      if (!s.empty()) s[0] = absl::ascii_toupper(s[0]);
      return Value{s};
    }
    if (f == "replace") {
      arity(2, {});
      if (args.size() != 2) Unsupported(e.line, "the filter 'replace' without old and new");
      return Value{absl::StrReplaceAll(ToString(v), {{ToString(args[0]), ToString(args[1])}})};
    }
    if (f == "int") {
      if (IsInt(v.json)) return v;
      if (v.json.is_number()) return Value{static_cast<int64_t>(v.json.get<double>())};
      int64_t x = 0;
      return Value{absl::SimpleAtoi(ToString(v), &x) ? x : 0};
    }
    if (f == "items") {
      if (!v.json.is_object()) Fail(e.line, "items of a value that is not a mapping");
      Json out = Json::array();
      for (const auto& [k, x] : v.json.items()) out.push_back(Json::array({k, x}));
      return Value{std::move(out)};
    }
    std::vector<Json> items = Items(v, e.line);
    if (f == "list") return Value{Json(items)};
    if (f == "first") return items.empty() ? Value::Undefined() : Value{items.front()};
    if (f == "last") return items.empty() ? Value::Undefined() : Value{items.back()};
    if (f == "reverse") {
      if (v.json.is_string()) {
        std::vector<std::string> chars = Chars(v.json.get<std::string>());
        std::reverse(chars.begin(), chars.end());
        return Value{absl::StrJoin(chars, "")};
      }
      std::reverse(items.begin(), items.end());
      return Value{Json(items)};
    }
    if (f == "join") {
      arity(1, {"d", "attribute"});
      const std::optional<Value> d = args.empty() ? kwarg("d") : args[0];
      const std::optional<Value> attribute = kwarg("attribute");
      std::vector<std::string> parts;
      for (const Json& x : items) {
        parts.push_back(
            ToString(attribute ? GetItem(Value{x}, attribute->json, e.line) : Value{x}));
      }
      return Value{absl::StrJoin(parts, d ? ToString(*d) : "")};
    }
    if (f == "selectattr" || f == "rejectattr") {
      if (args.empty()) Fail(e.line, absl::StrCat(f, " needs an attribute"));
      const Json attr = args[0].json;
      Json out = Json::array();
      for (const Json& x : items) {
        const Value a = GetItem(Value{x}, attr, e.line);
        const bool pass =
            args.size() > 1
                ? Test(ToString(args[1]), a, args.size() > 2 ? args[2] : Value::Undefined(), e.line)
                : Truthy(a);
        if (pass == (f == "selectattr")) out.push_back(x);
      }
      return Value{std::move(out)};
    }
    if (f == "map") {
      const std::optional<Value> attr = kwarg("attribute");
      if (!attr) Unsupported(e.line, "map() without attribute=");
      Json out = Json::array();
      for (const Json& x : items) {
        Value a = GetItem(Value{x}, attr->json, e.line);
        if (a.undefined) a = kwarg("default").value_or(Value{nullptr});
        out.push_back(a.json);
      }
      return Value{std::move(out)};
    }
    Unsupported(e.line, absl::StrCat("the filter '", f, "' here"));
  }

  bool Test(const std::string& t, const Value& v, const Value& arg, int line) {
    const Json& j = v.json;
    if (t == "defined") return !v.undefined;
    if (t == "undefined") return v.undefined;
    if (v.undefined) return false;
    if (t == "none") return j.is_null();
    if (t == "string") return j.is_string();
    if (t == "number") return j.is_number();
    if (t == "integer") return IsInt(j);
    if (t == "boolean") return j.is_boolean();
    if (t == "true") return j.is_boolean() && j.get<bool>();
    if (t == "false") return j.is_boolean() && !j.get<bool>();
    if (t == "mapping") return j.is_object();
    if (t == "sequence" || t == "iterable") return j.is_array() || j.is_string() || j.is_object();
    if (t == "equalto" || t == "eq" || t == "==") return !arg.undefined && j == arg.json;
    if (t == "ne" || t == "!=") return arg.undefined || j != arg.json;
    if (t == "odd" || t == "even") {
      if (!IsInt(j)) Fail(line, absl::StrCat("'", t, "' of a value that is not an integer"));
      return (j.get<int64_t>() % 2 != 0) == (t == "odd");
    }
    if (t == "in") return Contains(arg, v, line);
    Unsupported(line, absl::StrCat("the test '", t, "'"));
  }

  // What one render's values may take (ChatTemplateInputs::max_steps says
  // why).
  static constexpr size_t kMaxRenderedBytes = 64 << 20;
  static constexpr size_t kMaxItems = 1 << 20;
  static constexpr int64_t kMaxRange = 100000;  // jinja2.sandbox.MAX_RANGE

  std::vector<std::map<std::string, Value>> scopes_;
  int64_t steps_ = 0;
  int64_t max_steps_;
};

}  // namespace

std::string RenderTemplate(const NodeList& nodes, const ChatTemplateInputs& inputs) {
  std::string out;
  Renderer(inputs).Render(nodes, out);
  return out;
}

}  // namespace tandem::tokenizer::internal::jinja
