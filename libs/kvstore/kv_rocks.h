// The KV-store's RocksDB glue (private to libs/kvstore): write options per
// Durability, Status conversion, payload read options, and the listener and
// logger the engine opens RocksDB with.
#pragma once

#include <cstdarg>
#include <functional>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "rocksdb/env.h"
#include "rocksdb/listener.h"
#include "rocksdb/options.h"
#include "rocksdb/status.h"
#include "tandem/kvstore/kv_store.h"

namespace tandem::kvstore {

rocksdb::WriteOptions WriteOptionsFor(Durability d);

// INTERNAL "<what>: RocksDB: <status>", or OK.
absl::Status FromRocks(const rocksdb::Status& s, absl::string_view what);

// Payload reads skip RocksDB's own blob checksum: every payload carries our
// CRC32C, verified after the read (and Debian's RocksDB computes its CRC32C
// without SSE4.2, at a fraction of the speed).
rocksdb::ReadOptions PayloadReadOptions();

// Turns off RocksDB's automatic recovery from background errors, and stops
// the store's writes at any background error (a failed flush, compaction or
// WAL write) through `on_error`, which must not call into RocksDB: RocksDB
// holds its mutex while it calls. See WriteToRocks.
class OnRocksError final : public rocksdb::EventListener {
 public:
  explicit OnRocksError(std::function<void(const rocksdb::Status&)> on_error)
      : on_error_(std::move(on_error)) {}
  void OnBackgroundError(rocksdb::BackgroundErrorReason, rocksdb::Status* bg_error) override {
    if (bg_error != nullptr && !bg_error->ok()) on_error_(*bg_error);
  }
  void OnErrorRecoveryBegin(rocksdb::BackgroundErrorReason, rocksdb::Status,
                            bool* auto_recovery) override {
    *auto_recovery = false;
  }

 private:
  const std::function<void(const rocksdb::Status&)> on_error_;
};

// RocksDB's own log lines (warnings and worse) go to the process's log, not
// to a LOG file in the data directory: on a full disk RocksDB 7.8's file
// logger goes on appending to the file writer that failed, and Debian's
// build (its assertions on) aborts the process there, from whichever thread
// logs next (chaos_test and kvstore_disk_full_test saw it, issue 16).
class RocksLogger final : public rocksdb::Logger {
 public:
  RocksLogger() : rocksdb::Logger(rocksdb::InfoLogLevel::WARN_LEVEL) {}
  void Logv(const char* format, va_list ap) override;
  void Logv(const rocksdb::InfoLogLevel level, const char* format, va_list ap) override;
};

}  // namespace tandem::kvstore
