#include "tandem/common/logging.h"

#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>

namespace tandem {
namespace {

LogLevel LevelFromEnv() {
  const char* env = std::getenv("TANDEM_LOG_LEVEL");
  if (env == nullptr) return LogLevel::kInfo;
  if (std::strcmp(env, "debug") == 0) return LogLevel::kDebug;
  if (std::strcmp(env, "warning") == 0) return LogLevel::kWarning;
  if (std::strcmp(env, "error") == 0) return LogLevel::kError;
  return LogLevel::kInfo;
}

std::atomic<int>& MinLevel() {
  static std::atomic<int> level{static_cast<int>(LevelFromEnv())};
  return level;
}

std::mutex& TagMutex() {
  static std::mutex mu;
  return mu;
}
std::string& Tag() {
  static std::string tag;
  return tag;
}

char LevelChar(LogLevel level) {
  switch (level) {
    case LogLevel::kDebug: return 'D';
    case LogLevel::kInfo: return 'I';
    case LogLevel::kWarning: return 'W';
    case LogLevel::kError: return 'E';
    case LogLevel::kFatal: return 'F';
  }
  return '?';
}

}  // namespace

void SetMinLogLevel(LogLevel level) { MinLevel().store(static_cast<int>(level)); }
LogLevel MinLogLevel() { return static_cast<LogLevel>(MinLevel().load()); }
void SetLogTag(std::string_view tag) {
  std::lock_guard<std::mutex> lock(TagMutex());
  Tag() = std::string(tag);
}

namespace internal {

std::string FormatLogTime(int64_t unix_seconds, int64_t nanos) {
  const time_t secs = static_cast<time_t>(unix_seconds);
  tm tm_utc;
  gmtime_r(&secs, &tm_utc);
  char when[32];
  const size_t n = strftime(when, sizeof(when), "%m%d %H:%M:%S", &tm_utc);
  // Zero-padded: .033994, not .33994.
  std::snprintf(when + n, sizeof(when) - n, ".%06ld", static_cast<long>(nanos / 1000));
  return when;
}

LogMessage::LogMessage(LogLevel level, const char* file, int line) : level_(level) {
  timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  const char* base = std::strrchr(file, '/');
  std::string tag;
  {
    std::lock_guard<std::mutex> lock(TagMutex());
    tag = Tag();
  }
  stream_ << LevelChar(level) << FormatLogTime(ts.tv_sec, ts.tv_nsec) << ' '
          << (tag.empty() ? "" : tag + " ") << (base ? base + 1 : file) << ':' << line << "] ";
}

LogMessage::~LogMessage() {
  stream_ << '\n';
  const std::string line = stream_.str();
  // One write() per line keeps lines from interleaving across threads.
  ssize_t unused = ::write(STDERR_FILENO, line.data(), line.size());
  (void)unused;
  if (level_ == LogLevel::kFatal) std::abort();
}

}  // namespace internal
}  // namespace tandem
