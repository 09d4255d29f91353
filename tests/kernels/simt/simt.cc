#include "simt.h"

#include <ucontext.h>

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <stdexcept>
#include <vector>

namespace tandem::simt {

Dim3 thread_idx, block_idx, block_dim, grid_dim;

namespace {

constexpr size_t kStackBytes = 256 * 1024;
constexpr size_t kSlotBytes = 64;  // a lane's operands in a warp collective

struct Fiber {
  ucontext_t context;
  std::unique_ptr<char[]> stack;
  bool done = false;
};

struct Block {
  std::vector<Fiber> fibers;
  ucontext_t scheduler;
  int current = 0;
  int live = 0;
  // __syncthreads: arrivals and generation.
  int arrived = 0;
  uint64_t generation = 0;
  // Warp collectives: per warp, each lane's operands, arrivals and generation.
  std::vector<unsigned char> slots;
  std::vector<int> warp_arrived;
  std::vector<uint64_t> warp_generation;
  const std::function<void()>* kernel = nullptr;
  std::vector<unsigned char> shared;
  // Arrivals, releases and exits: a pass over the fibers with none is a
  // deadlock (a barrier or collective that not every thread reaches).
  uint64_t events = 0;
};

Block* block = nullptr;

void Yield() { swapcontext(&block->fibers[block->current].context, &block->scheduler); }

void Trampoline() {
  (*block->kernel)();
  block->fibers[block->current].done = true;
  --block->live;
  ++block->events;
  // Back to the scheduler, never to return here.
  swapcontext(&block->fibers[block->current].context, &block->scheduler);
}

int Lane() { return static_cast<int>(thread_idx.x % 32); }
int Warp() { return static_cast<int>(thread_idx.x / 32); }

// Waits until every lane of the warp has arrived.
void WarpBarrier() {
  const int w = Warp();
  const uint64_t gen = block->warp_generation[w];
  ++block->events;
  if (++block->warp_arrived[w] == 32) {
    block->warp_arrived[w] = 0;
    ++block->warp_generation[w];
    return;
  }
  while (block->warp_generation[w] == gen) Yield();
}

unsigned char* Slot(int lane) {
  return block->slots.data() + (static_cast<size_t>(Warp()) * 32 + lane) * kSlotBytes;
}

// Puts this lane's operands in its slot and waits for the warp's; Release
// lets the slots be written again once every lane has read what it needs.
template <typename T>
void Deposit(const T& value) {
  static_assert(sizeof(T) <= kSlotBytes);
  std::memcpy(Slot(Lane()), &value, sizeof(T));
  WarpBarrier();
}
template <typename T>
T Read(int lane) {
  T value;
  std::memcpy(&value, Slot(lane), sizeof(T));
  return value;
}
void Release() { WarpBarrier(); }

float Bf16ToFloat(uint16_t h) {
  const uint32_t u = uint32_t{h} << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}
uint16_t Half(uint32_t pair, int hi) {
  return static_cast<uint16_t>(hi ? pair >> 16 : pair & 0xffff);
}

}  // namespace

unsigned char* DynamicShared() { return block->shared.data(); }

void Launch(Dim3 grid, Dim3 block_shape, size_t dynamic_shared,
            const std::function<void()>& kernel) {
  if (block_shape.x % 32 != 0 || block_shape.y != 1 || block_shape.z != 1) {
    throw std::invalid_argument("simt::Launch takes 1-D blocks of whole warps");
  }
  const int threads = static_cast<int>(block_shape.x), warps = threads / 32;
  grid_dim = grid;
  block_dim = block_shape;
  for (unsigned by = 0; by < grid.y; ++by) {
    for (unsigned bx = 0; bx < grid.x; ++bx) {
      Block b;
      b.fibers.resize(static_cast<size_t>(threads));
      b.live = threads;
      b.slots.assign(static_cast<size_t>(threads) * kSlotBytes, 0);
      b.warp_arrived.assign(static_cast<size_t>(warps), 0);
      b.warp_generation.assign(static_cast<size_t>(warps), 0);
      b.kernel = &kernel;
      b.shared.assign(dynamic_shared, 0);
      block = &b;
      block_idx = Dim3{bx, by, 0};
      for (Fiber& f : b.fibers) {
        f.stack = std::make_unique<char[]>(kStackBytes);
        getcontext(&f.context);
        f.context.uc_stack.ss_sp = f.stack.get();
        f.context.uc_stack.ss_size = kStackBytes;
        f.context.uc_link = nullptr;
        makecontext(&f.context, Trampoline, 0);
      }
      while (b.live > 0) {
        const uint64_t events = b.events;
        for (int t = 0; t < threads; ++t) {
          if (b.fibers[t].done) continue;
          b.current = t;
          thread_idx = Dim3{static_cast<unsigned>(t), 0, 0};
          swapcontext(&b.scheduler, &b.fibers[t].context);
        }
        if (b.live > 0 && b.events == events) {
          std::fprintf(stderr,
                       "simt: deadlock in block (%u, %u): a barrier or warp collective "
                       "that not every thread reaches\n",
                       bx, by);
          std::abort();
        }
      }
      block = nullptr;
    }
  }
}

void SyncThreads() {
  const uint64_t gen = block->generation;
  ++block->events;
  if (++block->arrived == block->live) {
    block->arrived = 0;
    ++block->generation;
    return;
  }
  while (block->generation == gen) Yield();
}

float ShflXor(float v, int lane_mask) {
  Deposit(v);
  const float r = Read<float>(Lane() ^ lane_mask);
  Release();
  return r;
}

int32_t ShflXor(int32_t v, int lane_mask) {
  Deposit(v);
  const int32_t r = Read<int32_t>(Lane() ^ lane_mask);
  Release();
  return r;
}

bool AllLanes(bool predicate) {
  Deposit(predicate);
  bool all = true;
  for (int l = 0; l < 32; ++l) all = all && Read<bool>(l);
  Release();
  return all;
}

// PTX ISA, mma.m16n8k16 with .bf16: lane 4g + t holds A's (row, col) pairs
// in a[0] (g, 2t|2t+1), a[1] (g+8, ..), a[2] (g, 2t+8|2t+9), a[3] (g+8, ..);
// B's (k, n) in b0 (2t|2t+1, g), b1 (2t+8|2t+9, g); C/D's in d[0], d[1]
// (g, 2t|2t+1) and d[2], d[3] (g+8, ..). Lower index in the low half.
void Mma16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  struct Operands {
    uint32_t a[4], b[2];
  };
  Deposit(Operands{{a[0], a[1], a[2], a[3]}, {b0, b1}});
  Operands lanes[32];
  for (int l = 0; l < 32; ++l) lanes[l] = Read<Operands>(l);
  Release();
  auto a_at = [&](int row, int k) {
    return Bf16ToFloat(
        Half(lanes[(row % 8) * 4 + (k % 8) / 2].a[(row >= 8 ? 1 : 0) + (k >= 8 ? 2 : 0)], k % 2));
  };
  auto b_at = [&](int k, int n) {
    return Bf16ToFloat(Half(lanes[n * 4 + (k % 8) / 2].b[k >= 8 ? 1 : 0], k % 2));
  };
  const int g = Lane() / 4, t = Lane() % 4;
  for (int i = 0; i < 4; ++i) {
    const int row = g + (i >= 2 ? 8 : 0), col = 2 * t + (i % 2);
    float sum = d[i];
    for (int k = 0; k < 16; ++k) sum += a_at(row, k) * b_at(k, col);
    d[i] = sum;
  }
}

// ldmatrix.sync.aligned.m8n8.x4(.trans).b16: lane 8i + r gives the address
// of row r of matrix i (8 b16 each); out[i] is this lane's fragment of
// matrix i: row lane / 4, columns 2 (lane % 4) and + 1, or with .trans,
// column lane / 4, rows 2 (lane % 4) and + 1.
void LdMatrixX4(uint32_t (&out)[4], const void* row, bool trans) {
  Deposit(row);
  const int lane = Lane();
  for (int i = 0; i < 4; ++i) {
    uint16_t v[2];
    for (int j = 0; j < 2; ++j) {
      const int r = trans ? 2 * (lane % 4) + j : lane / 4;
      const int c = trans ? lane / 4 : 2 * (lane % 4) + j;
      const auto* p = static_cast<const uint16_t*>(Read<const void*>(8 * i + r));
      v[j] = p[c];
    }
    out[i] = uint32_t{v[0]} | uint32_t{v[1]} << 16;
  }
  Release();
}

}  // namespace tandem::simt
