#include "kv_rocks.h"

#include <cstdio>

#include "absl/strings/str_cat.h"
#include "tandem/common/logging.h"

namespace tandem::kvstore {

rocksdb::WriteOptions WriteOptionsFor(Durability d) {
  rocksdb::WriteOptions wo;
  switch (d) {
    case Durability::kNone:
      wo.disableWAL = true;
      break;
    case Durability::kWal:
      break;
    case Durability::kFsync:
      wo.sync = true;
      break;
    case Durability::kMemory:
      // Blocks stored so never reach RocksDB; the store's own records
      // (namespaces) still go through the WAL under a memory default.
      break;
  }
  return wo;
}

absl::Status FromRocks(const rocksdb::Status& s, absl::string_view what) {
  if (s.ok()) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(what, ": RocksDB: ", s.ToString()));
}

rocksdb::ReadOptions PayloadReadOptions() {
  rocksdb::ReadOptions ro;
  ro.verify_checksums = false;
  return ro;
}

void RocksLogger::Logv(const char* format, va_list ap) {
  Logv(rocksdb::InfoLogLevel::INFO_LEVEL, format, ap);
}

void RocksLogger::Logv(const rocksdb::InfoLogLevel level, const char* format, va_list ap) {
  if (level < GetInfoLogLevel() || level == rocksdb::InfoLogLevel::HEADER_LEVEL) return;
  char line[1024];
  std::vsnprintf(line, sizeof line, format, ap);
  if (level >= rocksdb::InfoLogLevel::ERROR_LEVEL) {
    TANDEM_LOG(ERROR) << "RocksDB: " << line;
  } else {
    TANDEM_LOG(WARNING) << "RocksDB: " << line;
  }
}

}  // namespace tandem::kvstore
