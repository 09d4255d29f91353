// The KV-store client's LoadResponse reader (libs/kvconnector/
// kvstore_client_wire.h) on arbitrary bytes, split into slices where the
// first byte says: an error or chunks whose payload references lie inside
// the message, never a crash or a read out of bounds. Each payload is
// copied and checksummed as the client does.
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "kvstore_client_wire.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tandem::kvconnector::wire;
  if (size == 0) return 0;
  // Byte 0: the slice length (gRPC hands a message over in slices).
  const size_t piece = 1 + data[0];
  std::vector<std::vector<uint8_t>> owned;  // each slice its own allocation, for ASan
  for (size_t pos = 1; pos < size; pos += piece) {
    owned.emplace_back(data + pos, data + std::min(size, pos + piece));
  }
  std::vector<std::span<const uint8_t>> slices(owned.begin(), owned.end());
  std::vector<LoadChunkView> chunks;
  if (!ParseLoadResponse(slices, &chunks).ok()) return 0;
  for (const LoadChunkView& c : chunks) {
    std::vector<uint8_t> dst(c.data.size);
    uint32_t crc = 0;
    CopyLoadPayload(slices, c.data, dst.data(), &crc);
  }
  return 0;
}
