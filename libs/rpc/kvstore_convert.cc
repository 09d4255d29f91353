#include "tandem/rpc/kvstore_convert.h"

#include <cstring>

#include "absl/strings/str_cat.h"

namespace tandem::rpc {

void ToProto(const kvstore::KvStoreStats& in, v1::StatsResponse* out) {
  out->set_hot_blocks(in.hot_blocks);
  out->set_hot_capacity_blocks(in.hot_capacity_blocks);
  out->set_hot_slot_bytes(in.hot_slot_bytes);
  out->set_cold_blocks(in.cold_blocks);
  out->set_cold_bytes(in.cold_bytes);
  out->set_cold_capacity_bytes(in.cold_capacity_bytes);
  out->set_lookups(in.lookups);
  out->set_lookup_hits(in.lookup_hits);
  out->set_loads(in.loads);
  out->set_blocks_loaded(in.blocks_loaded);
  out->set_load_misses(in.load_misses);
  out->set_stores(in.stores);
  out->set_stores_already_present(in.stores_already_present);
  out->set_stores_mismatched(in.stores_mismatched);
  out->set_stores_made_durable(in.stores_made_durable);
  out->set_checksum_failures(in.checksum_failures);
  out->set_corrupt_reports(in.corrupt_reports);
  out->set_blocks_dropped_at_open(in.blocks_dropped_at_open);
  out->set_load_failures(in.load_failures);
  out->set_active_leases(in.active_leases);
  out->set_leases_expired(in.leases_expired);
  out->set_evictions_hot(in.evictions_hot);
  out->set_evictions_cold(in.evictions_cold);
  out->set_promotions(in.promotions);
}

kvstore::KvStoreStats FromProto(const v1::StatsResponse& in) {
  return kvstore::KvStoreStats{
      .hot_blocks = in.hot_blocks(),
      .hot_capacity_blocks = in.hot_capacity_blocks(),
      .hot_slot_bytes = in.hot_slot_bytes(),
      .cold_blocks = in.cold_blocks(),
      .cold_bytes = in.cold_bytes(),
      .cold_capacity_bytes = in.cold_capacity_bytes(),
      .lookups = in.lookups(),
      .lookup_hits = in.lookup_hits(),
      .loads = in.loads(),
      .blocks_loaded = in.blocks_loaded(),
      .load_misses = in.load_misses(),
      .stores = in.stores(),
      .stores_already_present = in.stores_already_present(),
      .stores_mismatched = in.stores_mismatched(),
      .stores_made_durable = in.stores_made_durable(),
      .checksum_failures = in.checksum_failures(),
      .corrupt_reports = in.corrupt_reports(),
      .blocks_dropped_at_open = in.blocks_dropped_at_open(),
      .load_failures = in.load_failures(),
      .active_leases = in.active_leases(),
      .leases_expired = in.leases_expired(),
      .evictions_hot = in.evictions_hot(),
      .evictions_cold = in.evictions_cold(),
      .promotions = in.promotions(),
  };
}

void ToProto(const kvstore::NamespaceSpec& in, v1::NamespaceInfo* out) {
  out->set_name(in.name);
  out->set_block_bytes(in.block_bytes);
  out->set_layout(in.layout);
}

kvstore::NamespaceSpec FromProto(const v1::NamespaceInfo& in) {
  return kvstore::NamespaceSpec{
      .name = in.name(), .block_bytes = in.block_bytes(), .layout = in.layout()};
}

v1::MissReason ToProto(kvstore::MissReason in) {
  switch (in) {
    case kvstore::MissReason::kNone:
      return v1::MISS_REASON_UNSPECIFIED;
    case kvstore::MissReason::kNotFound:
      return v1::MISS_REASON_NOT_FOUND;
    case kvstore::MissReason::kChecksum:
      return v1::MISS_REASON_CHECKSUM;
  }
  return v1::MISS_REASON_UNSPECIFIED;
}

v1::Durability ToProto(std::optional<kvstore::Durability> in) {
  if (!in.has_value()) return v1::DURABILITY_SERVER_DEFAULT;
  switch (*in) {
    case kvstore::Durability::kNone:
      return v1::DURABILITY_NONE;
    case kvstore::Durability::kWal:
      return v1::DURABILITY_WAL;
    case kvstore::Durability::kFsync:
      return v1::DURABILITY_FSYNC;
    case kvstore::Durability::kMemory:
      return v1::DURABILITY_MEMORY;
  }
  return v1::DURABILITY_SERVER_DEFAULT;
}

absl::Status FromProto(v1::Durability in, std::optional<kvstore::Durability>* out) {
  switch (in) {
    case v1::DURABILITY_SERVER_DEFAULT:
      *out = std::nullopt;
      return absl::OkStatus();
    case v1::DURABILITY_NONE:
      *out = kvstore::Durability::kNone;
      return absl::OkStatus();
    case v1::DURABILITY_WAL:
      *out = kvstore::Durability::kWal;
      return absl::OkStatus();
    case v1::DURABILITY_FSYNC:
      *out = kvstore::Durability::kFsync;
      return absl::OkStatus();
    case v1::DURABILITY_MEMORY:
      *out = kvstore::Durability::kMemory;
      return absl::OkStatus();
    default:
      break;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("durability ", static_cast<int>(in), " is not a Durability value"));
}

absl::Status ParseBlockHashes(const google::protobuf::RepeatedPtrField<std::string>& in,
                              const char* field, std::vector<BlockHash>* out) {
  out->clear();
  out->reserve(in.size());
  for (int i = 0; i < in.size(); ++i) {
    const std::string& raw = in.Get(i);
    if (raw.size() != 32) {
      return absl::InvalidArgumentError(absl::StrCat(field, "[", i, "] has ", raw.size(),
                                                     " bytes; a block hash has 32"));
    }
    BlockHash h;
    std::memcpy(h.bytes.data(), raw.data(), 32);
    out->push_back(h);
  }
  return absl::OkStatus();
}

void AppendBlockHashes(std::span<const BlockHash> in,
                       google::protobuf::RepeatedPtrField<std::string>* out) {
  for (const BlockHash& h : in) {
    out->Add()->assign(reinterpret_cast<const char*>(h.bytes.data()), h.bytes.size());
  }
}

}  // namespace tandem::rpc
