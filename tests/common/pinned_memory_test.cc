// tandem::PinnedBuffer: what it hands out is usable, says what it is, and
// moves without a double free (ASan checks the frees).
#include "tandem/common/pinned_memory.h"

#include <sys/stat.h>

#include <cstring>

#include "gtest/gtest.h"

namespace tandem {
namespace {

TEST(PinnedBufferTest, AllocatesWritableMemoryOfTheKindAsked) {
  // No GPU here (or none asked for): page-aligned host memory.
  auto unlocked = PinnedBuffer::Allocate(
      1 << 20, {.use_cuda_host_alloc = false, .lock = false, .what = "test"});
  ASSERT_TRUE(unlocked.ok()) << unlocked.status();
  EXPECT_EQ(unlocked->size(), size_t{1} << 20);
  EXPECT_EQ(unlocked->kind(), PinnedKind::kPageable);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(unlocked->data()) % 4096, 0u);
  std::memset(unlocked->data(), 0x5a, unlocked->size());
  EXPECT_EQ(unlocked->data()[unlocked->size() - 1], std::byte{0x5a});

  // Locked where RLIMIT_MEMLOCK allows; pageable (and still usable) where not.
  auto locked = PinnedBuffer::Allocate(
      64 << 10, {.use_cuda_host_alloc = false, .lock = true, .what = "test"});
  ASSERT_TRUE(locked.ok()) << locked.status();
  EXPECT_TRUE(locked->kind() == PinnedKind::kLocked || locked->kind() == PinnedKind::kPageable)
      << PinnedKindName(locked->kind());
  std::memset(locked->data(), 1, locked->size());
}

// A shareable buffer is backed when it is made, locked or not: another
// process that maps it and populates its page tables must find pages, not
// allocate them in its own memory cgroup.
TEST(PinnedBufferTest, ASharedBufferIsBackedWhenItIsMade) {
  constexpr size_t kBytes = 8 << 20;
  auto buf = PinnedBuffer::Allocate(
      kBytes, {.use_cuda_host_alloc = false, .lock = false, .what = "test", .shareable = true});
  ASSERT_TRUE(buf.ok()) << buf.status();
  ASSERT_GE(buf->fd(), 0);
  struct stat st{};
  ASSERT_EQ(fstat(buf->fd(), &st), 0);
  EXPECT_GE(static_cast<uint64_t>(st.st_blocks) * 512, kBytes) << "the memfd's pages exist";
}

TEST(PinnedBufferTest, EmptyAndMovedBuffersOwnNothing) {
  auto empty = PinnedBuffer::Allocate(0, {});
  ASSERT_TRUE(empty.ok());
  EXPECT_EQ(empty->data(), nullptr);
  EXPECT_EQ(empty->size(), 0u);

  auto a = PinnedBuffer::Allocate(8192, {.use_cuda_host_alloc = false});
  ASSERT_TRUE(a.ok());
  std::byte* const p = a->data();
  PinnedBuffer b = std::move(a).value();
  EXPECT_EQ(b.data(), p);
  PinnedBuffer c;
  c = std::move(b);
  EXPECT_EQ(c.data(), p);
  EXPECT_EQ(b.data(), nullptr);  // NOLINT(bugprone-use-after-move): the point
  EXPECT_EQ(b.size(), 0u);
}

}  // namespace
}  // namespace tandem
