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

// Fiber switches. On x86-64 a switch of the callee-saved registers and the
// stack pointer (the System V ABI's): swapcontext also saves the signal
// mask, a system call per switch, which was half of this test's time.
#if defined(__x86_64__)
extern "C" void tandem_simt_switch(void** save_sp, void* load_sp);
asm(R"(
  .text
  .globl tandem_simt_switch
  .type tandem_simt_switch, @function
tandem_simt_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size tandem_simt_switch, .-tandem_simt_switch
)");
struct Context {
  void* sp = nullptr;
};
void StartContext(Context& c, char* stack, size_t bytes, void (*entry)()) {
  // As if tandem_simt_switch had saved six registers and would return into
  // entry, whose own return address (never used) sits 16-byte aligned.
  auto top = reinterpret_cast<uintptr_t>(stack + bytes) & ~uintptr_t{15};
  auto* words = reinterpret_cast<void**>(top);
  words[-1] = nullptr;
  words[-2] = reinterpret_cast<void*>(entry);
  for (int i = 3; i <= 8; ++i) words[-i] = nullptr;
  c.sp = &words[-8];
}
void Switch(Context& from, Context& to) { tandem_simt_switch(&from.sp, to.sp); }
#else
struct Context {
  ucontext_t uc;
};
void StartContext(Context& c, char* stack, size_t bytes, void (*entry)()) {
  getcontext(&c.uc);
  c.uc.uc_stack.ss_sp = stack;
  c.uc.uc_stack.ss_size = bytes;
  c.uc.uc_link = nullptr;
  makecontext(&c.uc, entry, 0);
}
void Switch(Context& from, Context& to) { swapcontext(&from.uc, &to.uc); }
#endif

// A cp.async in flight: copied when its group is waited for.
struct PendingCopy {
  void* dst;
  const void* src;
  int bytes;
};

struct Fiber {
  Context context;
  bool done = false;
  // cp.async groups in flight, oldest first (the last one still open).
  std::vector<std::vector<PendingCopy>> copy_groups;
  // While *waiting == waiting_at, the fiber waits at a barrier: the
  // scheduler does not resume it.
  const uint64_t* waiting = nullptr;
  uint64_t waiting_at = 0;
};

struct Block {
  std::vector<Fiber> fibers;
  Context scheduler;
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
  // Arrivals and exits: a pass over the fibers with none is a deadlock (a
  // barrier or collective that not every thread reaches).
  uint64_t events = 0;
};

Block* block = nullptr;
Schedule schedule;

void Land(const PendingCopy& c) {
  std::memset(c.dst, 0, 16);
  std::memcpy(c.dst, c.src, static_cast<size_t>(c.bytes));
}

// The fibers' stacks, kept from launch to launch.
std::vector<std::unique_ptr<char[]>>& Stacks(size_t n) {
  static std::vector<std::unique_ptr<char[]>> stacks;
  while (stacks.size() < n) stacks.push_back(std::make_unique<char[]>(kStackBytes));
  return stacks;
}

// Suspends the running fiber until *generation moves past `at`.
void WaitFor(const uint64_t* generation, uint64_t at) {
  Fiber& f = block->fibers[block->current];
  f.waiting = generation;
  f.waiting_at = at;
  Switch(f.context, block->scheduler);
  f.waiting = nullptr;
}

void Entry() {
  (*block->kernel)();
  Fiber& f = block->fibers[block->current];
  for (const auto& group : f.copy_groups) {
    for (const PendingCopy& c : group) Land(c);
  }
  f.copy_groups.clear();
  f.done = true;
  --block->live;
  ++block->events;
  Switch(f.context, block->scheduler);  // never resumed
  std::abort();
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
  WaitFor(&block->warp_generation[w], gen);
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
  auto& stacks = Stacks(static_cast<size_t>(threads));
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
      for (int t = 0; t < threads; ++t) {
        StartContext(b.fibers[t].context, stacks[t].get(), kStackBytes, Entry);
      }
      auto runnable = [&](int t) {
        const Fiber& f = b.fibers[t];
        return !f.done && (f.waiting == nullptr || *f.waiting != f.waiting_at);
      };
      auto resume = [&](int t) {
        b.current = t;
        thread_idx = Dim3{static_cast<unsigned>(t), 0, 0};
        Switch(b.scheduler, b.fibers[t].context);
      };
      auto order = [&](int i, int n) { return schedule.reverse ? n - 1 - i : i; };
      while (b.live > 0) {
        const uint64_t events = b.events;
        if (schedule.warps_run_ahead) {
          for (int wi = 0; wi < warps; ++wi) {
            const int w = order(wi, warps);
            for (bool ran = true; ran;) {  // until the warp's threads all wait at a barrier
              ran = false;
              for (int l = 0; l < 32; ++l) {
                const int t = 32 * w + order(l, 32);
                if (runnable(t)) {
                  resume(t);
                  ran = true;
                }
              }
            }
          }
        } else {
          for (int i = 0; i < threads; ++i) {
            const int t = order(i, threads);
            if (runnable(t)) resume(t);
          }
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

void SetSchedule(Schedule s) { schedule = s; }

void CpAsync(void* dst, const void* src, int bytes) {
  const PendingCopy c{dst, src, bytes};
  if (!schedule.copies_at_wait) {
    Land(c);
    return;
  }
  auto& groups = block->fibers[block->current].copy_groups;
  if (groups.empty()) groups.emplace_back();
  groups.back().push_back(c);
}

void CpAsyncCommit() {
  auto& groups = block->fibers[block->current].copy_groups;
  if (groups.empty()) groups.emplace_back();  // an empty group counts too
  groups.emplace_back();                      // the next copies' group
}

void CpAsyncWait(int n) {
  // Committed groups are all but the open last one; all but the newest n
  // of them land.
  auto& groups = block->fibers[block->current].copy_groups;
  const int committed = groups.empty() ? 0 : static_cast<int>(groups.size()) - 1;
  const int land = committed - n;
  for (int i = 0; i < land; ++i) {
    for (const PendingCopy& c : groups[i]) Land(c);
  }
  if (land > 0) groups.erase(groups.begin(), groups.begin() + land);
}

void SyncThreads() {
  const uint64_t gen = block->generation;
  ++block->events;
  if (++block->arrived == block->live) {
    block->arrived = 0;
    ++block->generation;
    return;
  }
  WaitFor(&block->generation, gen);
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
