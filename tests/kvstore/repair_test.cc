// The KV-store restarts over damaged RocksDB files (issue 29): a flipped byte
// in a table file, a damaged or missing MANIFEST, a lost blob file. Real
// RocksDB files in a temporary directory, damaged while the store is closed
// (or, for a lost blob file, before its first read).
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tandem/kvstore/kv_store.h"
#include "test_util.h"

namespace tandem::kvstore {
namespace {

namespace fs = std::filesystem;
using ::tandem::kvstore::testing::Crc;
using ::tandem::kvstore::testing::TempDir;
using ::tandem::kvstore::testing::TestHash;
using ::tandem::kvstore::testing::TestPayload;

constexpr char kRepairNs[] = "repair";

std::vector<std::string> FilesEndingWith(const std::string& dir, const std::string& suffix) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) {
    const std::string name = e.path().filename().string();
    if (e.is_regular_file() && name.ends_with(suffix)) out.push_back(e.path().string());
  }
  return out;
}

std::string ReadFile(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

void FlipByte(const std::string& path, size_t offset) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(static_cast<std::streamoff>(offset));
  char c = 0;
  f.read(&c, 1);
  c = static_cast<char>(c ^ 0x5A);
  f.seekp(static_cast<std::streamoff>(offset));
  f.write(&c, 1);
  ASSERT_TRUE(f.good()) << path;
}

class KvStoreRepairTest : public ::testing::Test {
 protected:
  KvStoreOptions Options(bool warm) const {
    return KvStoreOptions{.data_dir = dir_.path(),
                          .hot_capacity_bytes = warm ? 64 * block_ : 0,
                          .hot_slot_bytes = block_,
                          .lock_hot_memory = false};
  }
  void Open(bool warm) {
    store_.reset();
    auto s = KvStoreEngine::Open(Options(warm));
    ASSERT_TRUE(s.ok()) << s.status();
    store_ = std::move(*s);
    // As a connector does after NOT_FOUND: the namespace may have been lost.
    ASSERT_TRUE(
        store_->CreateNamespace({.name = kRepairNs, .block_bytes = block_, .layout = "t"}).ok());
  }
  void StoreBlocks(int n) {
    for (int i = 0; i < n; ++i) {
      const auto p = TestPayload(i, block_);
      auto r = store_->Store(kRepairNs, TestHash(i), p, Crc(p));
      ASSERT_TRUE(r.ok()) << r.status();
    }
  }
  bool Hits(int i) {
    auto r = store_->Lookup(kRepairNs, std::vector<BlockHash>{TestHash(i)}, {.take_lease = false});
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() && r->num_hits == 1;
  }
  // Every block a lookup finds loads with exactly its bytes; returns the
  // blocks it does not find.
  std::vector<int> CheckServedBlocksAreExact(int n) {
    std::vector<int> missing;
    for (int i = 0; i < n; ++i) {
      if (!Hits(i)) {
        missing.push_back(i);
        continue;
      }
      std::vector<uint8_t> got(block_);
      auto r = store_->ReadInto(kRepairNs, TestHash(i), got);
      EXPECT_TRUE(r.ok() && r->ok()) << "block " << i << " is indexed but does not load: "
                                     << (r.ok() ? MissReasonName(r->miss) : r.status().ToString());
      EXPECT_EQ(got, TestPayload(i, block_)) << "block " << i;
    }
    return missing;
  }
  // The blocks that are missing can be stored again (not "already present")
  // and then load exactly.
  void RestoreAndCheck(const std::vector<int>& missing) {
    for (int i : missing) {
      const auto p = TestPayload(i, block_);
      auto r = store_->Store(kRepairNs, TestHash(i), p, Crc(p));
      ASSERT_TRUE(r.ok()) << r.status();
      EXPECT_FALSE(r->already_present) << "block " << i;
      std::vector<uint8_t> got(block_);
      auto read = store_->ReadInto(kRepairNs, TestHash(i), got);
      ASSERT_TRUE(read.ok() && read->ok()) << "block " << i;
      EXPECT_EQ(got, p) << "block " << i;
    }
  }

  TempDir dir_;
  uint64_t block_ = 1024;
  std::unique_ptr<KvStoreEngine> store_;
};

