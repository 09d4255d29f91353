// bench_kvstore_engine: the KV-store engine's stores from several threads at
// once, in process (no RPC): what one RocksDB write at a time (WriteToRocks'
// write_mu_, which gives up RocksDB's group commit so that no write reaches
// a WAL writer that failed) costs concurrent writers; and, from one thread,
// what a store of a 64 KiB and of a 2 MiB block costs the engine. WAL
// durability (the default) and fsync, no hot tier. And Crc32cCopy (how
// local loads and stores move a block) in each implementation this CPU
// runs, beside memcpy alone.
//
//   build/tools/bench_kvstore/bench_kvstore_engine [--benchmark_min_time=2]
#include <stdlib.h>

#include <atomic>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "benchmark/benchmark.h"
#include "tandem/common/logging.h"
#include "tandem/kvstore/kv_store.h"
#include "tandem/kvtypes/checksum.h"

namespace tandem::kvstore {
namespace {

std::unique_ptr<KvStoreEngine> g_store;
std::string g_dir;
std::atomic<uint64_t> g_next{0};

void BM_ConcurrentStore(benchmark::State& state) {
  const auto durability = static_cast<Durability>(state.range(0));
  const uint64_t block_bytes = static_cast<uint64_t>(state.range(1));
  if (state.thread_index() == 0) {
    char tmpl[] = "/tmp/bench_kvstore_engine_XXXXXX";
    g_dir = mkdtemp(tmpl);
    // Durability memory keeps blocks in the hot tier only: 128 slots of the
    // block's size (LRU, so the run may store more); the others none.
    const bool memory = durability == Durability::kMemory;
    auto opened = KvStoreEngine::Open({.data_dir = g_dir,
                                       .hot_capacity_bytes = memory ? 128 * block_bytes : 0,
                                       .hot_slot_bytes = block_bytes,
                                       .lock_hot_memory = false});
    TANDEM_CHECK(opened.ok()) << opened.status();
    g_store = std::move(*opened);
    TANDEM_CHECK(g_store->CreateNamespace({.name = "b", .block_bytes = block_bytes}).ok());
  }
  std::vector<uint8_t> payload(block_bytes);
  for (auto _ : state) {
    const uint64_t i = g_next.fetch_add(1);
    std::memcpy(payload.data(), &i, sizeof i);  // a distinct block per store
    BlockHash h;
    std::memcpy(h.bytes.data(), &i, sizeof i);
    auto r = g_store->Store("b", h, payload, Crc32c(payload), durability);
    if (!r.ok()) state.SkipWithError(r.status().ToString().c_str());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * block_bytes));
  if (state.thread_index() == 0) {
    g_store.reset();
    std::filesystem::remove_all(g_dir);
  }
}
BENCHMARK(BM_ConcurrentStore)
    ->ArgNames({"durability", "block_bytes"})
    ->Args({static_cast<int>(Durability::kWal), 64 << 10})
    ->Args({static_cast<int>(Durability::kFsync), 64 << 10})
    ->Args({static_cast<int>(Durability::kMemory), 64 << 10})
    ->ThreadRange(1, 8)
    ->UseRealTime();
BENCHMARK(BM_ConcurrentStore)
    ->ArgNames({"durability", "block_bytes"})
    ->Args({static_cast<int>(Durability::kWal), 2 << 20})
    ->Args({static_cast<int>(Durability::kNone), 2 << 20})
    ->Args({static_cast<int>(Durability::kMemory), 2 << 20})
    ->UseRealTime();

// A copy that checksums what it copies, each implementation of it (the label
// names it; "pclmulqdq" is fused with the fold, the others copy a 256 KiB
// piece and then checksum it), against memcpy alone (impl -1; a copy that
// checks nothing). Blocks come from a 256 MiB source in turn, so from memory
// as from the hot tier, into one destination of a block's size.
void BM_Crc32cCopy(benchmark::State& state) {
  const std::vector<Crc32cImplementation> impls = Crc32cImplementationsForTest();
  const auto which = static_cast<int>(state.range(0));
  const auto block = static_cast<size_t>(state.range(1));
  if (which >= static_cast<int>(impls.size())) {
    state.SkipWithError("no such implementation on this CPU");
    return;
  }
  static const std::vector<uint8_t> src = [] {
    std::vector<uint8_t> v(256 << 20);
    for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<uint8_t>(i * 2654435761u >> 13);
    return v;
  }();
  std::vector<uint8_t> dst(block, 0);
  size_t off = 0;
  uint32_t crc = 0;
  for (auto _ : state) {
    if (which < 0) {
      std::memcpy(dst.data(), src.data() + off, block);
    } else {
      crc ^= impls[which].copy(0, dst.data(), src.data() + off, block);
    }
    benchmark::DoNotOptimize(dst.data());
    off = off + 2 * block > src.size() ? 0 : off + block;
  }
  benchmark::DoNotOptimize(crc);
  state.SetLabel(which < 0 ? "memcpy alone" : impls[which].name);
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * block));
}
BENCHMARK(BM_Crc32cCopy)
    ->ArgNames({"impl", "block_bytes"})
    ->ArgsProduct({{-1, 1, 2, 3, 4}, {64 << 10, 2 << 20}});

}  // namespace
}  // namespace tandem::kvstore

int main(int argc, char** argv) {
  tandem::SetMinLogLevel(tandem::LogLevel::kWarning);
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  return 0;
}
