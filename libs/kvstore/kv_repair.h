// Start-up repair of the KV-store's RocksDB directory (private to
// libs/kvstore; issue 29). The store is a cache: whatever corruption the
// start-up finds, it starts, drops the blocks whose bytes it cannot read back
// intact, and keeps every other block.
//
//  - A directory RocksDB cannot open (a damaged MANIFEST, a CURRENT naming a
//    missing MANIFEST, a missing CURRENT beside table files) is rebuilt by
//    RocksDB's RepairDB. RepairDB registers no blob files, so every payload
//    in a blob file is gone afterwards; the salvage below then drops the
//    metadata records left without their payload.
//  - A damaged block of a table file (a flipped byte: "block checksum
//    mismatch") lets RocksDB open but fails any read or compaction that
//    touches it. The store copies every intact record into a fresh database
//    in `<data_dir>/salvage` (SalvageInto), stepping over the damaged key
//    ranges, then replaces the damaged database by the copy (InstallSalvage).
//    A block is copied only when its metadata and payload both read back and
//    the payload matches the metadata's size and CRC32C, so afterwards the
//    index (rebuilt from the metadata) and RocksDB agree.
//
// The copy rewrites every intact block once; it needs about as much free disk
// as the database holds. A crash during the swap is finished by the next
// start (FinishInterruptedSalvage); a crash before the copy is complete
// leaves the damaged database in place, and the next start salvages again.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "rocksdb/db.h"
#include "rocksdb/options.h"

namespace tandem::kvstore {

// Why `dir` must be repaired before DB::Open, or "" when it need not: its
// CURRENT names a MANIFEST that is not there (DB::Open fails), or CURRENT is
// missing beside table or MANIFEST files (DB::Open would start an empty
// database and delete them).
[[nodiscard]] std::string NeedsRepairBeforeOpen(const std::string& dir);

// Whether a status RocksDB gives while opening or reading means damaged or
// missing files (repairable), not an I/O failure of the moment.
[[nodiscard]] bool IsDamage(const rocksdb::Status& s);

struct SalvageCounts {
  uint64_t namespaces = 0;
  uint64_t blocks_kept = 0;
  // Blocks whose metadata was read but whose payload is missing, unreadable
  // or does not match it, or whose namespace record is gone.
  uint64_t blocks_dropped = 0;
  // Records that could not be parsed (metadata, namespace records).
  uint64_t records_dropped = 0;
  // Damaged key ranges stepped over; every record in them is dropped.
  uint64_t ranges_skipped = 0;
};

// Copies every intact namespace record and block of `db` (open) into a fresh
// database in `<data_dir>/salvage`, made with `options` (its listeners
// dropped), and marks the copy complete. Logs each dropped block (the first
// few by hash, then a count) and each skipped key range.
absl::StatusOr<SalvageCounts> SalvageInto(rocksdb::DB* db, const std::string& data_dir,
                                          const rocksdb::Options& options);

// Replaces the database files in `data_dir` (closed) by the complete copy in
// `<data_dir>/salvage`, and removes the copy's directory. Crash-safe: markers
// in the copy's directory say how far it got, and FinishInterruptedSalvage
// goes on from there.
absl::Status InstallSalvage(const std::string& data_dir);

// Before DB::Open: finishes an InstallSalvage a crash interrupted, or removes
// a copy that was never completed.
absl::Status FinishInterruptedSalvage(const std::string& data_dir);

}  // namespace tandem::kvstore
