// cuda_cpu.h: just enough of CUDA C++ to compile tensor/cuda/kernels.cu
// with a host C++ compiler and run its kernels on CPU threads, for the
// kernels' logic checked in `go test` (kernels_cpu_test.go). This is not
// a GPU: memory is host memory, there is no warp-synchronous execution
// beyond what the kernels ask for, and float functions are the C
// library's.
//
// A block runs on one OS thread; each of its CUDA threads is a fiber
// (ucontext) with a stack of its own. A fiber runs until it waits at a
// barrier (__syncthreads for the block, __shfl_xor_sync for its warp),
// then the next fiber runs, in thread order; a barrier releases when
// every live thread of its group has arrived. So a missing __syncthreads
// lets a later warp read shared memory before an earlier one wrote it,
// which the checks see. Blocks run on a few OS threads at once, so
// atomicAdd races for real. __shared__ variables are static thread_local:
// one copy per OS thread, which runs one block at a time.
#pragma once

#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>

struct uint3 {
    unsigned int x, y, z;
};
typedef uint3 dim3;

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__ static thread_local

namespace cpusim {
// The running block and thread of this OS thread.
struct Block;
struct Fiber;
extern thread_local Block* cur_block;
extern thread_local Fiber* cur_fiber;
const uint3& thread_idx();
const uint3& block_idx();
const uint3& block_dim();
const uint3& grid_dim();
void syncthreads();
// The shuffles: xor (lane ^ arg), idx (lane arg), down (lane + arg), up
// (lane - arg), each within segments of width lanes.
enum { kShflXor, kShflIdx, kShflDown, kShflUp };
// shfl exchanges 8 bytes within the calling thread's warp: it returns
// what the source lane of kind and arg offered (the caller's own value
// where down or up leave the segment).
uint64_t shfl(uint64_t v, int kind, int arg, int width);
// syncwarp waits for the calling thread's warp.
void syncwarp();
// dynamic_shared is the launch's dynamic shared memory of the running
// block.
void* dynamic_shared();
// fail stops the launch with a message (a kernel misused an intrinsic).
[[noreturn]] void fail(const char* msg);
}  // namespace cpusim

#define threadIdx (cpusim::thread_idx())
#define blockIdx (cpusim::block_idx())
#define blockDim (cpusim::block_dim())
#define gridDim (cpusim::grid_dim())

inline void __syncthreads() { cpusim::syncthreads(); }

namespace cpusim {
template <class T>
inline T shuffle(unsigned mask, T v, int kind, int arg, int width) {
    static_assert(sizeof(T) <= 8, "shuffle of more than 8 bytes");
    if (mask != 0xffffffffu) fail("a shuffle with a partial mask");
    uint64_t u = 0;
    std::memcpy(&u, &v, sizeof(T));
    u = shfl(u, kind, arg, width);
    T r;
    std::memcpy(&r, &u, sizeof(T));
    return r;
}
}  // namespace cpusim

template <class T>
inline T __shfl_xor_sync(unsigned mask, T v, int lane_mask, int width = 32) {
    return cpusim::shuffle(mask, v, cpusim::kShflXor, lane_mask, width);
}
template <class T>
inline T __shfl_sync(unsigned mask, T v, int src_lane, int width = 32) {
    return cpusim::shuffle(mask, v, cpusim::kShflIdx, src_lane, width);
}
template <class T>
inline T __shfl_down_sync(unsigned mask, T v, unsigned delta, int width = 32) {
    return cpusim::shuffle(mask, v, cpusim::kShflDown, (int)delta, width);
}
template <class T>
inline T __shfl_up_sync(unsigned mask, T v, unsigned delta, int width = 32) {
    return cpusim::shuffle(mask, v, cpusim::kShflUp, (int)delta, width);
}
inline void __syncwarp(unsigned mask = 0xffffffffu) {
    if (mask != 0xffffffffu) cpusim::fail("__syncwarp with a partial mask");
    cpusim::syncwarp();
}

// HPCRUN_DYNAMIC_SHARED declares the launch's dynamic shared memory as an
// array of T (kernels.cu defines it as extern __shared__ for NVRTC).
#define HPCRUN_DYNAMIC_SHARED(T, name) T* name = (T*)cpusim::dynamic_shared()

inline float atomicAdd(float* p, float v) {
    std::atomic_ref<float> a(*p);
    float old = a.load(std::memory_order_relaxed);
    while (!a.compare_exchange_weak(old, old + v, std::memory_order_relaxed)) {
    }
    return old;
}

inline float __int_as_float(int i) {
    float f;
    std::memcpy(&f, &i, 4);
    return f;
}
inline unsigned int __float_as_uint(float f) {
    unsigned int u;
    std::memcpy(&u, &f, 4);
    return u;
}
inline float rsqrtf(float x) { return 1.f / sqrtf(x); }
