// The KV-store's RocksDB records (private to libs/kvstore): key layout and
// the block metadata record, shared by the engine (kv_store.cc) and its
// start-up repair (kv_repair.cc).
#pragma once

#include <cstdint>
#include <cstring>
#include <functional>
#include <string>

#include "rocksdb/slice.h"
#include "tandem/common/block_hash.h"

namespace tandem::kvstore {

// RocksDB key space: 'n' + name -> namespace record ('N' + name: its copy); 'm' + ns id + hash ->
// block metadata (small, inline); 'b' + ns id + hash -> payload (blob file).
// Metadata and payload of a block are written in one batch.
constexpr char kBlockPrefix = 'b';
constexpr char kMetaPrefix = 'm';
constexpr char kNamespacePrefix = 'n';
// A second copy of each namespace record, at the other end of the key space
// (so in another table block): a damaged block that held the record would
// otherwise cost every block of the namespace (kv_repair.h).
constexpr char kNamespaceCopyPrefix = 'N';
constexpr uint32_t kMetaMagic = 0x3156'4b54;  // "TKV1"
constexpr size_t kMetaBytes = 24;

struct Key {
  uint32_t ns = 0;
  BlockHash hash;
  bool operator==(const Key&) const = default;
};
struct KeyHasher {
  size_t operator()(const Key& k) const noexcept {
    return std::hash<BlockHash>{}(k.hash) ^ (uint64_t{k.ns} * 0x9E3779B97F4A7C15ull);
  }
};

inline void PutU32(std::string* s, uint32_t v) { s->append(reinterpret_cast<const char*>(&v), 4); }
inline void PutU64(std::string* s, uint64_t v) { s->append(reinterpret_cast<const char*>(&v), 8); }
inline uint32_t GetU32(const char* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}
inline uint64_t GetU64(const char* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
}

inline std::string RocksKey(char prefix, const Key& k) {
  std::string s;
  s.reserve(37);
  s.push_back(prefix);
  for (int shift = 24; shift >= 0; shift -= 8) s.push_back(static_cast<char>(k.ns >> shift));
  s.append(reinterpret_cast<const char*>(k.hash.bytes.data()), k.hash.bytes.size());
  return s;
}
inline bool ParseRocksKey(const rocksdb::Slice& s, Key* k) {
  if (s.size() != 37) return false;
  const auto* p = reinterpret_cast<const uint8_t*>(s.data());
  k->ns = (uint32_t{p[1]} << 24) | (uint32_t{p[2]} << 16) | (uint32_t{p[3]} << 8) | p[4];
  std::memcpy(k->hash.bytes.data(), p + 5, 32);
  return true;
}

struct Meta {
  uint32_t checksum = 0;
  uint64_t size = 0;
  uint64_t seq = 0;
};
inline std::string EncodeMeta(const Meta& m) {
  std::string s;
  s.reserve(kMetaBytes);
  PutU32(&s, kMetaMagic);
  PutU32(&s, m.checksum);
  PutU64(&s, m.size);
  PutU64(&s, m.seq);
  return s;
}
inline bool DecodeMeta(const rocksdb::Slice& s, Meta* m) {
  if (s.size() != kMetaBytes || GetU32(s.data()) != kMetaMagic) return false;
  m->checksum = GetU32(s.data() + 4);
  m->size = GetU64(s.data() + 8);
  m->seq = GetU64(s.data() + 16);
  return true;
}


}  // namespace tandem::kvstore
