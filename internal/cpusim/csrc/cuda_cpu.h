// cuda_cpu.h: just enough of CUDA C++ to compile tensor/cuda/kernels.cu
// with a host C++ compiler and run its kernels on CPU threads, for the
// kernels' logic checked in `go test` (kernels_cpu_test.go). This is not
// a GPU: memory is host memory, there is no warp-synchronous execution
// beyond what the kernels ask for, and float functions are the C
// library's.
//
// A block runs on one OS thread; each of its CUDA threads is a fiber
// (ucontext) with a stack of its own. A fiber runs until it waits at a
// barrier (__syncthreads for the block; a shuffle, __syncwarp or a
// warp-wide matrix instruction for its warp), then the next fiber runs,
// in thread order or, with a seed (HPCRUN_CPUSIM_SEED), in an order drawn
// from it each round; a barrier releases when every live thread of its
// group has arrived. So a missing __syncthreads lets one warp read shared
// memory before another wrote it, which the checks see in one order or
// the other. Blocks run on a few OS threads at once, so atomicAdd races
// for real. __shared__ variables are static thread_local: one copy per
// OS thread, which runs one block at a time; dynamic shared memory
// (HPCRUN_DYNAMIC_SHARED) starts as NaNs. The shuffles (xor, idx, down,
// up, with widths), mma.sync m16n8k16 on bf16 and ldmatrix follow PTX's
// definitions and fragment layouts, for full warps and full masks.
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
// The running thread's indices (its fiber's).
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
// warp_gather offers n bytes at p from the calling lane and, once every
// lane of its warp has, returns the warp's 32 offers laid end to end (each
// n bytes, by lane); the result stays valid until the calling thread
// next waits (at any barrier).
const char* warp_gather(const void* p, int n);
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

// HPCRUN_CPUSIM marks the simulation's build of kernels.cu.
#define HPCRUN_CPUSIM 1

// The warp's matrix instructions, as PTX defines their fragments
// (laneid = 4*group + t): mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32
// and ldmatrix.sync.aligned.m8n8.x{1,2,4}{,.trans}.shared.b16. kernels.cu
// defines the same functions with inline PTX for NVRTC.
namespace cpusim {
inline float bf16_value(unsigned short h) {
    unsigned u = (unsigned)h << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}
}  // namespace cpusim

// mma_bf16_16816 computes D = A B + C for the warp: A 16x16 row-major, B
// 16x8 column-major, bf16 operands, float32 C and D. Lane (group g, t)
// holds A's elements (g, 2t..2t+1), (g+8, 2t..), (g, 2t+8..), (g+8,
// 2t+8..) in a[0..3] (two bf16 a register, the lower index in the low
// half), B's (2t..2t+1, g) and (2t+8.., g) in b[0..1], and C's and D's
// (g, 2t..2t+1), (g+8, 2t..2t+1) in c[0..3] and d[0..3]. Each sum runs
// over k in order, in float32.
inline void mma_bf16_16816(float* d, const unsigned* a, const unsigned* b, const float* c) {
    struct Frag {
        unsigned a[4], b[2];
    } mine;
    std::memcpy(mine.a, a, sizeof mine.a);
    std::memcpy(mine.b, b, sizeof mine.b);
    const Frag* all = (const Frag*)cpusim::warp_gather(&mine, sizeof mine);
    auto half = [](unsigned r, int hi) { return cpusim::bf16_value((unsigned short)(hi ? r >> 16 : r & 0xffff)); };
    auto A = [&](int row, int k) {  // the lane and register that hold A(row, k)
        int g = row & 7, t = (k & 7) >> 1, reg = (row >> 3) + 2 * (k >> 3);
        return half(all[4 * g + t].a[reg], k & 1);
    };
    auto B = [&](int k, int col) {
        int t = (k & 7) >> 1, reg = k >> 3;
        return half(all[4 * col + t].b[reg], k & 1);
    };
    int lane = (int)(threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z)) & 31;
    int g = lane >> 2, t = lane & 3;
    float out[4];
    for (int i = 0; i < 4; i++) {
        int row = g + 8 * (i >> 1), col = 2 * t + (i & 1);
        float s = 0.f;
        for (int k = 0; k < 16; k++) s += A(row, k) * B(k, col);
        out[i] = s + c[i];
    }
    for (int i = 0; i < 4; i++) d[i] = out[i];
}

// ldmatrix loads n (1, 2 or 4) 8x8 matrices of 16-bit elements from
// shared memory: lane 8j+i gives the address of row i of matrix j (lanes
// past 8n give none that is read); lane (g, t) receives in r[j] matrix
// j's (g, 2t) and (g, 2t+1), or with trans its (2t, g) and (2t+1, g).
inline void ldmatrix(unsigned* r, int n, bool trans, const void* row) {
    const void* const* rows = (const void* const*)cpusim::warp_gather(&row, sizeof row);
    int lane = (int)(threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z)) & 31;
    int g = lane >> 2, t = lane & 3;
    unsigned out[4];
    for (int j = 0; j < n; j++) {
        unsigned short e[2];
        for (int h = 0; h < 2; h++) {
            int rr = trans ? 2 * t + h : g, cc = trans ? g : 2 * t + h;
            std::memcpy(&e[h], (const char*)rows[8 * j + rr] + 2 * cc, 2);
        }
        out[j] = (unsigned)e[0] | (unsigned)e[1] << 16;
    }
    for (int j = 0; j < n; j++) r[j] = out[j];
}
inline void ldmatrix_x1(unsigned* r, const void* row) { ldmatrix(r, 1, false, row); }
inline void ldmatrix_x2(unsigned* r, const void* row) { ldmatrix(r, 2, false, row); }
inline void ldmatrix_x4(unsigned* r, const void* row) { ldmatrix(r, 4, false, row); }
inline void ldmatrix_x2_trans(unsigned* r, const void* row) { ldmatrix(r, 2, true, row); }
inline void ldmatrix_x4_trans(unsigned* r, const void* row) { ldmatrix(r, 4, true, row); }

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
inline float __uint_as_float(unsigned int u) {
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}
inline unsigned int __float_as_uint(float f) {
    unsigned int u;
    std::memcpy(&u, &f, 4);
    return u;
}
inline float rsqrtf(float x) { return 1.f / sqrtf(x); }
// CUDA's integer min and max.
inline int min(int a, int b) { return a < b ? a : b; }
inline int max(int a, int b) { return a > b ? a : b; }