// (a) A flipped byte inside a data block of the table file, in a payload or
// in a metadata record: the store starts, drops only the blocks of the
// damaged table block, serves every other one exactly, and the dropped ones
// can be stored again. Which block and which record are drawn per seed.
class KvStoreFlippedTableByteTest : public KvStoreRepairTest,
                                    public ::testing::WithParamInterface<int> {};

TEST_P(KvStoreFlippedTableByteTest, DropsOnlyTheDamagedBlocksAndStarts) {
  std::mt19937 rng(GetParam());
  block_ = 1024;  // under RocksDB's min_blob_size: payloads sit in the table
  constexpr int kBlocks = 160;
  const bool warm = rng() % 2 == 0;
  const bool in_payload = rng() % 2 == 0;
  const int victim = static_cast<int>(rng() % kBlocks);
  ASSERT_NO_FATAL_FAILURE(Open(warm));
  ASSERT_NO_FATAL_FAILURE(StoreBlocks(kBlocks));
  store_.reset();  // a clean close flushes the blocks into a table file

  // Find the victim's record in a table file: its payload's first 64 bytes,
  // or its metadata ("TKV1" and its CRC32C, little-endian).
  const auto payload = TestPayload(victim, block_);
  std::string needle;
  if (in_payload) {
    needle.assign(payload.begin(), payload.begin() + 64);
  } else {
    const uint32_t magic = 0x3156'4b54, crc = Crc(payload);
    needle.append(reinterpret_cast<const char*>(&magic), 4);
    needle.append(reinterpret_cast<const char*>(&crc), 4);
  }
  std::string file;
  size_t at = std::string::npos;
  for (const std::string& sst : FilesEndingWith(dir_.path(), ".sst")) {
    at = ReadFile(sst).find(needle);
    if (at != std::string::npos) {
      file = sst;
      break;
    }
  }
  ASSERT_NE(at, std::string::npos) << "block " << victim << " not found in any table file";
  FlipByte(file, at + (in_payload ? rng() % block_ : 4 + rng() % 20));
  SCOPED_TRACE(::testing::Message() << "seed " << GetParam() << ": byte flipped in the "
                                  << (in_payload ? "payload" : "metadata") << " of block "
                                  << victim << (warm ? ", hot tier on" : ", hot tier off"));

  ASSERT_NO_FATAL_FAILURE(Open(warm));
  const std::vector<int> missing = CheckServedBlocksAreExact(kBlocks);
  EXPECT_FALSE(Hits(victim));
  // One table block (4 KiB) holds up to 4 payloads or about 70 metadata
  // records; nothing outside it may go.
  EXPECT_GE(missing.size(), 1u);
  EXPECT_LE(missing.size(), in_payload ? 4u : 80u);
  EXPECT_EQ(store_->GetStats().blocks_dropped_at_open, missing.size());
  EXPECT_TRUE(store_->TEST_CheckColdTier().ok()) << store_->TEST_CheckColdTier();
  RestoreAndCheck(missing);

  ASSERT_NO_FATAL_FAILURE(Open(warm));  // the repaired directory opens as it is
  EXPECT_TRUE(CheckServedBlocksAreExact(kBlocks).empty());
  EXPECT_EQ(store_->GetStats().blocks_dropped_at_open, 0u);
  EXPECT_FALSE(fs::exists(dir_.path() + "/salvage"));
}

INSTANTIATE_TEST_SUITE_P(Seeds, KvStoreFlippedTableByteTest, ::testing::Range(1, 9));

// (b) A directory RocksDB cannot open as it is: the MANIFEST removed (CURRENT
// then names a missing file), CURRENT naming another MANIFEST, CURRENT
// removed, or a byte flipped in the MANIFEST. The store repairs it and starts, and the index
// and RocksDB agree: every block a lookup finds loads, and blocks whose
// payloads the repair lost (RocksDB's repair keeps no blob file) are gone
// and can be stored again. Payloads small enough to sit in the tables are
// all kept.
enum class ManifestDamage { kRemoved, kCurrentNamesAnother, kCurrentRemoved, kFlippedByte };

