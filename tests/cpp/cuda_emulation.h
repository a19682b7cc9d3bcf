// Host emulation of the CUDA built-ins the sparsejit kernels use, so that the generated CUDA
// sources (codegen/cuda_spec.cpp) can be compiled by the host compiler and run on CPU threads
// in tests, on machines without a GPU. Not a general CUDA emulator: one std::thread per CUDA
// thread of a block, blocks one after another, shuffles through a per-warp exchange with a
// barrier over the lanes named in the mask, __syncthreads (and __syncthreads_or) as a block
// barrier, atomics under a mutex, __shared__ as function-static storage (valid because blocks
// run one at a time).
//
// Usage (test_cuda_emulated.cpp): the test writes `#include "tests/cpp/cuda_emulation.h"`, the
// generated source, and one `sj_emulate_launch_<entry>` wrapper per entry point into a file,
// compiles it as a shared library and calls the wrappers.
#pragma once

#include <cmath>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#define SJ_HOST_EMULATION 1
#define __device__
#define __global__
#define __forceinline__ inline
#define __restrict__ __restrict
#define __launch_bounds__(n)
#define __shared__ static

struct sj_dim3 {
  unsigned x = 0, y = 0, z = 0;
};
inline thread_local sj_dim3 threadIdx;
inline thread_local sj_dim3 blockIdx;

