// Strong integer ids: a BlockId cannot be passed where a StepId is expected.
#pragma once

#include <cstdint>
#include <functional>
#include <ostream>

namespace tandem {

template <typename Tag, typename T>
class StrongId {
 public:
  using ValueType = T;
  constexpr StrongId() = default;
  constexpr explicit StrongId(T value) : value_(value) {}
  [[nodiscard]] constexpr T value() const { return value_; }
  constexpr auto operator<=>(const StrongId&) const = default;
  template <typename H>
  friend H AbslHashValue(H h, StrongId id) {
    return H::combine(std::move(h), id.value_);
  }
  friend std::ostream& operator<<(std::ostream& os, StrongId id) {
    return os << id.value_;
  }

 private:
  T value_{};
};

// Index of a KV block in a worker's cache (and in the scheduler's BlockPool).
using BlockId = StrongId<struct BlockIdTag, int32_t>;
// Monotonic id of a scheduler step.
using StepId = StrongId<struct StepIdTag, uint64_t>;
// Lease on KV-store blocks.
using LeaseId = StrongId<struct LeaseIdTag, uint64_t>;

}  // namespace tandem

template <typename Tag, typename T>
struct std::hash<tandem::StrongId<Tag, T>> {
  size_t operator()(tandem::StrongId<Tag, T> id) const noexcept {
    return std::hash<T>{}(id.value());
  }
};
