#include "tandem/grammar/json_matcher.h"

#include <algorithm>
#include <string>
#include <utility>

namespace tandem::grammar {

using Kind = SchemaNode::Kind;

namespace {

// kSeq: a grammar's sequence, `count` the element to come next; kRep: its
// repetition, `count` the items read. Both keep their depth (the grammar
// frames under them, themselves included) in `sub`.
enum FrameKind : uint8_t {
  kRoot,
  kObject,
  kArray,
  kString,
  kNumber,
  kLiteral,
  kKey,
  kRegex,
  kSeq,
  kRep
};

// Phases. Root: before its value, after it.
enum : uint8_t { kRootStart, kRootDone };
// Object and array: after the opening bracket, a key, a colon, a value, a
// comma; and, without any whitespace (Schema::any_whitespace), after a colon
// or a comma that the space of ": " or ", " must follow.
enum : uint8_t {
  kOpen,
  kAfterKey,
  kAfterColon,
  kAfterValue,
  kAfterComma,
  kColonSpace,
  kCommaSpace
};
// Number (RFC 8259): after '-', a leading 0, integer digits, '.', fraction
// digits, 'e', the exponent's sign, exponent digits.
enum : uint8_t { kMinus, kZero, kInt, kDot, kFrac, kExp, kExpSign, kExpDigits };

// String sub-states: normal; after a backslash; kHex + n: n hex digits of a
// \u escape to come; kUtf8 + 8 * n + r: n continuation bytes to come, the
// next one in range r of kContinuation.
constexpr int32_t kNormal = 0, kEscape = 1, kHex = 10, kUtf8 = 20;
constexpr std::pair<uint8_t, uint8_t> kContinuation[] = {
    {0x80, 0xBF}, {0xA0, 0xBF}, {0x80, 0x9F}, {0x90, 0xBF}, {0x80, 0x8F}};

// Literals of booleans and null (a kLiteral frame with node -1).
constexpr std::string_view kBuiltin[] = {"true", "false", "null"};

// xgrammar's whitespace, [ \n\t] (no CR, which RFC 8259 has).
bool IsWs(uint8_t c) { return c == ' ' || c == '\t' || c == '\n'; }
bool IsDigit(uint8_t c) { return c >= '0' && c <= '9'; }
bool IsHex(uint8_t c) { return IsDigit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'); }
bool NumberAccepts(uint8_t phase) {
  return phase == kZero || phase == kInt || phase == kFrac || phase == kExpDigits;
}

class Stepper {
 public:
  Stepper(const Schema& schema, FrameArena& arena, std::vector<int32_t>* out)
      : schema_(schema), arena_(arena), out_(out) {}

  void Step(int32_t top, uint8_t c) {
    const Frame f = arena_[top];
    switch (f.kind) {
      case kRoot:
        if (f.phase == kRootStart) StartValue(schema_.root(), c, With(f, kRootDone), 0);
        return;
      case kObject:
        return StepObject(top, f, c);
      case kArray:
        return StepArray(top, f, c);
      case kString:
        return StepString(f, c);
      case kNumber:
        return StepNumber(f, c);
      case kLiteral:
        if (f.node >= 0) {
          return StepLiterals(f.node, static_cast<int32_t>(f.count >> 32),
                              static_cast<int32_t>(f.count & 0xFFFFFFFF), f.sub, c, f.parent);
        }
        [[fallthrough]];  // true, false, null
      case kKey:
        return StepLiteral(f, c);
      case kRegex:
        return StepRegex(f.node, f.sub, c, f.parent);
      case kSeq:
        return StartElement(f.node, static_cast<size_t>(f.count), c, f.parent, 0);
      case kRep:
        return StepRepeat(f, c);
      default:
        return;
    }
  }

 private:
  const SchemaNode& node(int32_t i) const { return schema_.node(i); }
  int32_t Push(const Frame& f) { return arena_.Push(f); }
  void Emit(int32_t top) { out_->push_back(top); }
  // `f` in another phase, pushed.
  int32_t With(Frame f, uint8_t phase, int64_t count) {
    f.phase = phase;
    f.count = count;
    return Push(f);
  }
  int32_t With(Frame f, uint8_t phase) { return With(f, phase, f.count); }

  // The stacks a value of `n` starting with `c` gives, on top of `parent`
  // (which is already past the value).
  void StartValue(int32_t n, uint8_t c, int32_t parent, int depth) {
    const SchemaNode& s = node(n);
    switch (s.kind) {
      case Kind::kUnion:
        if (depth >= kMaxGrammarNesting) return;
        for (int32_t alt : s.alternatives) StartValue(alt, c, parent, depth + 1);
        return;
      case Kind::kSequence:
        if (depth >= kMaxGrammarNesting) return;
        return StartElement(n, 0, c, parent, depth + 1);
      case Kind::kRepeat:
        if (depth >= kMaxGrammarNesting) return;
        if (s.max_items == 1) {
          StartValue(s.items, c, parent, depth + 1);  // nothing to count
        } else if (s.max_items != 0) {
          const int32_t counter =
              PushGrammar({.kind = kRep, .node = n, .parent = parent, .count = 1});
          if (counter >= 0) StartValue(s.items, c, counter, depth + 1);
        }
        if (s.min_items == 0) Step(parent, c);
        return;
      case Kind::kObject:
        if (c == '{') Emit(Push({.kind = kObject, .phase = kOpen, .node = n, .parent = parent}));
        return;
      case Kind::kArray:
        if (c == '[') Emit(Push({.kind = kArray, .phase = kOpen, .node = n, .parent = parent}));
        return;
      case Kind::kString:
        if (c == '"') Emit(Push({.kind = kString, .node = n, .parent = parent}));
        return;
      case Kind::kNumber:
      case Kind::kInteger:
        if (c == '-' || IsDigit(c)) {
          const uint8_t phase = c == '-' ? kMinus : c == '0' ? kZero : kInt;
          Emit(Push({.kind = kNumber, .phase = phase, .node = n, .parent = parent}));
        }
        return;
      case Kind::kBoolean:
        if (c == 't' || c == 'f') {
          Emit(Push({.kind = kLiteral, .sub = 1, .parent = parent, .count = c == 't' ? 0 : 1}));
        }
        return;
      case Kind::kNull:
        if (c == 'n') Emit(Push({.kind = kLiteral, .sub = 1, .parent = parent, .count = 2}));
        return;
      case Kind::kLiteral:
        return StepLiterals(n, 0, static_cast<int32_t>(s.literals.size()), 0, c, parent);
      case Kind::kRegex:
        return StepRegex(n, s.regex->start(), c, parent);
    }
  }

  // Element `i` of sequence `n` starting with `c`. The last one goes on
  // straight to `parent`, so that a rule that ends by naming itself (a
  // list's tail) reads on without growing the stack.
  void StartElement(int32_t n, size_t i, uint8_t c, int32_t parent, int depth) {
    const std::vector<int32_t>& elements = node(n).elements;
    if (i >= elements.size()) return Step(parent, c);
    if (i + 1 == elements.size()) return StartValue(elements[i], c, parent, depth);
    const int32_t next = PushGrammar(
        {.kind = kSeq, .node = n, .parent = parent, .count = static_cast<int64_t>(i) + 1});
    if (next >= 0) StartValue(elements[i], c, next, depth);
  }

  // Item `f.count` of a repetition read: another, or what follows.
  void StepRepeat(const Frame& f, uint8_t c) {
    const SchemaNode& s = node(f.node);
    if (s.max_items < 0 || f.count < s.max_items)
      StartValue(s.items, c, With(f, 0, f.count + 1), 0);
    if (f.count >= s.min_items) Step(f.parent, c);
  }

  // A grammar frame pushed with its depth, or -1 (and too_deep) past
  // kMaxGrammarDepth.
  int32_t PushGrammar(Frame f) {
    const Frame& parent = arena_[f.parent];
    f.sub = (parent.kind == kSeq || parent.kind == kRep ? parent.sub : 0) + 1;
    if (f.sub > kMaxGrammarDepth) {
      too_deep_ = true;
      return -1;
    }
    return Push(f);
  }

 public:
  bool too_deep() const { return too_deep_; }

 private:
  // The regex of node `n` in automaton state `state`, then `c`: a frame in
  // the next state, and, where the text so far is a whole match, `c` as what
  // follows the value.
  void StepRegex(int32_t n, int32_t state, uint8_t c, int32_t parent) {
    const RegexDfa& re = *node(n).regex;
    if (const int32_t next = re.Next(state, c); next != RegexDfa::kDead) {
      Emit(Push({.kind = kRegex, .node = n, .sub = next, .parent = parent}));
    }
    if (re.Accepting(state)) Step(parent, c);
  }

  std::string_view LiteralText(const Frame& f) const {
    if (f.kind == kKey) return node(f.node).properties[static_cast<size_t>(f.count)].key;
    return kBuiltin[f.count];
  }

  // A node's literals [lo, hi) that share their first `offset` bytes, each
  // longer (the node's literals are sorted and distinct, so those that go on
  // with byte `c` are a range too): one frame for all of them, however many
  // (an enum of thousands of strings, which all begin with '"', is one
  // reading), and the parent where one of them ends with `c`.
  void StepLiterals(int32_t n, int32_t lo, int32_t hi, int32_t offset, uint8_t c, int32_t parent) {
    const std::vector<std::string>& lits = node(n).literals;
    const auto byte = [&](int32_t i) {
      return static_cast<uint8_t>(lits[static_cast<size_t>(i)][static_cast<size_t>(offset)]);
    };
    // The first i in [a, b) where pred(i) is false (pred holds on a prefix).
    const auto partition = [](int32_t a, int32_t b, const auto& pred) {
      while (a < b) {
        const int32_t mid = a + (b - a) / 2;
        if (pred(mid)) {
          a = mid + 1;
        } else {
          b = mid;
        }
      }
      return a;
    };
    int32_t first = partition(lo, hi, [&](int32_t i) { return byte(i) < c; });
    const int32_t last = partition(first, hi, [&](int32_t i) { return byte(i) <= c; });
    if (first == last) return;
    // The one that ends here sorts first among those it begins.
    if (lits[static_cast<size_t>(first)].size() == static_cast<size_t>(offset) + 1) {
      Emit(parent);
      ++first;
    }
    if (first == last) return;
    Emit(Push({.kind = kLiteral,
               .node = n,
               .sub = offset + 1,
               .parent = parent,
               .count = static_cast<int64_t>(first) << 32 | static_cast<uint32_t>(last)}));
  }

  void StepLiteral(const Frame& f, uint8_t c) {
    const std::string_view text = LiteralText(f);
    if (static_cast<uint8_t>(text[static_cast<size_t>(f.sub)]) != c) return;
    if (static_cast<size_t>(f.sub) + 1 == text.size()) return Emit(f.parent);
    Frame next = f;
    ++next.sub;
    Emit(Push(next));
  }

  // After '{' or ',': the keys that may come next, each its own stack.
  void StartKey(const Frame& f) {
    const SchemaNode& o = node(f.node);
    const int64_t n = std::ssize(o.properties);
    const int64_t required = o.first_required[static_cast<size_t>(f.count)];
    for (int64_t k = f.count; k < n && k <= required; ++k) {
      const int32_t parent = With(f, kAfterKey, k);
      Emit(Push({.kind = kKey, .node = f.node, .sub = 1, .parent = parent, .count = k}));
    }
    if (o.additional >= 0 && required == n) {
      const int32_t parent = With(f, kAfterKey, n);
      Emit(Push({.kind = kString, .node = -1, .parent = parent}));
    }
  }

  // Whitespace that may come anywhere between an object's or an array's
  // tokens.
  bool FreeWs(uint8_t c) const { return schema_.any_whitespace() && IsWs(c); }
  // The phase after a ',' or a ':': straight on with free whitespace, else
  // the space of ", " or ": " first.
  uint8_t AfterComma() const { return schema_.any_whitespace() ? kAfterComma : kCommaSpace; }
  uint8_t AfterColon() const { return schema_.any_whitespace() ? kAfterColon : kColonSpace; }

  void StepObject(int32_t top, const Frame& f, uint8_t c) {
    const SchemaNode& o = node(f.node);
    const int64_t n = std::ssize(o.properties);
    const bool may_close = o.first_required[static_cast<size_t>(f.count)] == n;
    switch (f.phase) {
      case kOpen:
      case kAfterComma:
        if (FreeWs(c)) return Emit(top);
        if (c == '"') return StartKey(f);
        if (c == '}' && f.phase == kOpen && may_close) return Emit(f.parent);
        return;
      case kAfterKey:
        if (FreeWs(c)) return Emit(top);
        if (c == ':') Emit(With(f, AfterColon()));
        return;
      case kColonSpace:
        if (c == ' ') Emit(With(f, kAfterColon));
        return;
      case kCommaSpace:
        if (c == ' ') Emit(With(f, kAfterComma));
        return;
      case kAfterColon: {
        if (FreeWs(c)) return Emit(top);
        const bool declared = f.count < n;
        const int32_t value =
            declared ? o.properties[static_cast<size_t>(f.count)].node : o.additional;
        return StartValue(value, c, With(f, kAfterValue, declared ? f.count + 1 : n), 0);
      }
      case kAfterValue:
        if (FreeWs(c)) return Emit(top);
        if (c == ',' && (f.count < n || o.additional >= 0)) return Emit(With(f, AfterComma()));
        if (c == '}' && may_close) Emit(f.parent);
        return;
      default:
        return;
    }
  }

  void StepArray(int32_t top, const Frame& f, uint8_t c) {
    const SchemaNode& a = node(f.node);
    if (f.phase == kCommaSpace) {
      if (c == ' ') Emit(With(f, kAfterComma));
      return;
    }
    if (FreeWs(c)) return Emit(top);
    switch (f.phase) {
      case kOpen:
        if (c == ']') {
          if (a.min_items == 0) Emit(f.parent);
          return;
        }
        if (a.max_items != 0) StartValue(a.items, c, With(f, kAfterValue, 1), 0);
        return;
      case kAfterValue:
        if (c == ',' && (a.max_items < 0 || f.count < a.max_items))
          return Emit(With(f, AfterComma()));
        if (c == ']' && f.count >= a.min_items) Emit(f.parent);
        return;
      case kAfterComma:
        return StartValue(a.items, c, With(f, kAfterValue, f.count + 1), 0);
      default:
        return;
    }
  }

  void StepString(const Frame& f, uint8_t c) {
    Frame next = f;
    if (f.sub == kNormal) {
      const bool bounded = f.node >= 0;
      if (c == '"') {
        if (!bounded || f.count >= node(f.node).min_length) Emit(f.parent);
        return;
      }
      if (c < 0x20) return;  // control characters are escaped in JSON
      if (bounded && node(f.node).max_length >= 0 && f.count >= node(f.node).max_length) return;
      ++next.count;
      if (c == '\\') {
        next.sub = kEscape;
      } else if (c < 0x80) {
        next.sub = kNormal;
      } else if (c >= 0xC2 && c <= 0xDF) {
        next.sub = kUtf8 + 8 * 1;
      } else if (c >= 0xE0 && c <= 0xEF) {
        next.sub = kUtf8 + 8 * 2 + (c == 0xE0 ? 1 : c == 0xED ? 2 : 0);
      } else if (c >= 0xF0 && c <= 0xF4) {
        next.sub = kUtf8 + 8 * 3 + (c == 0xF0 ? 3 : c == 0xF4 ? 4 : 0);
      } else {
        return;
      }
    } else if (f.sub == kEscape) {
      if (c == 'u') {
        next.sub = kHex + 4;
      } else if (c == '"' || c == '\\' || c == '/' || c == 'b' || c == 'f' || c == 'n' ||
                 c == 'r' || c == 't') {
        next.sub = kNormal;
      } else {
        return;
      }
    } else if (f.sub < kUtf8) {
      if (!IsHex(c)) return;
      next.sub = f.sub - 1 == kHex ? kNormal : f.sub - 1;
    } else {
      const int32_t remaining = (f.sub - kUtf8) / 8;
      const auto [lo, hi] = kContinuation[(f.sub - kUtf8) % 8];
      if (c < lo || c > hi) return;
      next.sub = remaining == 1 ? kNormal : kUtf8 + 8 * (remaining - 1);
    }
    Emit(Push(next));
  }

  void StepNumber(const Frame& f, uint8_t c) {
    const bool integer = node(f.node).kind == Kind::kInteger;
    uint8_t phase = 0;
    bool more = true;
    switch (f.phase) {
      case kMinus:
        phase = c == '0' ? kZero : kInt;
        more = IsDigit(c) && !(integer && c == '0');  // xgrammar's integers have no "-0"
        break;
      case kZero:
      case kInt:
        if (IsDigit(c) && f.phase == kInt) {
          phase = kInt;
        } else if (c == '.' && !integer) {
          phase = kDot;
        } else if ((c == 'e' || c == 'E') && !integer) {
          phase = kExp;
        } else {
          more = false;
        }
        break;
      case kDot:
      case kFrac:
        if (IsDigit(c)) {
          phase = kFrac;
        } else if ((c == 'e' || c == 'E') && f.phase == kFrac) {
          phase = kExp;
        } else {
          more = false;
        }
        break;
      case kExp:
        if (c == '+' || c == '-') {
          phase = kExpSign;
        } else {
          phase = kExpDigits;
          more = IsDigit(c);
        }
        break;
      default:  // kExpSign, kExpDigits
        phase = kExpDigits;
        more = IsDigit(c);
        break;
    }
    if (more) return Emit(With(f, phase));
    // The number ends before `c`, which goes to what holds it.
    if (NumberAccepts(f.phase)) Step(f.parent, c);
  }

  const Schema& schema_;
  FrameArena& arena_;
  std::vector<int32_t>* out_;
  bool too_deep_ = false;
};

bool SameFrame(const Frame& a, const Frame& b) {
  return a.kind == b.kind && a.phase == b.phase && a.node == b.node && a.sub == b.sub &&
         a.parent == b.parent && a.count == b.count;
}

}  // namespace

bool StepBytes(const Schema& schema, FrameArena& arena, std::span<const int32_t> tops, uint8_t byte,
               std::vector<int32_t>* out) {
  const size_t first = out->size();
  Stepper stepper(schema, arena, out);
  for (int32_t top : tops) stepper.Step(top, byte);
  if (stepper.too_deep()) return false;
  if (out->size() - first <= 1) return true;
  // Two ways that reached the same frame over the same stack are one.
  size_t kept = first;
  for (size_t i = first; i < out->size(); ++i) {
    const int32_t t = (*out)[i];
    bool seen = false;
    for (size_t j = first; j < kept && !seen; ++j) {
      seen = (*out)[j] == t || SameFrame(arena[(*out)[j]], arena[t]);
    }
    if (!seen) (*out)[kept++] = t;
  }
  out->resize(kept);
  return kept - first <= kMaxAlternatives;
}

bool StackComplete(const Schema& schema, const FrameArena& arena, int32_t top) {
  const Frame& f = arena[top];
  if (f.kind == kRoot) {
    // A pattern or a grammar that matches the empty text is a document
    // before any byte.
    return f.phase == kRootDone || NodeNullable(schema.node(schema.root()));
  }
  if (f.kind == kSeq) {
    return f.count >= schema.node(f.node).nullable_from && StackComplete(schema, arena, f.parent);
  }
  if (f.kind == kRep) {
    return f.count >= schema.node(f.node).min_items && StackComplete(schema, arena, f.parent);
  }
  if (f.kind == kNumber && NumberAccepts(f.phase)) return StackComplete(schema, arena, f.parent);
  if (f.kind == kRegex && schema.node(f.node).regex->Accepting(f.sub)) {
    return StackComplete(schema, arena, f.parent);
  }
  return false;
}

bool StackOpen(const Schema& schema, const FrameArena& arena, int32_t top) {
  const Frame& f = arena[top];
  if (f.kind == kRoot) return f.phase == kRootStart && NodeOpens(schema.node(schema.root()));
  if (f.kind == kSeq) {
    const std::vector<int32_t>& elements = schema.node(f.node).elements;
    for (size_t i = static_cast<size_t>(f.count); i < elements.size(); ++i) {
      if (NodeOpens(schema.node(elements[i]))) return true;
      if (!NodeNullable(schema.node(elements[i]))) return false;
    }
    return StackOpen(schema, arena, f.parent);
  }
  if (f.kind == kRep) {
    const SchemaNode& s = schema.node(f.node);
    if ((s.max_items < 0 || f.count < s.max_items) && NodeOpens(schema.node(s.items))) return true;
    return f.count >= s.min_items && StackOpen(schema, arena, f.parent);
  }
  if (f.kind == kRegex) {
    const RegexDfa& re = *schema.node(f.node).regex;
    return re.Open(f.sub) || (re.Accepting(f.sub) && StackOpen(schema, arena, f.parent));
  }
  return true;
}

JsonMatcher::JsonMatcher(std::shared_ptr<const Schema> schema) : schema_(std::move(schema)) {
  tops_.push_back(arena_.Push({.kind = kRoot, .phase = kRootStart}));
}

bool JsonMatcher::Accept(std::string_view bytes) {
  const size_t mark = arena_.size();
  std::vector<int32_t> from = tops_;
  for (char ch : bytes) {
    next_.clear();
    const bool bounded = StepBytes(*schema_, arena_, from, static_cast<uint8_t>(ch), &next_);
    if (!bounded || next_.empty()) {
      overflowed_ = !bounded;
      arena_.Truncate(mark);
      return false;
    }
    from.swap(next_);
  }
  tops_ = std::move(from);
  Compact();
  return true;
}

bool JsonMatcher::Complete() const {
  return std::any_of(tops_.begin(), tops_.end(),
                     [&](int32_t t) { return StackComplete(*schema_, arena_, t); });
}

bool JsonMatcher::Open() const {
  return std::any_of(tops_.begin(), tops_.end(),
                     [&](int32_t t) { return StackOpen(*schema_, arena_, t); });
}

void JsonMatcher::AppendStateKey(std::string* key) const {
  const auto append = [key](const auto& v) {
    key->append(reinterpret_cast<const char*>(&v), sizeof(v));
  };
  for (int32_t top : tops_) {
    for (int32_t i = top; i >= 0; i = arena_[i].parent) {
      const Frame& f = arena_[i];
      int64_t count = f.count;
      if (f.kind == kString) {
        // Only a bounded string reads its count (StepString).
        const SchemaNode* n = f.node >= 0 ? &schema_->node(f.node) : nullptr;
        if (n == nullptr) {
          count = 0;
        } else if (n->max_length < 0) {
          count = std::min(count, n->min_length);
        }
      } else if (f.kind == kArray || f.kind == kRep) {
        const SchemaNode& n = schema_->node(f.node);
        if (n.max_items < 0) count = std::min(count, n.min_items);
      }
      append(f.kind);
      append(f.phase);
      append(f.node);
      append(f.sub);
      append(count);
    }
    key->push_back(static_cast<char>(0xFF));  // no frame kind: the stack's end
  }
}

void JsonMatcher::Compact() {
  FrameArena fresh;
  // Each stack copied bottom up; frames shared by several stacks are copied
  // once (old index -> new index).
  std::vector<int32_t> moved(arena_.size(), -1);
  std::vector<int32_t> chain;
  for (int32_t& top : tops_) {
    chain.clear();
    for (int32_t i = top; i >= 0 && moved[static_cast<size_t>(i)] < 0; i = arena_[i].parent) {
      chain.push_back(i);
    }
    for (auto it = chain.rbegin(); it != chain.rend(); ++it) {
      Frame f = arena_[*it];
      if (f.parent >= 0) f.parent = moved[static_cast<size_t>(f.parent)];
      moved[static_cast<size_t>(*it)] = fresh.Push(f);
    }
    top = moved[static_cast<size_t>(top)];
  }
  arena_ = std::move(fresh);
}

}  // namespace tandem::grammar
