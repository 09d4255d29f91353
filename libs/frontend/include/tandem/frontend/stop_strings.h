// Stop strings on streamed text (OpenAI's `stop`): the text a client sees
// ends just before the first stop string to complete (read one character
// at a time, the earliest end; at one end, the longest), even when it spans
// token boundaries, so the result does not depend on how the text was split
// into tokens. The stop string itself is not sent.
//
//   StopStringMatcher m({"\n\n", "END"});
//   for (delta : detokenized deltas) {
//     StopStringMatcher::Step s = m.Push(delta);
//     Send(s.text);
//     if (s.stopped) { abort the generation; break; }
//   }
//   Send(m.Finish());   // the held-back tail when the generation ended
//
// A delta pushed with may_stop false (vLLM's min_tokens: stop strings count
// only from the token after the first min_tokens) ends no stop string: a
// stop string counts only where it ends in a delta that may stop, though
// it may begin before that delta, as vLLM searches each new piece of text
// with the stop string's length before it.
//
// Text that could still become the start of a stop string is held back
// (at most the longest stop string minus one byte), so nothing sent is ever
// taken back. Matching is on bytes of UTF-8 text; a held-back tail never
// splits a character because a stop string's prefix ends where the text
// matched it, and Push receives whole characters.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace tandem::frontend {

class StopStringMatcher {
 public:
  explicit StopStringMatcher(std::vector<std::string> stops);

  struct Step {
    std::string text;       // safe to send now (may be empty)
    bool stopped = false;   // a stop string matched: text ends before it
    std::string matched;    // which one
  };
  // Appends `delta`. After a Step with stopped, further Pushes return nothing.
  [[nodiscard]] Step Push(std::string_view delta, bool may_stop = true);
  // The held-back tail (empty after a stop).
  [[nodiscard]] std::string Finish();

  bool stopped() const { return stopped_; }

 private:
  std::vector<std::string> stops_;
  size_t max_len_ = 0;
  std::string pending_;  // held back: may be the start of a stop string
  // A stop string counts only where it ends after this many bytes of
  // pending_ (the text of deltas that could not stop).
  size_t no_stop_end_ = 0;
  bool stopped_ = false;
};

}  // namespace tandem::frontend
