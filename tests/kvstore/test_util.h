// Helpers shared by the KV-store engine tests.
#pragma once

#include <stdlib.h>

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "../wait_for.h"
#include "tandem/common/block_hash.h"
#include "tandem/kvtypes/checksum.h"

namespace tandem::kvstore::testing {

// A fresh directory under $TEST_TMPDIR (or /tmp), removed by the destructor.
class TempDir {
 public:
  TempDir() {
    const char* base = getenv("TEST_TMPDIR");
    std::string tmpl = std::string(base ? base : "/tmp") + "/tandem_kvstore_XXXXXX";
    path_ = mkdtemp(tmpl.data());
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  [[nodiscard]] const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// A distinct hash per (i, tag).
inline BlockHash TestHash(uint64_t i, uint8_t tag = 0) {
  BlockHash h;
  for (int b = 0; b < 8; ++b) h.bytes[b] = static_cast<uint8_t>(i >> (8 * b));
  h.bytes[8] = tag;
  for (int b = 9; b < 32; ++b) h.bytes[b] = static_cast<uint8_t>(b * 37 + i * 11 + tag);
  return h;
}

// Deterministic payload of `size` bytes for block `i` (a 64-bit LCG stream).
inline std::vector<uint8_t> TestPayload(uint64_t i, size_t size, uint8_t tag = 0) {
  std::vector<uint8_t> out(size);
  uint64_t x = (i + 1) * 0x9E3779B97F4A7C15ull + tag;
  for (size_t k = 0; k < size; ++k) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    out[k] = static_cast<uint8_t>(x >> 56);
  }
  return out;
}

inline uint32_t Crc(const std::vector<uint8_t>& v) { return Crc32c(v); }

using tandem::testing::WaitFor;  // ../wait_for.h

}  // namespace tandem::kvstore::testing
