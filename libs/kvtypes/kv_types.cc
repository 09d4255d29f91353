#include "tandem/kvtypes/kv_types.h"

#include "absl/strings/str_cat.h"

namespace tandem::kvstore {

absl::StatusOr<Durability> ParseDurability(std::string_view name) {
  if (name == "none") return Durability::kNone;
  if (name == "wal") return Durability::kWal;
  if (name == "fsync") return Durability::kFsync;
  if (name == "memory") return Durability::kMemory;
  return absl::InvalidArgumentError(
      absl::StrCat("durability '", std::string(name), "' is not one of none, wal, fsync, memory"));
}

const char* DurabilityName(Durability d) {
  switch (d) {
    case Durability::kNone:
      return "none";
    case Durability::kWal:
      return "wal";
    case Durability::kFsync:
      return "fsync";
    case Durability::kMemory:
      return "memory";
  }
  return "?";
}

const char* MissReasonName(MissReason r) {
  switch (r) {
    case MissReason::kNone:
      return "none";
    case MissReason::kNotFound:
      return "not_found";
    case MissReason::kChecksum:
      return "checksum";
  }
  return "?";
}

absl::Status NamespaceSpec::Validate() const {
  if (name.empty() || name.size() > 128) {
    return absl::InvalidArgumentError(
        absl::StrCat("namespace name must have 1 to 128 bytes, has ", name.size()));
  }
  if (block_bytes == 0 || block_bytes > (uint64_t{1} << 30)) {
    return absl::InvalidArgumentError(
        absl::StrCat("namespace '", name, "': block_bytes ", block_bytes, " is not in [1, 1 GiB]"));
  }
  if (layout.size() > 1024) {
    return absl::InvalidArgumentError(
        absl::StrCat("namespace '", name, "': layout has ", layout.size(), " bytes (max 1024)"));
  }
  return absl::OkStatus();
}

}  // namespace tandem::kvstore
