// Crash safety (DESIGN §9: nothing acknowledged is lost). A child process
// stores blocks in `wal` mode and reports each acknowledged block on a pipe;
// the test SIGKILLs it at a random point and reopens the store. Then:
//  - every acknowledged block is present and intact;
//  - no block is half there: for every block, Lookup and Read agree (a hit
//    reads back the exact bytes written, a miss reads NotFound), and RocksDB
//    holds no metadata record without its payload nor the reverse;
//  - only the one block the child may have been writing when killed can be
//    present without an ack.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tandem/common/clock.h"
#include "tandem/kvtypes/checksum.h"
#include "tandem/kvstore/kv_store.h"
#include "test_util.h"

namespace tandem::kvstore {
namespace {

using ::tandem::kvstore::testing::TempDir;
using ::tandem::kvstore::testing::TestHash;
using ::tandem::kvstore::testing::TestPayload;

constexpr uint64_t kBlock = 8192;
constexpr int kCycles = 50;

struct Child {
  pid_t pid = -1;
  int fd = -1;
};

// `mode`: the writer's optional mode argument ("" for none).
Child Spawn(const std::string& dir, uint64_t start, const std::string& mode) {
  int fds[2];
  EXPECT_EQ(pipe(fds), 0);
  pid_t pid = fork();
  if (pid == 0) {
    dup2(fds[1], STDOUT_FILENO);
    close(fds[0]);
    close(fds[1]);
    const std::string s = std::to_string(start), b = std::to_string(kBlock);
    execl(TANDEM_KVSTORE_CRASH_WRITER, TANDEM_KVSTORE_CRASH_WRITER, dir.c_str(), s.c_str(),
          b.c_str(), mode.empty() ? static_cast<char*>(nullptr) : mode.c_str(),
          static_cast<char*>(nullptr));
    _exit(127);
  }
  close(fds[1]);
  return Child{pid, fds[0]};
}

// Reads complete "<index>\n" lines from `fd` into `acked`; `partial` carries
// an unfinished line between calls.
void ReadAcks(int fd, std::string* partial, std::set<uint64_t>* acked, bool* ready) {
  char buf[4096];
  ssize_t n;
  while ((n = read(fd, buf, sizeof buf)) > 0) {
    partial->append(buf, n);
    size_t pos;
    while ((pos = partial->find('\n')) != std::string::npos) {
      const std::string line = partial->substr(0, pos);
      if (line == "R") {
        *ready = true;
      } else {
        acked->insert(std::stoull(line));
      }
      partial->erase(0, pos + 1);
    }
  }
}

// `cycles` rounds of: start the writer in `mode`, SIGKILL it, reopen and
// check the store; at least `min_acked` blocks acknowledged in all.
void CrashCycles(const std::string& mode, int cycles, size_t min_acked) {
  TempDir dir;
  std::mt19937 rng(20261122);
  std::set<uint64_t> acked;
  uint64_t next = 0;
  int cycles_with_acks = 0;
  std::map<uint64_t, uint32_t> expected_crc;
  for (int cycle = 0; cycle < cycles; ++cycle) {
    Child child = Spawn(dir.path(), next, mode);
    ASSERT_GT(child.pid, 0);
    fcntl(child.fd, F_SETFL, O_NONBLOCK);
    // Every fifth cycle kills at a random time from the start (possibly
    // while it opens and recovers); the others a random while after the
    // child reported the store open, reading acks as they come.
    const bool from_start = cycle % 5 == 4;
    const int64_t run_ns = (from_start ? rng() % 80 : 1 + rng() % 40) * 1'000'000;
    std::string partial;
    bool ready = false;
    const size_t acked_before = acked.size();
    const int64_t ready_limit = MonotonicNanos() + 20'000'000'000;
    while (!from_start && !ready && MonotonicNanos() < ready_limit) {
      pollfd p{child.fd, POLLIN, 0};
      poll(&p, 1, 5);
      ReadAcks(child.fd, &partial, &acked, &ready);
    }
    const int64_t until = MonotonicNanos() + run_ns;
    while (MonotonicNanos() < until) {
      pollfd p{child.fd, POLLIN, 0};
      poll(&p, 1, 2);
      ReadAcks(child.fd, &partial, &acked, &ready);
    }
    kill(child.pid, SIGKILL);
    int status = 0;
    ASSERT_EQ(waitpid(child.pid, &status, 0), child.pid);
    ASSERT_TRUE(WIFSIGNALED(status)) << "crash writer exited by itself with status "
                                     << WEXITSTATUS(status) << " in cycle " << cycle;
    ReadAcks(child.fd, &partial, &acked, &ready);  // acks written before the kill
    close(child.fd);
    if (acked.size() > acked_before) ++cycles_with_acks;

    auto store =
        KvStoreEngine::Open({.data_dir = dir.path(), .hot_capacity_bytes = 0, .lock_hot_memory = false});
    ASSERT_TRUE(store.ok()) << store.status();
    if (!(*store)->GetNamespace("crash").ok()) {
      ASSERT_TRUE(acked.empty());  // killed before it registered the namespace
      continue;
    }
    KvStoreEngine& kv = **store;
    const absl::Status cold = kv.TEST_CheckColdTier();
    ASSERT_TRUE(cold.ok()) << "cycle " << cycle << ": " << cold;
    // The child stores blocks in order, so nothing past the first block after
    // the last ack (the one it may have been writing) can exist.
    const uint64_t max_acked = acked.empty() ? 0 : *acked.rbegin();
    const uint64_t end = max_acked + 4;
    std::vector<BlockHash> prefix;
    std::vector<bool> hit(end + 1);
    for (uint64_t i = 0; i <= end; ++i) {
      const BlockHash h = TestHash(i);
      prefix.push_back(h);
      auto l = kv.Lookup("crash", std::span<const BlockHash>(&h, 1), {.take_lease = false});
      ASSERT_TRUE(l.ok()) << l.status();
      hit[i] = l->num_hits == 1;
    }
    int32_t leading = 0;
    while (leading <= static_cast<int32_t>(end) && hit[leading]) ++leading;
    auto whole = kv.Lookup("crash", prefix, {.take_lease = false});
    ASSERT_TRUE(whole.ok()) << whole.status();
    EXPECT_EQ(whole->num_hits, leading) << "cycle " << cycle;
    std::vector<uint8_t> out(kBlock);
    for (uint64_t i = 0; i <= end; ++i) {
      const bool was_acked = acked.contains(i);
      if (was_acked) {
        ASSERT_TRUE(hit[i]) << "acknowledged block " << i << " lost in cycle " << cycle;
      }
      if (!was_acked && i != max_acked + 1) {
        ASSERT_FALSE(hit[i]) << "block " << i << " was never written, cycle " << cycle;
      }
      std::fill(out.begin(), out.end(), 0);
      auto r = kv.ReadInto("crash", TestHash(i), out);
      ASSERT_TRUE(r.ok()) << r.status();
      if (hit[i]) {
        ASSERT_TRUE(r->ok()) << "block " << i << " is a Lookup hit but its Read is "
                             << MissReasonName(r->miss) << " (half there), cycle " << cycle;
        // Compare by CRC32C of the expected bytes (computed once per block).
        auto [it, fresh] = expected_crc.try_emplace(i, 0);
        if (fresh) it->second = Crc32c(TestPayload(i, kBlock));
        ASSERT_EQ(Crc32c(out), it->second) << "block " << i << " has wrong bytes, cycle " << cycle;
        ASSERT_EQ(r->checksum, it->second) << "block " << i << ", cycle " << cycle;
      } else {
        ASSERT_EQ(r->miss, MissReason::kNotFound)
            << "block " << i << " is a Lookup miss but its Read is "
            << (r->ok() ? "served" : MissReasonName(r->miss)) << ", cycle " << cycle;
      }
    }
    // Reads dropped nothing: the tiers still agree with the first scan.
    EXPECT_EQ(kv.GetStats().load_misses, end + 1 - std::count(hit.begin(), hit.end(), true))
        << "cycle " << cycle;
    EXPECT_EQ(kv.GetStats().checksum_failures, 0u) << "cycle " << cycle;
    next = acked.empty() ? 0 : max_acked + 1;
  }
  EXPECT_GT(acked.size(), min_acked);
  EXPECT_GT(cycles_with_acks, cycles / 2);
}

TEST(KvStoreCrashTest, AcknowledgedBlocksSurviveSigkillAndNothingIsHalfThere) {
  CrashCycles("", kCycles, 100);
}

// A wal store that finds its block stored with durability none (the memtable
// only, gone at a SIGKILL) writes it again before it is acknowledged.
TEST(KvStoreCrashTest, AWalStoreOfABlockStoredWithoutTheWalSurvivesSigkill) {
  CrashCycles("none-first", kCycles / 5, 20);
}

}  // namespace
}  // namespace tandem::kvstore
