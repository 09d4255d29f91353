// Start-up repair of the KV-store's RocksDB directory: see kv_repair.h.
#include "kv_repair.h"

#include <fcntl.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <span>
#include <unordered_set>
#include <utility>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "kv_format.h"
#include "kv_rocks.h"
#include "rocksdb/write_batch.h"
#include "tandem/common/logging.h"
#include "tandem/common/status.h"
#include "tandem/kvtypes/checksum.h"

namespace tandem::kvstore {
namespace {

namespace fs = std::filesystem;

constexpr char kSalvageDir[] = "salvage";
constexpr char kCompleteMarker[] = "SALVAGE-COMPLETE";
constexpr char kOldDeletedMarker[] = "SALVAGE-OLD-DELETED";
// Dropped blocks logged one by one before only a count is.
constexpr uint64_t kBlocksLoggedByHash = 20;
// Seek targets of the search past a damaged range: every key of ours is
// shorter ('n' + a name of at most 128 bytes; 37 bytes for blocks).
constexpr size_t kProbeKeyBytes = 136;

std::string Printable(const std::string& key) {
  return absl::CEscape(key.size() > 48 ? key.substr(0, 48) + "..." : key);
}

// `key` padded with zero bytes (or cut) to kProbeKeyBytes, as a big-endian number.
std::string ProbeKey(const std::string& key) {
  std::string k = key.substr(0, kProbeKeyBytes);
  k.resize(kProbeKeyBytes, '\0');
  return k;
}
// `a` + 2^bit, saturating at all ones.
std::string AddPowerOfTwo(const std::string& a, size_t bit) {
  std::string r = a;
  size_t i = r.size() - 1 - bit / 8;
  unsigned carry = 1u << (bit % 8);
  for (;; --i) {
    const unsigned sum = static_cast<uint8_t>(r[i]) + carry;
    r[i] = static_cast<char>(sum & 0xFF);
    carry = sum >> 8;
    if (carry == 0) return r;
    if (i == 0) return std::string(r.size(), '\xFF');
  }
}
// (a + b) / 2, for a <= b of equal length.
std::string Midpoint(const std::string& a, const std::string& b) {
  std::string r(a.size(), '\0');
  unsigned carry = 0;
  for (size_t i = a.size(); i-- > 0;) {
    const unsigned sum = static_cast<uint8_t>(a[i]) + static_cast<uint8_t>(b[i]) + carry;
    r[i] = static_cast<char>(sum & 0xFF);
    carry = sum >> 8;
  }
  for (size_t i = 0; i < r.size(); ++i) {  // shift the (carry, r) number right by one
    const unsigned byte = static_cast<uint8_t>(r[i]);
    r[i] = static_cast<char>((byte >> 1) | (carry << 7));
    carry = byte & 1;
  }
  return r;
}

// Whether a seek to `target` reads without error.
bool SeekReads(rocksdb::DB* db, const rocksdb::ReadOptions& ro, const std::string& target) {
  std::unique_ptr<rocksdb::Iterator> it(db->NewIterator(ro));
  it->Seek(target);
  return it->status().ok();
}

// The smallest seek target above `bad` (a key whose successor fails to read)
// found to read again: first doubling the step from `bad`, then halving it,
// so that the damaged range stepped over is the nearest one.
std::string ResumeAfterDamage(rocksdb::DB* db, const rocksdb::ReadOptions& ro,
                              const std::string& bad) {
  std::string lo = ProbeKey(bad);
  const std::string top(kProbeKeyBytes, '\xFF');
  std::string hi = top;
  for (size_t bit = 0; bit < 8 * kProbeKeyBytes; ++bit) {
    std::string probe = AddPowerOfTwo(lo, bit);
    if (probe == top) break;
    if (SeekReads(db, ro, probe)) {
      hi = std::move(probe);
      break;
    }
  }
  for (;;) {
    std::string mid = Midpoint(lo, hi);
    if (mid == lo) return hi;
    if (SeekReads(db, ro, mid)) {
      hi = std::move(mid);
    } else {
      lo = std::move(mid);
    }
  }
}

// Calls `visit` with every record under `prefix` that reads back, in key
// order; steps over damaged ranges (logged and counted). Fails only when a
// range cannot be stepped over.
// `skipped` gets each range stepped over: (last key read, key read again).
rocksdb::Status ScanReadable(rocksdb::DB* db, char prefix, SalvageCounts* counts,
                             absl::FunctionRef<void(const rocksdb::Slice&, const rocksdb::Slice&)>
                                 visit,
                             std::vector<std::pair<std::string, std::string>>* skipped) {
  rocksdb::ReadOptions ro;
  ro.verify_checksums = true;
  const std::string start(1, prefix);
  std::string seek = start;
  for (;;) {
    std::unique_ptr<rocksdb::Iterator> it(db->NewIterator(ro));
    std::string last = seek;
    for (it->Seek(seek); it->Valid() && it->key().starts_with(start); it->Next()) {
      visit(it->key(), it->value());
      last = it->key().ToString();
    }
    if (it->status().ok()) return rocksdb::Status::OK();
    const rocksdb::Status damage = it->status();
    it.reset();
    if (!SeekReads(db, ro, std::string(kProbeKeyBytes, '\xFF'))) return damage;  // nowhere to resume
    const std::string resume = ResumeAfterDamage(db, ro, last);
    ++counts->ranges_skipped;
    skipped->emplace_back(last, resume);
    TANDEM_LOG(ERROR) << "KV-store: salvage: records after key '" << Printable(last)
                      << "' up to '" << Printable(resume) << "' cannot be read (" << damage.ToString()
                      << "); dropped";
    if (resume[0] != prefix) return rocksdb::Status::OK();
    if (resume <= seek) return damage;  // no progress; cannot happen for a monotone search
    seek = resume;
  }
}

absl::Status FsyncPath(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) return absl::InternalError(absl::StrCat("opening ", path, " to sync it"));
  const int rc = ::fsync(fd);
  ::close(fd);
  if (rc != 0) return absl::InternalError(absl::StrCat("syncing ", path));
  return absl::OkStatus();
}

absl::Status WriteMarker(const std::string& dir, const char* name) {
  const std::string path = dir + "/" + name;
  {
    std::ofstream f(path, std::ios::trunc);
    f << "tandem KV-store salvage\n";
    if (!f.good()) return absl::InternalError(absl::StrCat("writing ", path));
  }
  if (absl::Status s = FsyncPath(path); !s.ok()) return s;
  return FsyncPath(dir);
}

}  // namespace

