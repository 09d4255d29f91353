#include "tandem/frontend/stop_strings.h"

#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace tandem::frontend {
namespace {

// Feeds `deltas`; returns what a client would have seen, and whether it stopped.
std::pair<std::string, bool> Feed(std::vector<std::string> stops,
                                 const std::vector<std::string>& deltas) {
  StopStringMatcher m(std::move(stops));
  std::string seen;
  for (const std::string& d : deltas) {
    StopStringMatcher::Step s = m.Push(d);
    seen += s.text;
    if (s.stopped) return {seen, true};
  }
  seen += m.Finish();
  return {seen, false};
}

TEST(StopStringsTest, StopInsideOneDeltaCutsBeforeIt) {
  EXPECT_EQ(Feed({"END"}, {"hello END world"}), std::make_pair(std::string("hello "), true));
}

TEST(StopStringsTest, StopAcrossDeltaBoundariesIsFoundAndNeverSent) {
  StopStringMatcher m({"\n\n"});
  StopStringMatcher::Step a = m.Push("one\n");
  EXPECT_EQ(a.text, "one");  // the "\n" may start the stop string: held back
  EXPECT_FALSE(a.stopped);
  StopStringMatcher::Step b = m.Push("\ntwo");
  EXPECT_TRUE(b.stopped);
  EXPECT_EQ(b.text, "");
  EXPECT_EQ(b.matched, "\n\n");
}

TEST(StopStringsTest, HeldBackTextThatDoesNotMatchIsReleased) {
  StopStringMatcher m({"STOP"});
  EXPECT_EQ(m.Push("a ST").text, "a ");
  EXPECT_EQ(m.Push("OP").text, "");  // completes "STOP"
  StopStringMatcher n({"STOP"});
  EXPECT_EQ(n.Push("a ST").text, "a ");
  EXPECT_EQ(n.Push("AR").text, "STAR");
  EXPECT_EQ(n.Push("S").text, "");   // "S" may start STOP
  EXPECT_EQ(n.Finish(), "S");        // the end releases it
}

TEST(StopStringsTest, TheMatchThatCompletesFirstWins) {
  // "b" completes before "abc" does, though "abc" starts earlier: a stream
  // read character by character stops at "b", whatever the deltas.
  EXPECT_EQ(Feed({"abc", "b"}, {"xabc"}).first, "xa");
  EXPECT_EQ(Feed({"abc", "b"}, {"x", "a", "bc"}).first, "xa");
  // Same end: the longer one.
  StopStringMatcher m({"bc", "abc"});
  StopStringMatcher::Step s = m.Push("zabcd");
  EXPECT_EQ(s.text, "z");
  EXPECT_EQ(s.matched, "abc");
}

TEST(StopStringsTest, NoStopsPassesEverythingThrough) {
  StopStringMatcher m({});
  EXPECT_EQ(m.Push("abc").text, "abc");
  EXPECT_EQ(m.Finish(), "");
}

TEST(StopStringsTest, MultiByteStopStrings) {
  // "世界" split inside the stream at character boundaries.
  EXPECT_EQ(Feed({"世界"}, {"你好", "世", "界!"}), std::make_pair(std::string("你好"), true));
}

// Any split of a text into deltas gives what a one-shot search gives.
TEST(StopStringsTest, RandomSplitsAgreeWithOneShotSearch) {
  std::mt19937 rng(7);
  const std::string alphabet = "ab\n";
  for (int iter = 0; iter < 2000; ++iter) {
    std::string text;
    for (int i = 0, n = rng() % 30; i < n; ++i) text += alphabet[rng() % alphabet.size()];
    std::vector<std::string> stops;
    for (int s = 0, k = 1 + rng() % 3; s < k; ++s) {
      std::string stop;
      for (int i = 0, n = 1 + rng() % 4; i < n; ++i) stop += alphabet[rng() % alphabet.size()];
      stops.push_back(stop);
    }
    // Reference: read the text one character at a time; stop at the first
    // prefix that ends with a stop string (the longest one ending there).
    size_t first = std::string::npos;
    for (size_t end = 1; end <= text.size() && first == std::string::npos; ++end) {
      for (const std::string& s : stops) {
        if (s.size() <= end && text.compare(end - s.size(), s.size(), s) == 0) {
          first = std::min(first, end - s.size());
        }
      }
    }
    std::vector<std::string> deltas;
    for (size_t pos = 0; pos < text.size();) {
      const size_t len = 1 + rng() % 4;
      deltas.push_back(text.substr(pos, len));
      pos += len;
    }
    auto [seen, stopped] = Feed(stops, deltas);
    ASSERT_EQ(stopped, first != std::string::npos) << text;  // NOLINT
    std::string why = "text '" + text + "' stops:";
    for (const std::string& s : stops) why += " '" + s + "'";
    why += " deltas:";
    for (const std::string& d : deltas) why += " '" + d + "'";
    ASSERT_EQ(seen, stopped ? text.substr(0, first) : text) << why;
  }
}

// vLLM's min_tokens: text pushed with may_stop false ends no stop string,
// but a stop string that begins in it and ends after it counts.
TEST(StopStringsTest, NoStopStringEndsInTextThatMayNotStop) {
  {
    StopStringMatcher m({"\n"});
    StopStringMatcher::Step a = m.Push("a\n", /*may_stop=*/false);
    EXPECT_EQ(a.text, "a\n");
    EXPECT_FALSE(a.stopped);
    StopStringMatcher::Step b = m.Push("b\nc");
    EXPECT_TRUE(b.stopped);
    EXPECT_EQ(b.text, "b");
  }
  {
    // "a" ends in the held text; "abc" begins there and ends after it.
    StopStringMatcher m({"a", "abc"});
    EXPECT_EQ(m.Push("ab", false).text, "");  // may begin "abc": held back
    StopStringMatcher::Step b = m.Push("c");
    EXPECT_TRUE(b.stopped);
    EXPECT_EQ(b.matched, "abc");
    EXPECT_EQ(b.text, "");
  }
  {
    StopStringMatcher m({"aa"});
    EXPECT_EQ(m.Push("aaa", false).text, "aa");
    StopStringMatcher::Step b = m.Push("a");
    EXPECT_TRUE(b.stopped);
    EXPECT_EQ(b.text, "");
  }
  // Random texts, stops and splits, against a one-character-at-a-time
  // reader that lets only ends past the no-stop text count.
  std::mt19937 rng(11);
  const std::string alphabet = "ab\n";
  for (int iter = 0; iter < 2000; ++iter) {
    std::vector<std::string> deltas;
    for (int i = 0, n = rng() % 10; i < n; ++i) {
      std::string d;
      for (int j = 0, len = 1 + rng() % 3; j < len; ++j) d += alphabet[rng() % alphabet.size()];
      deltas.push_back(d);
    }
    const size_t no_stop = deltas.empty() ? 0 : rng() % (deltas.size() + 1);
    std::vector<std::string> stops;
    for (int k = 0, n = 1 + rng() % 3; k < n; ++k) {
      std::string stop;
      for (int i = 0, len = 1 + rng() % 4; i < len; ++i) stop += alphabet[rng() % alphabet.size()];
      stops.push_back(stop);
    }
    std::string text;
    size_t boundary = 0;
    for (size_t i = 0; i < deltas.size(); ++i) {
      text += deltas[i];
      if (i + 1 == no_stop) boundary = text.size();
    }
    size_t first = std::string::npos;
    for (size_t end = boundary + 1; end <= text.size() && first == std::string::npos; ++end) {
      for (const std::string& stop : stops) {
        if (stop.size() <= end && text.compare(end - stop.size(), stop.size(), stop) == 0) {
          first = std::min(first, end - stop.size());
        }
      }
    }
    StopStringMatcher m(stops);
    std::string seen;
    bool stopped = false;
    for (size_t i = 0; i < deltas.size() && !stopped; ++i) {
      StopStringMatcher::Step step = m.Push(deltas[i], i >= no_stop);
      seen += step.text;
      stopped = step.stopped;
    }
    if (!stopped) seen += m.Finish();
    std::string why = "text '" + text + "' boundary " + std::to_string(boundary) + " stops:";
    for (const std::string& stop : stops) why += " '" + stop + "'";
    ASSERT_EQ(stopped, first != std::string::npos) << why;
    ASSERT_EQ(seen, stopped ? text.substr(0, first) : text) << why;
  }
}

}  // namespace
}  // namespace tandem::frontend