class KvStoreManifestRepairTest
    : public KvStoreRepairTest,
      public ::testing::WithParamInterface<std::tuple<ManifestDamage, uint64_t>> {};

TEST_P(KvStoreManifestRepairTest, StartsAndTheIndexAgreesWithRocksDb) {
  const auto [damage, block] = GetParam();
  block_ = block;
  constexpr int kBlocks = 24;
  ASSERT_NO_FATAL_FAILURE(Open(/*warm=*/true));
  ASSERT_NO_FATAL_FAILURE(StoreBlocks(kBlocks));
  store_.reset();

  const std::vector<std::string> manifests = [&] {
    std::vector<std::string> m;
    for (const auto& e : fs::directory_iterator(dir_.path())) {
      if (e.path().filename().string().starts_with("MANIFEST-")) m.push_back(e.path().string());
    }
    return m;
  }();
  ASSERT_FALSE(manifests.empty());
  switch (damage) {
    case ManifestDamage::kRemoved:
      for (const std::string& m : manifests) fs::remove(m);
      break;
    case ManifestDamage::kCurrentNamesAnother:
      std::ofstream(dir_.path() + "/CURRENT", std::ios::trunc) << "MANIFEST-999999\n";
      break;
    case ManifestDamage::kCurrentRemoved:  // DB::Open alone would start an empty database
      fs::remove(dir_.path() + "/CURRENT");
      break;
    case ManifestDamage::kFlippedByte:
      for (const std::string& m : manifests) FlipByte(m, fs::file_size(m) / 2);
      break;
  }

  ASSERT_NO_FATAL_FAILURE(Open(/*warm=*/false));
  EXPECT_TRUE(store_->TEST_CheckColdTier().ok()) << store_->TEST_CheckColdTier();
  const std::vector<int> missing = CheckServedBlocksAreExact(kBlocks);
  if (block_ < 4096) {
    EXPECT_TRUE(missing.empty()) << missing.size() << " inline blocks lost";
  }
  EXPECT_EQ(store_->GetStats().blocks_dropped_at_open, missing.size());
  RestoreAndCheck(missing);
  ASSERT_NO_FATAL_FAILURE(Open(/*warm=*/false));
  EXPECT_TRUE(CheckServedBlocksAreExact(kBlocks).empty());
}

INSTANTIATE_TEST_SUITE_P(
    Damages, KvStoreManifestRepairTest,
    ::testing::Combine(::testing::Values(ManifestDamage::kRemoved,
                                         ManifestDamage::kCurrentNamesAnother,
                                         ManifestDamage::kCurrentRemoved,
                                         ManifestDamage::kFlippedByte),
                       ::testing::Values(uint64_t{1024}, uint64_t{8192})));

// A stop while a salvaged copy replaces the damaged database: the next start
// finishes the swap when the copy was complete (its marker written), and
// throws an unfinished copy away otherwise. The copy here is a clean
// database of the blocks; the "damaged" one it replaces is an empty store.
class KvStoreInterruptedSalvageTest : public KvStoreRepairTest,
                                      public ::testing::WithParamInterface<bool> {};

TEST_P(KvStoreInterruptedSalvageTest, NextStartFinishesACompleteCopyAndDropsAnUnfinishedOne) {
  const bool complete = GetParam();
  block_ = 8192;  // in blob files: RocksDB's repair alone would lose them
  constexpr int kBlocks = 12;
  ASSERT_NO_FATAL_FAILURE(Open(/*warm=*/false));
  ASSERT_NO_FATAL_FAILURE(StoreBlocks(kBlocks));
  store_.reset();
  TempDir held;  // the clean database, while an empty one takes its place
  for (const auto& e : fs::directory_iterator(dir_.path())) {
    fs::rename(e.path(), held.path() + "/" + e.path().filename().string());
  }
  {
    auto other = KvStoreEngine::Open(Options(false));
    ASSERT_TRUE(other.ok()) << other.status();
  }
  const std::string copy = dir_.path() + "/salvage";
  fs::create_directory(copy);
  for (const auto& e : fs::directory_iterator(held.path())) {
    fs::rename(e.path(), copy + "/" + e.path().filename().string());
  }
  if (complete) {
    // Stopped halfway through the move: the old files deleted, one of the
    // copy's files moved.
    std::ofstream(copy + "/SALVAGE-COMPLETE") << "x\n";
    std::ofstream(copy + "/SALVAGE-OLD-DELETED") << "x\n";
    for (const auto& e : fs::directory_iterator(dir_.path())) {
      if (e.is_regular_file()) fs::remove(e.path());
    }
    const std::vector<std::string> ssts = FilesEndingWith(copy, ".sst");
    ASSERT_FALSE(ssts.empty());
    fs::rename(ssts[0], dir_.path() + "/" + fs::path(ssts[0]).filename().string());
  }

  ASSERT_NO_FATAL_FAILURE(Open(/*warm=*/false));
  EXPECT_FALSE(fs::exists(copy));
  const std::vector<int> missing = CheckServedBlocksAreExact(kBlocks);
  EXPECT_EQ(missing.size(), complete ? 0u : static_cast<size_t>(kBlocks));
  EXPECT_TRUE(store_->TEST_CheckColdTier().ok()) << store_->TEST_CheckColdTier();
}

