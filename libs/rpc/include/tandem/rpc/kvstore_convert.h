// Conversion between the KV-store engine's plain structs (libs/kvstore) and
// the tandem.v1 KvStore protos. Used by the tandem-kvstore service and the
// KV-store client in libs/kvconnector.
#pragma once

#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "google/protobuf/repeated_field.h"
#include "tandem/common/block_hash.h"
#include "tandem/common/ids.h"
#include "tandem/kvtypes/kv_types.h"
#include "tandem/v1/kvstore.pb.h"

namespace tandem::rpc {

void ToProto(const kvstore::KvStoreStats& in, v1::StatsResponse* out);
[[nodiscard]] kvstore::KvStoreStats FromProto(const v1::StatsResponse& in);

void ToProto(const kvstore::NamespaceSpec& in, v1::NamespaceInfo* out);
[[nodiscard]] kvstore::NamespaceSpec FromProto(const v1::NamespaceInfo& in);

[[nodiscard]] v1::MissReason ToProto(kvstore::MissReason in);

// DURABILITY_SERVER_DEFAULT <-> nullopt.
[[nodiscard]] v1::Durability ToProto(std::optional<kvstore::Durability> in);
// INVALID_ARGUMENT for a value outside the enum.
[[nodiscard]] absl::Status FromProto(v1::Durability in,
                                     std::optional<kvstore::Durability>* out);

// Parses repeated 32-byte hashes. INVALID_ARGUMENT naming the field and the
// first bad index, e.g. "block_hashes[3] has 31 bytes; a block hash has 32".
[[nodiscard]] absl::Status ParseBlockHashes(
    const google::protobuf::RepeatedPtrField<std::string>& in, const char* field,
    std::vector<BlockHash>* out);
void AppendBlockHashes(std::span<const BlockHash> in,
                       google::protobuf::RepeatedPtrField<std::string>* out);

}  // namespace tandem::rpc
