// Helper of kvstore_crash_test: stores blocks START, START+1, ... forever in
// `wal` mode and writes "<index>\n" to stdout (unbuffered write(2)) after each
// store is acknowledged, after an "R" line once the store is open. The test
// SIGKILLs it at random points. With `none-first`, each block is first stored
// with durability none (the memtable only) and the ack follows its second
// store, with wal, which finds it present.
//
//   kvstore_crash_writer DATA_DIR START BLOCK_BYTES [none-first]
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "tandem/common/block_hash.h"
#include "tandem/kvtypes/checksum.h"
#include "tandem/kvstore/kv_store.h"
#include "test_util.h"

int main(int argc, char** argv) {
  using namespace tandem::kvstore;
  const bool none_first = argc == 5 && std::string(argv[4]) == "none-first";
  if (argc != 4 && !none_first) {
    std::fprintf(stderr, "usage: %s DATA_DIR START BLOCK_BYTES [none-first]\n", argv[0]);
    return 2;
  }
  const uint64_t start = std::strtoull(argv[2], nullptr, 10);
  const uint64_t block = std::strtoull(argv[3], nullptr, 10);
  auto store = KvStoreEngine::Open({.data_dir = argv[1],
                              .hot_capacity_bytes = 0,
                              .durability = Durability::kWal,
                              .lock_hot_memory = false});
  if (!store.ok()) {
    std::fprintf(stderr, "open: %s\n", store.status().ToString().c_str());
    return 1;
  }
  if (auto s = (*store)->CreateNamespace({.name = "crash", .block_bytes = block}); !s.ok()) {
    std::fprintf(stderr, "namespace: %s\n", s.status().ToString().c_str());
    return 1;
  }
  if (write(STDOUT_FILENO, "R\n", 2) != 2) return 1;  // open and ready to store
  for (uint64_t i = start;; ++i) {
    auto p = testing::TestPayload(i, block);
    if (none_first) {
      auto r = (*store)->Store("crash", testing::TestHash(i), p, Crc32c(p), Durability::kNone);
      if (!r.ok()) {
        std::fprintf(stderr, "store %llu with durability none: %s\n",
                     static_cast<unsigned long long>(i), r.status().ToString().c_str());
        return 1;
      }
    }
    auto r = (*store)->Store("crash", testing::TestHash(i), p, Crc32c(p));
    if (!r.ok()) {
      std::fprintf(stderr, "store %llu: %s\n", static_cast<unsigned long long>(i),
                   r.status().ToString().c_str());
      return 1;
    }
    const std::string line = std::to_string(i) + "\n";
    if (write(STDOUT_FILENO, line.data(), line.size()) != static_cast<ssize_t>(line.size())) {
      return 1;
    }
  }
}