INSTANTIATE_TEST_SUITE_P(CompleteOrNot, KvStoreInterruptedSalvageTest, ::testing::Bool());

// (c) A block whose load fails (its blob file is gone) is dropped, by a load,
// by a reader's corrupt-block report or by a lookup that stages it, so that
// a store writes it again instead of answering "already present".
enum class FailedBy { kLoad, kReport, kStagedLookup };

class KvStoreLoadFailureTest : public KvStoreRepairTest,
                               public ::testing::WithParamInterface<FailedBy> {};

TEST_P(KvStoreLoadFailureTest, AnEntryWhoseLoadFailsIsDroppedAndCanBeStoredAgain) {
  block_ = 8192;  // payloads in blob files
  constexpr int kBlocks = 6;
  ASSERT_NO_FATAL_FAILURE(Open(/*warm=*/false));
  ASSERT_NO_FATAL_FAILURE(StoreBlocks(kBlocks));
  ASSERT_NO_FATAL_FAILURE(Open(/*warm=*/false));  // cold: no blob file has been opened yet
  const std::vector<std::string> blobs = FilesEndingWith(dir_.path(), ".blob");
  ASSERT_FALSE(blobs.empty());
  for (const std::string& b : blobs) fs::remove(b);

  for (int i = 0; i < kBlocks; ++i) {
    ASSERT_TRUE(Hits(i)) << i;
    switch (GetParam()) {
      case FailedBy::kLoad: {
        std::vector<uint8_t> got(block_);
        auto r = store_->ReadInto(kRepairNs, TestHash(i), got);
        ASSERT_TRUE(r.ok()) << "block " << i << ": " << r.status();
        EXPECT_FALSE(r->ok()) << "block " << i;
        break;
      }
      case FailedBy::kReport: {
        auto dropped = store_->ReportCorrupt(kRepairNs, TestHash(i));
        ASSERT_TRUE(dropped.ok()) << dropped.status();
        EXPECT_TRUE(*dropped) << "block " << i;
        break;
      }
      case FailedBy::kStagedLookup: {
        auto r = store_->Lookup(kRepairNs, std::vector<BlockHash>{TestHash(i)},
                                {.take_lease = false, .stage_to_hot = true});
        ASSERT_TRUE(r.ok()) << r.status();
        EXPECT_EQ(r->num_hits, 0) << "block " << i;
        break;
      }
    }
    EXPECT_FALSE(Hits(i)) << "block " << i << " still indexed after its load failed";
  }
  EXPECT_EQ(store_->GetStats().load_failures, static_cast<uint64_t>(kBlocks));
  std::vector<int> all(kBlocks);
  for (int i = 0; i < kBlocks; ++i) all[i] = i;
  RestoreAndCheck(all);
  EXPECT_TRUE(store_->TEST_CheckColdTier().ok()) << store_->TEST_CheckColdTier();
}

INSTANTIATE_TEST_SUITE_P(LoadReportOrStage, KvStoreLoadFailureTest,
                         ::testing::Values(FailedBy::kLoad, FailedBy::kReport,
                                           FailedBy::kStagedLookup));

}  // namespace
}  // namespace tandem::kvstore
