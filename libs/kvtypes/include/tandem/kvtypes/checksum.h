// CRC32C (Castagnoli), the checksum every KV-store block carries. Uses
// carry-less multiplication folding (AVX-512 VPCLMULQDQ, else 128-bit
// PCLMULQDQ) for long inputs when the CPU has it, the SSE4.2 crc32
// instruction otherwise, a table without either; all give the same value.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace tandem::kvstore {

// Extends `crc` (0 for a fresh checksum) over `data`.
[[nodiscard]] uint32_t Crc32cExtend(uint32_t crc, const uint8_t* data, size_t n);

[[nodiscard]] inline uint32_t Crc32c(std::span<const uint8_t> data) {
  return Crc32cExtend(0, data.data(), data.size());
}

// Copies n bytes from src to dst (which do not overlap) and extends `crc`
// over them in the same pass: with the 128-bit fold each 64 bytes are folded
// from the registers that copy them; otherwise a 256 KiB piece is copied and
// then checksummed while it is still in cache.
uint32_t Crc32cCopy(uint32_t crc, uint8_t* dst, const uint8_t* src, size_t n);

// The CRC32C of A followed by B from crc1 = CRC32C(A), crc2 = CRC32C(B) and
// len2 = |B|, in O(log len2) multiplications.
[[nodiscard]] uint32_t Crc32cCombine(uint32_t crc1, uint32_t crc2, size_t len2);

// Every implementation this CPU can run (the table one always), so tests
// check each, not only the one Crc32cExtend picks here: CI machines may
// lack the instructions this one has.
struct Crc32cImplementation {
  const char* name;
  uint32_t (*extend)(uint32_t crc, const uint8_t* data, size_t n);
  uint32_t (*copy)(uint32_t crc, uint8_t* dst, const uint8_t* src, size_t n);  // Crc32cCopy's
};
[[nodiscard]] std::vector<Crc32cImplementation> Crc32cImplementationsForTest();

}  // namespace tandem::kvstore