bool IsDamage(const rocksdb::Status& s) { return s.IsCorruption() || s.IsPathNotFound(); }

std::string NeedsRepairBeforeOpen(const std::string& dir) {
  std::error_code ec;
  const fs::path current = fs::path(dir) / "CURRENT";
  if (fs::exists(current, ec)) {
    std::ifstream f(current);
    std::string manifest;
    std::getline(f, manifest);
    if (manifest.empty() || !fs::exists(fs::path(dir) / manifest, ec)) {
      return absl::StrCat("CURRENT names MANIFEST '", manifest, "', which is not there");
    }
    return "";
  }
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.starts_with("MANIFEST-") || name.ends_with(".sst")) {
      return absl::StrCat("CURRENT is missing beside ", name);
    }
  }
  return "";
}

absl::StatusOr<SalvageCounts> SalvageInto(rocksdb::DB* db, const std::string& data_dir,
                                          const rocksdb::Options& options) {
  const std::string dir = data_dir + "/" + kSalvageDir;
  std::error_code ec;
  fs::remove_all(dir, ec);
  fs::create_directories(dir, ec);
  rocksdb::Options o = options;
  o.listeners.clear();
  o.create_if_missing = true;
  o.error_if_exists = true;
  rocksdb::DB* raw = nullptr;
  TANDEM_RETURN_IF_ERROR(FromRocks(rocksdb::DB::Open(o, dir, &raw), "creating " + dir));
  std::unique_ptr<rocksdb::DB> out(raw);

  SalvageCounts counts;
  rocksdb::WriteBatch batch;
  rocksdb::Status write_error;
  rocksdb::WriteOptions wo;
  wo.disableWAL = true;  // flushed and synced before the copy is marked complete
  auto put = [&](const rocksdb::Slice& k, const rocksdb::Slice& v) {
    if (!write_error.ok()) return;
    batch.Put(k, v);
    if (batch.GetDataSize() < (size_t{16} << 20)) return;
    write_error = out->Write(wo, &batch);
    batch.Clear();
  };

  // Namespace records by name: the record, or its copy where the record
  // cannot be read.
  std::map<std::string, std::string> ns_records;
  std::vector<std::pair<std::string, std::string>> skipped;
  for (const char prefix : {kNamespaceCopyPrefix, kNamespacePrefix}) {
    const rocksdb::Status scanned = ScanReadable(
        db, prefix, &counts,
        [&](const rocksdb::Slice& k, const rocksdb::Slice& v) {
          if (v.size() < 12) {
            ++counts.records_dropped;
            TANDEM_LOG(ERROR) << "KV-store: salvage: dropping unreadable namespace record '"
                              << Printable(k.ToString()) << "'";
            return;
          }
          ns_records[k.ToString().substr(1)] = v.ToString();
        },
        &skipped);
    TANDEM_RETURN_IF_ERROR(FromRocks(scanned, "salvaging namespace records"));
  }
  skipped.clear();
  std::unordered_set<uint32_t> ns_ids;
  for (const auto& [name, record] : ns_records) {
    ns_ids.insert(GetU32(record.data()));
    ++counts.namespaces;
    put(std::string(1, kNamespacePrefix) + name, record);
    put(std::string(1, kNamespaceCopyPrefix) + name, record);
  }
  rocksdb::Status scanned;

  rocksdb::ReadOptions payload_ro;
  payload_ro.verify_checksums = true;
  auto drop = [&](const Key& key, absl::string_view why) {
    if (++counts.blocks_dropped <= kBlocksLoggedByHash) {
      TANDEM_LOG(WARNING) << "KV-store: salvage: dropping block " << key.hash.ToHex()
                          << " (namespace id " << key.ns << "): " << why;
    }
  };
  scanned = ScanReadable(
      db, kMetaPrefix, &counts, [&](const rocksdb::Slice& k, const rocksdb::Slice& v) {
        Key key;
        Meta meta;
        if (!ParseRocksKey(k, &key) || !DecodeMeta(v, &meta)) {
          ++counts.records_dropped;
          TANDEM_LOG(ERROR) << "KV-store: salvage: dropping unreadable metadata record '"
                            << Printable(k.ToString()) << "'";
          return;
        }
        if (!ns_ids.contains(key.ns)) return drop(key, "its namespace record is gone");
        const std::string payload_key = RocksKey(kBlockPrefix, key);
        rocksdb::PinnableSlice payload;
        const rocksdb::Status s =
            db->Get(payload_ro, db->DefaultColumnFamily(), payload_key, &payload);
        if (!s.ok()) return drop(key, absl::StrCat("its payload cannot be read: ", s.ToString()));
        const std::span<const uint8_t> bytes(reinterpret_cast<const uint8_t*>(payload.data()),
                                             payload.size());
        if (bytes.size() != meta.size || Crc32c(bytes) != meta.checksum) {
          return drop(key, "its payload does not match its size and CRC32C");
        }
        ++counts.blocks_kept;
        put(k, v);
        put(payload_key, payload);
      },
      &skipped);
  TANDEM_RETURN_IF_ERROR(FromRocks(scanned, "salvaging block metadata"));
  // Blocks whose metadata sat in a damaged range: named by their payloads'
  // keys, which sort the same way under the other prefix.
  for (auto& [from, to] : skipped) {
    from[0] = to[0] = kBlockPrefix;
    std::unique_ptr<rocksdb::Iterator> it(db->NewIterator(payload_ro));
    for (it->Seek(from); it->Valid() && it->key().compare(to) < 0; it->Next()) {
      Key key;
      if (it->key() != rocksdb::Slice(from) && ParseRocksKey(it->key(), &key)) {
        drop(key, "its metadata record is in a damaged table block");
      }
    }
  }
  if (write_error.ok() && batch.Count() > 0) write_error = out->Write(wo, &batch);
  TANDEM_RETURN_IF_ERROR(FromRocks(write_error, "writing the salvaged copy in " + dir));
  TANDEM_RETURN_IF_ERROR(FromRocks(out->Flush(rocksdb::FlushOptions()), "flushing " + dir));
  TANDEM_RETURN_IF_ERROR(FromRocks(out->Close(), "closing " + dir));
  out.reset();
  if (counts.blocks_dropped > kBlocksLoggedByHash) {
    TANDEM_LOG(WARNING) << "KV-store: salvage: " << counts.blocks_dropped - kBlocksLoggedByHash
                        << " more blocks dropped";
  }
  TANDEM_RETURN_IF_ERROR(WriteMarker(dir, kCompleteMarker));
  return counts;
}

