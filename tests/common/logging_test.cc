#include "tandem/common/logging.h"

#include <unistd.h>

#include <cstdio>
#include <regex>
#include <string>

#include "gtest/gtest.h"

namespace tandem {
namespace {

TEST(LogTime, MicrosecondsAreZeroPadded) {
  // 2026-11-24 12:34:56 UTC.
  const int64_t t = 1795523696;
  EXPECT_EQ(internal::FormatLogTime(t, 33'994'000), "1124 12:34:56.033994");
  EXPECT_EQ(internal::FormatLogTime(t, 7'000), "1124 12:34:56.000007");
  EXPECT_EQ(internal::FormatLogTime(t, 0), "1124 12:34:56.000000");
  EXPECT_EQ(internal::FormatLogTime(t, 999'999'999), "1124 12:34:56.999999");
}

// Every line the logger writes starts with a level letter and a fixed-width
// time, so lines sort by time as text.
TEST(LogTime, EveryLineHasAFixedWidthTime) {
  std::FILE* tmp = std::tmpfile();
  ASSERT_NE(tmp, nullptr);
  const int saved = dup(STDERR_FILENO);
  ASSERT_GE(saved, 0);
  ASSERT_GE(dup2(fileno(tmp), STDERR_FILENO), 0);
  for (int i = 0; i < 200; ++i) TANDEM_LOG(WARNING) << "line " << i;
  dup2(saved, STDERR_FILENO);
  close(saved);
  std::rewind(tmp);
  const std::regex head(R"(^W\d{4} \d{2}:\d{2}:\d{2}\.\d{6} \S+:\d+\] line \d+$)");
  char buf[512];
  int lines = 0;
  std::string previous;
  while (std::fgets(buf, sizeof(buf), tmp) != nullptr) {
    std::string line(buf);
    if (!line.empty() && line.back() == '\n') line.pop_back();
    EXPECT_TRUE(std::regex_match(line, head)) << line;
    const std::string when = line.substr(1, 20);
    EXPECT_LE(previous, when);
    previous = when;
    ++lines;
  }
  std::fclose(tmp);
  EXPECT_EQ(lines, 200);
}

}  // namespace
}  // namespace tandem
