// Minimal leveled logging to stderr and CHECK macros (Abseil 20220623 has no
// absl/log). One line per message; thread-safe.
//
//   TANDEM_LOG(INFO) << "loaded " << n << " layers";
//   TANDEM_CHECK(ptr != nullptr) << "pool not initialised";
#pragma once

#include <cstdint>
#include <sstream>
#include <string>
#include <string_view>

namespace tandem {

enum class LogLevel { kDebug = 0, kInfo = 1, kWarning = 2, kError = 3, kFatal = 4 };

// Messages below this level are dropped. Default kInfo; TANDEM_LOG_LEVEL
// (debug|info|warning|error) in the environment overrides it at start-up.
void SetMinLogLevel(LogLevel level);
LogLevel MinLogLevel();
// Optional tag printed in every line (e.g. the service name).
void SetLogTag(std::string_view tag);

namespace internal {
// A log line's time: "MMDD HH:MM:SS.uuuuuu" in UTC, microseconds zero-padded.
std::string FormatLogTime(int64_t unix_seconds, int64_t nanos);

class LogMessage {
 public:
  LogMessage(LogLevel level, const char* file, int line);
  ~LogMessage();
  LogMessage(const LogMessage&) = delete;
  LogMessage& operator=(const LogMessage&) = delete;
  std::ostream& stream() { return stream_; }

 private:
  LogLevel level_;
  std::ostringstream stream_;
};
// Swallows the stream in the disabled branch of TANDEM_LOG.
struct LogVoidify {
  void operator&(std::ostream&) {}
};
}  // namespace internal
}  // namespace tandem

#define TANDEM_LOG_LEVEL_DEBUG ::tandem::LogLevel::kDebug
#define TANDEM_LOG_LEVEL_INFO ::tandem::LogLevel::kInfo
#define TANDEM_LOG_LEVEL_WARNING ::tandem::LogLevel::kWarning
#define TANDEM_LOG_LEVEL_ERROR ::tandem::LogLevel::kError
#define TANDEM_LOG_LEVEL_FATAL ::tandem::LogLevel::kFatal

#define TANDEM_LOG(severity)                                               \
  (TANDEM_LOG_LEVEL_##severity < ::tandem::MinLogLevel())                  \
      ? (void)0                                                            \
      : ::tandem::internal::LogVoidify() &                                 \
            ::tandem::internal::LogMessage(TANDEM_LOG_LEVEL_##severity,    \
                                           __FILE__, __LINE__)             \
                .stream()

// Aborts with a message when an invariant that only a bug can break fails.
#define TANDEM_CHECK(cond)                                                   \
  (cond) ? (void)0                                                           \
         : ::tandem::internal::LogVoidify() &                                \
               ::tandem::internal::LogMessage(::tandem::LogLevel::kFatal,    \
                                              __FILE__, __LINE__)            \
                       .stream()                                             \
                   << "Check failed: " #cond " "
#define TANDEM_CHECK_EQ(a, b) TANDEM_CHECK((a) == (b))
#define TANDEM_CHECK_GE(a, b) TANDEM_CHECK((a) >= (b))
#define TANDEM_CHECK_LE(a, b) TANDEM_CHECK((a) <= (b))
#define TANDEM_CHECK_GT(a, b) TANDEM_CHECK((a) > (b))
#define TANDEM_CHECK_LT(a, b) TANDEM_CHECK((a) < (b))
#ifdef NDEBUG
#define TANDEM_DCHECK(cond) \
  while (false) TANDEM_CHECK(cond)
#else
#define TANDEM_DCHECK(cond) TANDEM_CHECK(cond)
#endif