// ---- Scalars ---------------------------------------------------------------------------------
inline float __uint_as_float(unsigned u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline float __int_as_float(int u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline unsigned __float_as_uint(float f) {
  unsigned u;
  std::memcpy(&u, &f, 4);
  return u;
}

inline float sj_emu_half_to_float(uint16_t h) {
  uint32_t sign = uint32_t(h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, man = h & 0x3ffu, bits;
  if (exp == 0) {
    if (man == 0) {
      bits = sign;
    } else {  // subnormal: normalise
      int e = -1;
      do {
        ++e;
        man <<= 1;
      } while ((man & 0x400u) == 0);
      bits = sign | (uint32_t(127 - 15 - e) << 23) | ((man & 0x3ffu) << 13);
    }
  } else if (exp == 31) {
    bits = sign | 0x7f800000u | (man << 13);
  } else {
    bits = sign | ((exp + 112u) << 23) | (man << 13);
  }
  return __uint_as_float(bits);
}

// Round to nearest even, as cvt.rn.f16.f32.
inline uint16_t sj_emu_float_to_half(float f) {
  const uint32_t x = __float_as_uint(f);
  const uint16_t sign = uint16_t((x >> 16) & 0x8000u);
  const uint32_t ax = x & 0x7fffffffu;
  if (ax >= 0x7f800000u) return sign | (ax > 0x7f800000u ? 0x7e00 : 0x7c00);
  if (ax >= 0x477ff000u) return sign | 0x7c00;  // rounds to infinity
  if (ax < 0x38800000u) {                       // below the smallest normal half
    return sign | uint16_t(std::nearbyint(__uint_as_float(ax) * 16777216.0f));
  }
  const uint32_t r = ax + 0xfffu + ((ax >> 13) & 1u) - (112u << 23);
  return sign | uint16_t(r >> 13);
}

// ---- Threads ---------------------------------------------------------------------------------
namespace sj_emu {

class Barrier {
 public:
  explicit Barrier(int n) : n_(n) {}
  void wait() {
    std::unique_lock<std::mutex> l(m_);
    const long gen = gen_;
    if (++arrived_ == n_) {
      arrived_ = 0;
      ++gen_;
      cv_.notify_all();
    } else {
      cv_.wait(l, [&] { return gen_ != gen; });
    }
  }

 private:
  std::mutex m_;
  std::condition_variable cv_;
  int n_, arrived_ = 0;
  long gen_ = 0;
};

struct Warp {
  std::mutex m;
  std::map<unsigned, std::unique_ptr<Barrier>> barriers;  // by participant mask
  unsigned long long slots[32] = {};
  Barrier& barrier(unsigned mask) {
    std::lock_guard<std::mutex> g(m);
    auto& b = barriers[mask];
    if (!b) b = std::make_unique<Barrier>(__builtin_popcount(mask));
    return *b;
  }
};

struct Block {
  std::unique_ptr<Barrier> sync;
  std::atomic<int> any[2] = {{0}, {0}};  // __syncthreads_or, alternate calls
  std::vector<std::unique_ptr<Warp>> warps;
};

inline thread_local Block* current = nullptr;
inline std::mutex& atomic_mutex() {
  static std::mutex m;
  return m;
}

template <typename V>
V exchange(unsigned mask, V v, int src) {
  static_assert(sizeof(V) <= 8, "shuffles move at most 8 bytes");
  const int lane = threadIdx.x & 31;
  Warp& w = *current->warps[threadIdx.x / 32];
  Barrier& b = w.barrier(mask);
  unsigned long long bits = 0;
  std::memcpy(&bits, &v, sizeof(V));
  w.slots[lane] = bits;
  b.wait();
  bits = w.slots[src];
  b.wait();
  V out;
  std::memcpy(&out, &bits, sizeof(V));
  return out;
}

// Runs kernel(params) over grid x block threads.
template <typename P>
void launch(void (*kernel)(P), unsigned gx, unsigned gy, unsigned block, const P* params) {
  Block b;
  b.sync = std::make_unique<Barrier>(static_cast<int>(block));
  for (unsigned w = 0; w < (block + 31) / 32; ++w) b.warps.push_back(std::make_unique<Warp>());
  Barrier between(static_cast<int>(block));
  std::vector<std::thread> threads;
  for (unsigned t = 0; t < block; ++t) {
    threads.emplace_back([&, t] {
      current = &b;
      threadIdx.x = t;
      for (unsigned y = 0; y < gy; ++y) {
        for (unsigned x = 0; x < gx; ++x) {
          blockIdx.x = x;
          blockIdx.y = y;
          kernel(*params);
          between.wait();  // the next block reuses __shared__ storage
        }
      }
    });
  }
  for (auto& th : threads) th.join();
}

}  // namespace sj_emu

template <typename V>
V __shfl_xor_sync(unsigned mask, V v, int lane_mask, int width = 32) {
  const int lane = threadIdx.x & 31;
  int src = lane ^ lane_mask;
  if ((src & ~(width - 1)) != (lane & ~(width - 1))) src = lane;
  return sj_emu::exchange(mask, v, src);
}
template <typename V>
V __shfl_down_sync(unsigned mask, V v, unsigned delta, int width = 32) {
  const int lane = threadIdx.x & 31;
  const int src = (lane % width) + int(delta) >= width ? lane : lane + int(delta);
  return sj_emu::exchange(mask, v, src);
}
template <typename V>
V __shfl_sync(unsigned mask, V v, int src_lane, int width = 32) {
  const int lane = threadIdx.x & 31;
  return sj_emu::exchange(mask, v, (lane & ~(width - 1)) + (src_lane % width));
}
inline void __syncthreads() {
  sj_emu::current->sync->wait();
}

// A block barrier that also returns whether any thread's predicate was non-zero: two barriers
// (accumulate, then everyone has read), the flag of alternate calls in alternate slots so a
// thread already in the next call cannot set the flag thread 0 is about to clear.
inline int __syncthreads_or(int predicate) {
  thread_local unsigned calls = 0;
  sj_emu::Block& b = *sj_emu::current;
  const unsigned slot = calls++ & 1u;
  if (predicate) b.any[slot].store(1);
  b.sync->wait();
  const int r = b.any[slot].load();
  b.sync->wait();
  if (threadIdx.x == 0) b.any[slot].store(0);
  return r;
}

inline float atomicAdd(float* p, float v) {
  std::lock_guard<std::mutex> g(sj_emu::atomic_mutex());
  const float old = *p;
  *p = old + v;
  return old;
}
inline double atomicAdd(double* p, double v) {
  std::lock_guard<std::mutex> g(sj_emu::atomic_mutex());
  const double old = *p;
  *p = old + v;
  return old;
}