absl::Status InstallSalvage(const std::string& data_dir) {
  const std::string dir = data_dir + "/" + kSalvageDir;
  std::error_code ec;
  if (!fs::exists(fs::path(dir) / kCompleteMarker, ec)) {
    return absl::FailedPreconditionError(absl::StrCat(dir, " holds no complete salvaged copy"));
  }
  if (!fs::exists(fs::path(dir) / kOldDeletedMarker, ec)) {
    // The damaged database: every file of data_dir (RocksDB's lost/ and the
    // copy's directory stay).
    for (const auto& entry : fs::directory_iterator(data_dir, ec)) {
      if (!entry.is_regular_file()) continue;
      fs::remove(entry.path(), ec);
      if (ec) return absl::InternalError(absl::StrCat("removing ", entry.path().string(), ": ",
                                                      ec.message()));
    }
    if (ec) return absl::InternalError(absl::StrCat("listing ", data_dir, ": ", ec.message()));
    TANDEM_RETURN_IF_ERROR(FsyncPath(data_dir));
    TANDEM_RETURN_IF_ERROR(WriteMarker(dir, kOldDeletedMarker));
  }
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (!entry.is_regular_file() || name == kCompleteMarker || name == kOldDeletedMarker) continue;
    fs::rename(entry.path(), fs::path(data_dir) / name, ec);
    if (ec) return absl::InternalError(absl::StrCat("moving ", entry.path().string(), ": ",
                                                    ec.message()));
  }
  if (ec) return absl::InternalError(absl::StrCat("listing ", dir, ": ", ec.message()));
  TANDEM_RETURN_IF_ERROR(FsyncPath(data_dir));
  fs::remove_all(dir, ec);
  return absl::OkStatus();
}

absl::Status FinishInterruptedSalvage(const std::string& data_dir) {
  const std::string dir = data_dir + "/" + kSalvageDir;
  std::error_code ec;
  if (!fs::exists(dir, ec)) return absl::OkStatus();
  if (fs::exists(fs::path(dir) / kCompleteMarker, ec)) {
    TANDEM_LOG(WARNING) << "KV-store: finishing the installation of the salvaged copy in " << dir
                        << ", which a stop interrupted";
    return InstallSalvage(data_dir);
  }
  TANDEM_LOG(WARNING) << "KV-store: removing " << dir << ", a salvaged copy never completed";
  fs::remove_all(dir, ec);
  return absl::OkStatus();
}

}  // namespace tandem::kvstore
