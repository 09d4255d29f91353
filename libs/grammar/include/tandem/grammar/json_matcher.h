// Whether bytes can begin a document of a compiled JSON schema
// (json_schema.h): a pushdown automaton over bytes, one stack per way the
// bytes so far can be read (anyOf, optional properties and enum values
// sharing a prefix give several).
//
// Stacks are linked frames in a FrameArena, never changed once pushed: a
// step pushes the frames it changes on top of the ones it keeps, so the
// token mask (token_mask.h) can try every token from one state and drop
// what each tried by truncating the arena.
//
// Written here, not taken from xgrammar (vLLM's backend, C++ with Python
// bindings, not packaged for Debian): what the worker needs is a byte
// automaton over the schema subset json_schema.h lists.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "tandem/grammar/json_schema.h"

namespace tandem::grammar {

struct Frame {
  uint8_t kind = 0;   // FrameKind (json_matcher.cc)
  uint8_t phase = 0;  // where in its value the frame is
  int32_t node = -1;  // the schema node it matches (-1: a free key string)
  int32_t sub = 0;    // a string's escape or UTF-8 state; a literal's offset; a regex's state
  int32_t parent = -1;
  // Members, items or characters; which builtin literal or key; a node's
  // literals' range (first << 32 | end).
  int64_t count = 0;
};

class FrameArena {
 public:
  int32_t Push(const Frame& f) {
    frames_.push_back(f);
    return static_cast<int32_t>(frames_.size() - 1);
  }
  const Frame& operator[](int32_t i) const { return frames_[static_cast<size_t>(i)]; }
  size_t size() const { return frames_.size(); }
  void Truncate(size_t n) { frames_.resize(n); }
  void Clear() { frames_.clear(); }

 private:
  std::vector<Frame> frames_;
};

// At most this many ways to read the bytes at once: a schema whose anyOf
// branches cannot be told apart for longer is refused when it gets there
// (JsonMatcher::overflowed) instead of growing without bound.
inline constexpr size_t kMaxAlternatives = 256;

// The stacks `tops` reach after `byte`, appended to `out` (empty: the byte is
// refused). False when they would be more than kMaxAlternatives, or a
// grammar's frames deeper than kMaxGrammarDepth (json_schema.h).
bool StepBytes(const Schema& schema, FrameArena& arena, std::span<const int32_t> tops, uint8_t byte,
               std::vector<int32_t>* out);
// Whether the document may end with the stack `top`.
bool StackComplete(const Schema& schema, const FrameArena& arena, int32_t top);
// Whether some byte could follow on the stack `top` (false once the
// document's value is closed).
bool StackOpen(const Schema& schema, const FrameArena& arena, int32_t top);

// One request's document so far.
class JsonMatcher {
 public:
  explicit JsonMatcher(std::shared_ptr<const Schema> schema);

  // Steps over `bytes`. False, and nothing changes, when the schema refuses
  // them (or they reach too many alternatives: see overflowed()).
  bool Accept(std::string_view bytes);
  // The bytes so far are a whole document.
  bool Complete() const;
  // Some byte may still follow.
  bool Open() const;
  // The last refused Accept was refused for kMaxAlternatives (or
  // kMaxGrammarDepth).
  bool overflowed() const { return overflowed_; }
  // Appends what the matcher's future depends on: each stack's frames top
  // to bottom, without their places in the arena, and with the counts no
  // bound reads clamped (a string's characters past its minLength when it
  // has no maxLength; an array's items likewise). Two matchers of one
  // schema with the same key accept the same bytes from here on, so their
  // token masks are one (TokenMaskCache's key).
  void AppendStateKey(std::string* key) const;

  const Schema& schema() const { return *schema_; }
  const FrameArena& arena() const { return arena_; }
  std::span<const int32_t> tops() const { return tops_; }

 private:
  // Copies the live stacks into a fresh arena.
  void Compact();

  std::shared_ptr<const Schema> schema_;
  FrameArena arena_;
  std::vector<int32_t> tops_;
  std::vector<int32_t> next_;
  bool overflowed_ = false;
};

}  // namespace tandem::grammar
