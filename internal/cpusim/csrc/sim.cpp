// sim.cpp: a CPU stand-in for libcuda, cuBLAS and NVRTC, with the kernels
// of tensor/cuda/kernels.cu compiled in (through cuda_cpu.h), built by
// kernels_cpu_test.go into one shared library that the Go device opens
// instead of the real ones. Every entry point the device binds is here,
// with the real prototype; launches run at once (a stream is always
// idle), memory is host memory. GEMMs are plain loops in float32.
//
// Built with -DKERNEL_LIST='"list.h"' naming a file of HPCRUN_KERNEL(name)
// lines (the Go side's kernels table) and kernels.cu on the include path.
#include "cuda_cpu.h"
#include "sim.h"

#include <ucontext.h>

#include <algorithm>
#include <condition_variable>
#include <functional>
#include <map>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

// hpcrun_mut selects a planted mutation of a mutated kernels.cu (0: none).
extern "C" {
int hpcrun_mut = 0;
}

#include "kernels.cu"

// Switching fibers: on x86-64 a few instructions that save the
// callee-saved registers on the old stack and restore them from the new
// one (swapcontext also saves the signal mask, a system call each time,
// which made the check several times slower); elsewhere ucontext.
#if defined(__x86_64__)
#define CPUSIM_FAST_SWITCH 1
// cpusim_switch saves the stack pointer at *save and resumes the stack
// at load (as cpusim_switch left it, or as new_stack prepared it).
extern "C" void cpusim_switch(void** save, void* load);
asm(R"(
    .text
    .globl cpusim_switch
    .type cpusim_switch, @function
cpusim_switch:
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
    .size cpusim_switch, .-cpusim_switch
    .section .note.GNU-stack,"",@progbits
    .text
)");
#endif

namespace cpusim {

const int kStack = 64 << 10;  // a fiber's stack, aligned to its size (self())
const int kStackHead = 64;    // bytes at a stack's base that hold its fiber's address
const int kGather = 32;  // bytes a lane may offer to a warp-wide instruction

struct Block;
struct Fiber {
    Block* block;  // the block it is a thread of
    void* sp;  // CPUSIM_FAST_SWITCH: the saved stack pointer
    ucontext_t ctx;
    uint3 tid;
    int linear = 0;
    bool done = false;
    int waitKind = 0;  // 0 runnable, 1 block barrier, 2 warp barrier
    unsigned long waitGen = 0;
    unsigned shuffles = 0;  // the fiber's shuffles so far: their parity picks the buffer
    unsigned gathers = 0;   // and its warp_gathers
};

struct Block {
    uint3 bid, bdim, gdim;
    int nthreads = 0, live = 0;
    std::vector<Fiber>* fibers;
    void* schedSP;
    ucontext_t sched;
    int arrived = 0;
    unsigned long gen = 0;
    std::vector<int> warpArrived, warpLive;
    std::vector<unsigned long> warpGen;
    std::vector<uint64_t> shflBuf;
    char* dynShared = nullptr;  // the launch's dynamic shared memory
    std::vector<std::vector<char>> gather;  // two per warp: warp_gather's offers, kGather bytes a lane
    void (*body)(void**);
    void** params;
    const char* error = nullptr;
};

// self is the running fiber: its stack is kStack-aligned and holds the
// fiber's address at its base, so that the hot paths (every thread index,
// barrier and shuffle) read no thread-local storage, which a shared
// library reaches through a call each time.
static inline Fiber* self() {
    return *(Fiber**)((uintptr_t)__builtin_frame_address(0) & ~(uintptr_t)(kStack - 1));
}

const uint3& thread_idx() { return self()->tid; }
const uint3& block_idx() { return self()->block->bid; }
const uint3& block_dim() { return self()->block->bdim; }
const uint3& grid_dim() { return self()->block->gdim; }

// to_scheduler leaves the running fiber for its block's scheduler.
static void to_scheduler() {
#if CPUSIM_FAST_SWITCH
    cpusim_switch(&self()->sp, self()->block->schedSP);
#else
    swapcontext(&self()->ctx, &self()->block->sched);
#endif
}

// to_fiber resumes fiber f from the scheduler.
static void to_fiber(Block* b, Fiber* f) {
#if CPUSIM_FAST_SWITCH
    cpusim_switch(&b->schedSP, f->sp);
#else
    swapcontext(&b->sched, &f->ctx);
#endif
}

[[noreturn]] void fail(const char* msg) {
    self()->block->error = msg;
    self()->done = true;
    to_scheduler();
    std::abort();
}

static void wait_here(int kind, unsigned long gen) {
    self()->waitKind = kind;
    self()->waitGen = gen;
    to_scheduler();
}

void syncthreads() {
    Block* b = self()->block;
    unsigned long g = b->gen;
    if (++b->arrived == b->live) {
        b->arrived = 0;
        b->gen++;
        return;
    }
    wait_here(1, g);
}

static void warp_barrier(int w) {
    Block* b = self()->block;
    unsigned long g = b->warpGen[w];
    if (++b->warpArrived[w] == b->warpLive[w]) {
        b->warpArrived[w] = 0;
        b->warpGen[w]++;
        return;
    }
    wait_here(2, g);
}

uint64_t shfl(uint64_t v, int kind, int arg, int width) {
    Block* b = self()->block;
    int w = self()->linear / 32, lane = self()->linear % 32;
    if (b->warpLive[w] != 32 || std::min(32, b->nthreads - w * 32) != 32)
        fail("a shuffle with a full mask in a warp that is not whole");
    if (width < 1 || width > 32 || (width & (width - 1)) != 0) fail("a shuffle's width is not a power of two up to 32");
    // Two buffers, alternate shuffles: a lane that has read this one's
    // offers can write the next shuffle's only into the other, and it
    // cannot get a second shuffle ahead (that one's barrier waits for
    // every lane), so one barrier a shuffle suffices.
    uint64_t* buf = &b->shflBuf[(self()->shuffles++ & 1) * b->shflBuf.size() / 2 + w * 32];
    buf[lane] = v;
    warp_barrier(w);
    int base = lane & ~(width - 1), src = lane;
    switch (kind) {
    case kShflXor:
        src = lane ^ arg;
        if (src >= base + width) src = lane;  // outside the segment: its own value
        break;
    case kShflIdx:
        src = base + (arg & (width - 1));
        break;
    case kShflDown:
        if (lane + arg < base + width) src = lane + arg;
        break;
    case kShflUp:
        if (lane - arg >= base) src = lane - arg;
        break;
    }
    return buf[src];
}

void syncwarp() {
    Block* b = self()->block;
    int w = self()->linear / 32;
    if (b->warpLive[w] != std::min(32, b->nthreads - w * 32)) fail("__syncwarp in a warp some of whose threads have returned");
    warp_barrier(w);
}

void* dynamic_shared() { return self()->block->dynShared; }

const char* warp_gather(const void* p, int n) {
    Block* b = self()->block;
    int w = self()->linear / 32, lane = self()->linear % 32;
    if (b->warpLive[w] != 32 || std::min(32, b->nthreads - w * 32) != 32)
        fail("a warp-wide matrix instruction in a warp that is not whole");
    if (n > kGather) fail("a warp-wide instruction offers more than its buffer holds");
    int nwarps = (b->nthreads + 31) / 32;
    if (b->gather.empty()) b->gather.assign(2 * nwarps, std::vector<char>(32 * kGather));  // on first use
    // Two buffers a warp, alternate gathers, as shfl's.
    std::vector<char>& buf = b->gather[(self()->gathers++ & 1) * nwarps + w];
    std::memcpy(&buf[lane * kGather], p, n);
    warp_barrier(w);
    // Pack the offers end to end for the caller (each lane its own copy:
    // they are read, never written, until the lane next waits).
    thread_local std::vector<char> packed;
    packed.resize(32 * n);
    for (int l = 0; l < 32; l++) std::memcpy(&packed[l * n], &buf[l * kGather], n);
    return packed.data();
}


static void fiber_main() {
    self()->block->body(self()->block->params);
    Block* b = self()->block;
    Fiber* f = self();
    f->done = true;
    b->live--;
    b->warpLive[f->linear / 32]--;
    // A barrier that waited only on this thread is complete now.
    if (b->arrived > 0 && b->arrived == b->live) {
        b->arrived = 0;
        b->gen++;
    }
    int w = f->linear / 32;
    if (b->warpArrived[w] > 0 && b->warpArrived[w] == b->warpLive[w]) {
        b->warpArrived[w] = 0;
        b->warpGen[w]++;
    }
#if CPUSIM_FAST_SWITCH
    to_scheduler();  // never resumed
    std::abort();
#endif
}

#if CPUSIM_FAST_SWITCH
// new_stack prepares the stack [base, base+size) so that cpusim_switch to
// the returned pointer starts fiber_main as if called: six zero registers
// to pop, then fiber_main's address for ret, then a null return address.
static void* new_stack(char* base, size_t size) {
    uintptr_t top = ((uintptr_t)base + size) & ~(uintptr_t)15;
    void** sp = (void**)top;
    *--sp = nullptr;
    *--sp = (void*)&fiber_main;
    for (int i = 0; i < 6; i++) *--sp = nullptr;
    return sp;
}
#endif

// Per OS thread: fiber stacks, reused across blocks.
struct Worker {
    std::vector<Fiber> fibers;
    std::vector<char*> stacks;
    std::vector<char> dyn;  // dynamic shared memory, 16-byte aligned below
    ~Worker() {
        for (char* s : stacks) free(s);
    }
};

static bool runnable(Block* b, Fiber& f) {
    if (f.done) return false;
    if (f.waitKind == 1) return b->gen != f.waitGen;
    if (f.waitKind == 2) return b->warpGen[f.linear / 32] != f.waitGen;
    return true;
}

// run_block runs one block; it returns an error message or null.
// order_seed, when not 0, makes each round of a block's scheduler visit
// its warps, and their threads, in an order drawn from it (and the
// block), each warp running ahead to its next __syncthreads, instead of
// every thread to its next barrier in thread order: a race that thread
// order hides shows under some seed.
static std::atomic<unsigned long> order_seed{0};

static const char* run_block(Worker& wk, uint3 bid, uint3 bdim, uint3 gdim, void (*body)(void**), void** params,
                             unsigned shmem) {
    Block b;
    b.bid = bid, b.bdim = bdim, b.gdim = gdim;
    b.nthreads = b.live = bdim.x * bdim.y * bdim.z;
    int nwarps = (b.nthreads + 31) / 32;
    b.warpArrived.assign(nwarps, 0);
    b.warpGen.assign(nwarps, 0);
    b.warpLive.assign(nwarps, 0);
    b.shflBuf.assign(2 * nwarps * 32, 0);
    b.body = body, b.params = params;
    if (shmem > 0) {
        // Uninitialised, as on a GPU: all ones, a NaN in every float, so
        // a read before any write shows.
        wk.dyn.assign(shmem + 16, (char)0xff);
        b.dynShared = (char*)(((uintptr_t)wk.dyn.data() + 15) & ~(uintptr_t)15);
    }
    wk.fibers.resize(b.nthreads);
    while ((int)wk.stacks.size() < b.nthreads) wk.stacks.push_back((char*)aligned_alloc(kStack, kStack));
    b.fibers = &wk.fibers;
    for (int i = 0; i < b.nthreads; i++) {
        Fiber& f = wk.fibers[i];
        f = Fiber();
        f.block = &b;
        f.linear = i;
        *(Fiber**)wk.stacks[i] = &f;  // self()'s, below the stack the fiber uses
        f.tid = uint3{(unsigned)(i % bdim.x), (unsigned)(i / bdim.x % bdim.y), (unsigned)(i / (bdim.x * bdim.y))};
        b.warpLive[i / 32]++;
#if CPUSIM_FAST_SWITCH
        // Stack tops staggered by a fiber's index: tops kStack apart
        // would all fall in the same cache sets, and every switch miss.
        f.sp = new_stack(wk.stacks[i] + kStackHead, kStack - kStackHead - (i % 64) * 192);
#else
        getcontext(&f.ctx);
        f.ctx.uc_stack.ss_sp = wk.stacks[i] + kStackHead;
        f.ctx.uc_stack.ss_size = kStack - kStackHead;
        f.ctx.uc_link = &b.sched;
        makecontext(&f.ctx, fiber_main, 0);
#endif
    }
    unsigned long seed = order_seed.load();
    std::vector<int> order(b.nthreads);
    for (int i = 0; i < b.nthreads; i++) order[i] = i;
    unsigned long long rng = seed * 0x9e3779b97f4a7c15ull ^ ((unsigned long long)bid.x << 32 | bid.y << 16 | bid.z);
    for (;;) {
        bool any = false, progress = false;
        if (seed != 0) {
            for (int i = b.nthreads - 1; i > 0; i--) {  // Fisher-Yates with xorshift64
                rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
                std::swap(order[i], order[rng % (unsigned long long)(i + 1)]);
            }
        }
        auto visit = [&](int w) {  // one pass over the threads of warp w (-1: all); true if one ran
            bool ran = false;
            for (int k = 0; k < b.nthreads && !b.error; k++) {
                int i = order[k];
                Fiber& f = wk.fibers[i];
                if (f.done || (w >= 0 && i / 32 != w)) continue;
                any = true;
                if (!runnable(&b, f)) continue;
                progress = ran = true;
                f.waitKind = 0;
                to_fiber(&b, &f);
            }
            return ran;
        };
        if (seed == 0) {
            visit(-1);
        } else {
            // Each warp in turn, in the drawn order, runs ahead of the
            // others until its threads all wait at __syncthreads (or
            // return), as a GPU's warps may: a barrier missing between
            // one warp's writes of shared memory and another's reads
            // shows, however many warp-wide steps lie between them.
            std::vector<bool> seen((b.nthreads + 31) / 32);
            for (int k = 0; k < b.nthreads && !b.error; k++) {
                int w = order[k] / 32;
                if (seen[w]) continue;
                seen[w] = true;
                while (visit(w) && !b.error) {
                }
            }
        }
        if (b.error) return b.error;
        if (!any) return nullptr;
        if (!progress) return "deadlock: threads wait at a barrier that the others never reach";
    }
}

// The kernel table: name, and a body that unpacks cuLaunchKernel's
// parameter pointers into the kernel's typed arguments.
template <class... A, size_t... I>
static void call_with(void (*k)(A...), void** p, std::index_sequence<I...>) {
    k(*static_cast<std::remove_reference_t<A>*>(p[I])...);
}

template <auto K>
static void body(void** p) {
    auto k = K;
    [&]<class... A>(void (*f)(A...)) { call_with(f, p, std::index_sequence_for<A...>{}); }(k);
}

struct Kernel {
    const char* name;
    void (*body)(void**);
    std::atomic<long> launches{0};
    int maxDynShared = 0;  // CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
};

static Kernel table[] = {
#define HPCRUN_KERNEL(n) {#n, body<n>},
#include KERNEL_LIST
#undef HPCRUN_KERNEL
};
const int ntable = sizeof(table) / sizeof(table[0]);

static std::string last_error;
static std::mutex mu;

// --- devices, streams and their queues ---

static std::vector<Dev*> devs;  // as the process sees them
static std::once_flag devs_once;

// The machine has HPCRUN_CPUSIM_DEVICES devices (1 when unset);
// CUDA_VISIBLE_DEVICES, when set, picks which the process sees and in
// what order, as the real driver does.
static void init_devices() {
    if (const char* e = getenv("HPCRUN_CPUSIM_SEED")) order_seed = strtoul(e, nullptr, 10);
    int machine = 1;
    if (const char* e = getenv("HPCRUN_CPUSIM_DEVICES")) machine = std::max(1, atoi(e));
    std::vector<int> visible;
    if (const char* v = getenv("CUDA_VISIBLE_DEVICES")) {
        std::string s(v);
        size_t i = 0;
        while (i <= s.size()) {
            size_t j = s.find(',', i);
            if (j == std::string::npos) j = s.size();
            std::string f = s.substr(i, j - i);
            char* end = nullptr;
            long n = strtol(f.c_str(), &end, 10);
            if (f.empty() || *end != 0 || n < 0 || n >= machine) break;  // the driver stops at the first bad entry
            visible.push_back((int)n);
            i = j + 1;
        }
    } else {
        for (int i = 0; i < machine; i++) visible.push_back(i);
    }
    for (size_t i = 0; i < visible.size(); i++) {
        Dev* d = new Dev;  // never freed: the worker may outlive main
        d->ordinal = (int)i;
        d->physical = visible[i];
        devs.push_back(d);
    }
}

int device_count() {
    std::call_once(devs_once, init_devices);
    return (int)devs.size();
}

Dev* device(int ordinal) {
    if (ordinal < 0 || ordinal >= device_count()) return nullptr;
    return devs[ordinal];
}

static thread_local Dev* cur_dev;

Dev* current_device() { return cur_dev ? cur_dev : device(0); }

// A stream is its device: every stream hpcrun makes is blocking, so it
// orders with the legacy default stream, on which NCCL's calls go.
struct Stream {
    uint32_t magic = 0x5354524d;
    Dev* dev;
};

Dev* stream_device(void* s) {
    if (!s) return current_device();
    Stream* st = (Stream*)s;
    if (st->magic != 0x5354524d) {
        fprintf(stderr, "cpusim: not a stream handle: %p\n", s);
        abort();
    }
    return st->dev;
}

static void worker_loop(Dev* d) {
    std::unique_lock<std::mutex> l(d->mu);
    for (;;) {
        d->cv.wait(l, [&] { return !d->queue.empty(); });
        auto work = std::move(d->queue.front());
        d->queue.pop_front();
        d->busy = true;
        bool skip = !d->error.empty();  // after a failure the device's later work does not run
        l.unlock();
        std::string err = skip ? "" : work();
        l.lock();
        d->busy = false;
        if (!err.empty() && d->error.empty()) d->error = err;
        d->cv.notify_all();
    }
}

void enqueue(Dev* d, std::function<std::string()> work) {
    std::lock_guard<std::mutex> l(d->mu);
    if (!d->started) {
        d->started = true;
        std::thread(worker_loop, d).detach();  // it outlives main: exit does not wait for a stuck peer
    }
    d->queue.push_back(std::move(work));
    d->cv.notify_all();
}

std::string drain(Dev* d) {
    std::unique_lock<std::mutex> l(d->mu);
    d->cv.wait(l, [&] { return d->queue.empty() && !d->busy; });
    return d->error;
}

static bool idle(Dev* d) {
    std::lock_guard<std::mutex> l(d->mu);
    return d->queue.empty() && !d->busy;
}

// --- device memory: host memory, every allocation registered ---

static std::mutex alloc_mu;
static std::map<uintptr_t, size_t> allocs;

static void* dev_alloc(size_t n) {
    void* p = aligned_alloc(256, (std::max<size_t>(n, 1) + 255) / 256 * 256);
    if (p) {
        std::lock_guard<std::mutex> l(alloc_mu);
        allocs[(uintptr_t)p] = n;
    }
    return p;
}

static bool dev_free(void* p) {
    if (!p) return true;
    {
        std::lock_guard<std::mutex> l(alloc_mu);
        if (!allocs.erase((uintptr_t)p)) return false;
    }
    free(p);
    return true;
}

bool allocation_fits(const void* p, size_t n) {
    std::lock_guard<std::mutex> l(alloc_mu);
    auto it = allocs.upper_bound((uintptr_t)p);
    if (it == allocs.begin()) return false;
    --it;
    return (uintptr_t)p + n <= it->first + it->second;
}

// --- kernel launches: a pool of OS threads that keeps its fiber stacks ---

struct Pool {
    std::mutex launch;  // one launch at a time in the process
    std::mutex mu;
    std::condition_variable start, done;
    std::function<void()>* job = nullptr;
    unsigned long gen = 0;
    int pending = 0, helpers = -1;

    void run(std::function<void()>& f) {
        std::unique_lock<std::mutex> l(mu);
        if (helpers < 0) {
            helpers = (int)std::max(2u, std::min(4u, std::thread::hardware_concurrency())) - 1;
            for (int i = 0; i < helpers; i++) std::thread([this] { loop(); }).detach();
        }
        job = &f;
        pending = helpers;
        gen++;
        start.notify_all();
        l.unlock();
        f();
        l.lock();
        done.wait(l, [&] { return pending == 0; });
        job = nullptr;
    }

    void loop() {
        unsigned long seen = 0;
        std::unique_lock<std::mutex> l(mu);
        for (;;) {
            start.wait(l, [&] { return gen != seen; });
            seen = gen;
            std::function<void()>* f = job;
            l.unlock();
            (*f)();
            l.lock();
            if (--pending == 0) done.notify_all();
        }
    }
};
static Pool* pool = new Pool;  // never freed: its threads outlive main

}  // namespace cpusim

using namespace cpusim;

typedef int CUresult;
static char sim_module;
static int max_threads = 1024;  // what cuFuncGetAttribute says a kernel can run
static std::atomic<int> stuck{0};  // the stream never drains (a peer that never posts)

// sync_stream waits for the work queued on stream s; it returns a CUDA
// error when that work failed (its message for cuGetErrorString).
static CUresult sync_stream(void* s) {
    std::string e = drain(stream_device(s));
    if (e.empty()) return 0;
    std::lock_guard<std::mutex> l(mu);
    last_error = e;
    return 719;  // CUDA_ERROR_LAUNCH_FAILED
}

extern "C" {

// --- test hooks ---

// hpcrun_sim_launches is how many times kernel name was launched (-1: no such kernel).
long hpcrun_sim_launches(const char* name) {
    for (int i = 0; i < ntable; i++)
        if (!strcmp(table[i].name, name)) return table[i].launches.load();
    return -1;
}

// hpcrun_sim_set_max_threads sets what cuFuncGetAttribute says of every
// kernel's largest block (as registers would limit it).
void hpcrun_sim_set_max_threads(int n) { max_threads = n; }

// hpcrun_sim_set_stuck makes the stream never drain (1) or drain (0), as
// when an NCCL kernel waits for a peer that never posts its call.
void hpcrun_sim_set_stuck(int v) { stuck = v; }

// hpcrun_sim_set_mut selects planted mutation m of a mutated kernels.cu.
void hpcrun_sim_set_mut(int m) { hpcrun_mut = m; }

// hpcrun_sim_set_order_seed makes the threads of a block run in an order
// drawn from seed (0: thread order). HPCRUN_CPUSIM_SEED sets it at load.
void hpcrun_sim_set_order_seed(unsigned long seed) { order_seed = seed; }

// --- driver ---

static const char* names[] = {"CUDA_SUCCESS", "CUDA_ERROR_INVALID_VALUE", "CUDA_ERROR_LAUNCH_FAILED", "CUDA_ERROR_NOT_FOUND"};

CUresult cuInit(unsigned) { return 0; }
CUresult cuDriverGetVersion(int* v) {
    *v = 13000;
    return 0;
}
CUresult cuDeviceGetCount(int* n) {
    *n = device_count();
    return 0;
}
CUresult cuDeviceGet(int* d, int ord) {
    if (!device(ord)) return 101;  // CUDA_ERROR_INVALID_DEVICE
    *d = ord;
    return 0;
}
CUresult cuDeviceGetName(char* name, int len, int) {
    snprintf(name, len, "hpcrun CPU simulation");
    return 0;
}
CUresult cuDeviceGetAttribute(int* v, int attr, int) {
    switch (attr) {
    case 16:  // multiprocessors: few, so grids are small and loops stride
        *v = 2;
        return 0;
    case 75:
        *v = 9;
        return 0;
    case 76:
        *v = 0;
        return 0;
    }
    return 1;
}
CUresult cuDevicePrimaryCtxRetain(void** ctx, int dev) {
    Dev* d = device(dev);
    if (!d) return 101;
    *ctx = d;
    return 0;
}
CUresult cuDevicePrimaryCtxRelease_v2(int dev) { return device(dev) ? 0 : 101; }
CUresult cuCtxSetCurrent(void* ctx) {
    cur_dev = (Dev*)ctx;
    return 0;
}
CUresult cuStreamCreate(void** s, unsigned) {
    *s = new Stream{0x5354524d, current_device()};
    return 0;
}
CUresult cuStreamDestroy_v2(void* s) {
    CUresult r = sync_stream(s);
    ((Stream*)s)->magic = 0;
    delete (Stream*)s;
    return r;
}
CUresult cuStreamSynchronize(void* s) { return sync_stream(s); }
CUresult cuStreamQuery(void* s) {
    if (stuck || !idle(stream_device(s))) return 600;  // CUDA_ERROR_NOT_READY
    return sync_stream(s);
}
CUresult cuMemAlloc_v2(void** p, size_t n) {
    *p = dev_alloc(n);
    return *p ? 0 : 2;
}
CUresult cuMemFree_v2(void* p) { return dev_free(p) ? 0 : 1; }
CUresult cuMemAllocHost_v2(void** p, size_t n) {
    *p = aligned_alloc(256, (std::max<size_t>(n, 1) + 255) / 256 * 256);
    return *p ? 0 : 2;
}
CUresult cuMemFreeHost(void* p) {
    free(p);
    return 0;
}
CUresult cuMemGetInfo_v2(size_t* free_, size_t* total) {
    *free_ = *total = size_t(16) << 30;
    return 0;
}
CUresult cuMemcpyHtoDAsync_v2(void* d, const void* s, size_t n, void* st) {
    if (CUresult r = sync_stream(st)) return r;
    memcpy(d, s, n);
    return 0;
}
CUresult cuMemcpyDtoHAsync_v2(void* d, const void* s, size_t n, void* st) {
    if (CUresult r = sync_stream(st)) return r;
    memcpy(d, s, n);
    return 0;
}
CUresult cuMemcpyDtoDAsync_v2(void* d, const void* s, size_t n, void* st) {
    if (CUresult r = sync_stream(st)) return r;
    memmove(d, s, n);
    return 0;
}
CUresult cuMemsetD32Async(void* d, unsigned v, size_t n, void* st) {
    if (CUresult r = sync_stream(st)) return r;
    std::fill_n((unsigned*)d, n, v);
    return 0;
}
CUresult cuModuleLoadData(void** m, const void* image) {
    if (memcmp(image, "HPCRUN-CPUSIM", 13) != 0) return 200;  // CUDA_ERROR_INVALID_IMAGE
    *m = &sim_module;
    return 0;
}
CUresult cuModuleUnload(void*) { return 0; }
CUresult cuModuleGetFunction(void** f, void*, const char* name) {
    for (int i = 0; i < ntable; i++)
        if (!strcmp(table[i].name, name)) {
            *f = &table[i];
            return 0;
        }
    return 500;  // CUDA_ERROR_NOT_FOUND
}
CUresult cuFuncGetAttribute(int* v, int attr, void*) {
    *v = attr == 0 ? max_threads : 64;  // max threads a block; registers
    return 0;
}
// cuFuncSetAttribute raises a kernel's dynamic shared memory limit past
// 48 KiB, up to an H100's 227 KiB (the only attribute it takes).
CUresult cuFuncSetAttribute(void* f, int attr, int v) {
    if (attr != 8 || v < 0 || v > 227 << 10) return 1;  // CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
    ((Kernel*)f)->maxDynShared = v;
    return 0;
}
CUresult cuLaunchKernel(void* f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                        unsigned shmem, void* st, void** params, void** extra) {
    Kernel* k = (Kernel*)f;
    if (extra != nullptr || bx * by * bz == 0 || bx * by * bz > 1024 || gx * gy * gz == 0) return 1;
    if (shmem > (unsigned)std::max(48 << 10, k->maxDynShared)) {
        std::lock_guard<std::mutex> l(mu);
        last_error = std::string(k->name) + ": " + std::to_string(shmem) +
                     " bytes of dynamic shared memory, past the kernel's limit (48 KiB, or what cuFuncSetAttribute raised it to)";
        return 1;  // CUDA_ERROR_INVALID_VALUE
    }
    if (CUresult r = sync_stream(st)) return r;
    k->launches++;
    uint3 gdim{gx, gy, gz}, bdim{bx, by, bz};
    long nblocks = (long)gx * gy * gz;
    std::atomic<long> next{0};
    std::string err;
    std::mutex emu;
    std::function<void()> work = [&] {
        static thread_local Worker wk;  // its fiber stacks serve every launch of the thread
        for (long i; (i = next.fetch_add(1)) < nblocks;) {
            uint3 bid{(unsigned)(i % gx), (unsigned)(i / gx % gy), (unsigned)(i / ((long)gx * gy))};
            if (const char* e = run_block(wk, bid, bdim, gdim, k->body, params, shmem)) {
                std::lock_guard<std::mutex> l(emu);
                err = std::string(k->name) + ": " + e;
                next = nblocks;
            }
        }
    };
    {
        std::lock_guard<std::mutex> l(pool->launch);
        // A grid of one block runs on the calling thread: waking the
        // pool's helpers for it cost more than most such blocks run.
        if (nblocks == 1)
            work();
        else
            pool->run(work);
    }
    if (!err.empty()) {
        std::lock_guard<std::mutex> l(mu);
        last_error = err;
        fprintf(stderr, "cpusim: %s\n", err.c_str());
        return 719;  // CUDA_ERROR_LAUNCH_FAILED
    }
    return 0;
}
CUresult cuGetErrorName(int r, const char** s) {
    *s = r == 0 ? names[0] : r == 1 ? names[1] : r == 719 ? names[2] : r == 500 ? names[3] : "CUDA_ERROR_UNKNOWN";
    return 0;
}
CUresult cuGetErrorString(int r, const char** s) {
    if (r == 719) {
        std::lock_guard<std::mutex> l(mu);
        *s = last_error.c_str();
        return 0;
    }
    return cuGetErrorName(r, s);
}

// --- the CUDA runtime calls the NCCL tests allocate and copy with ---

int cudaGetDeviceCount(int* n) {
    *n = device_count();
    return 0;
}
int cudaSetDevice(int dev) {
    Dev* d = device(dev);
    if (!d) return 101;  // cudaErrorInvalidDevice
    cur_dev = d;
    return 0;
}
int cudaMalloc(void** p, size_t n) {
    *p = dev_alloc(n);
    return *p ? 0 : 2;  // cudaErrorMemoryAllocation
}
int cudaFree(void* p) { return dev_free(p) ? 0 : 1; }
int cudaMemcpy(void* d, const void* s, size_t n, int) {
    if (sync_stream(nullptr)) return 719;
    memmove(d, s, n);
    return 0;
}
int cudaDeviceSynchronize() { return sync_stream(nullptr) ? 719 : 0; }

// --- cuBLAS: column-major, as cuBLAS; float32 or bf16 operands, float32 sums ---

static float load(const void* p, int type, long i) {
    if (type == 0) return ((const float*)p)[i];
    if (type == 14) {  // CUDA_R_16BF
        uint32_t u = (uint32_t)((const uint16_t*)p)[i] << 16;
        float f;
        memcpy(&f, &u, 4);
        return f;
    }
    abort();
}

// store writes a float32 sum as a C of type: as is, or rounded to bf16 (to
// nearest even, a NaN kept a NaN), as cuBLAS stores a CUDA_R_16BF C.
static void store(void* p, int type, long i, float v) {
    if (type == 0) {
        ((float*)p)[i] = v;
        return;
    }
    uint32_t u;
    memcpy(&u, &v, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) {
        ((uint16_t*)p)[i] = (uint16_t)((u >> 16) | 0x40u);
        return;
    }
    u += 0x7fffu + ((u >> 16) & 1u);
    ((uint16_t*)p)[i] = (uint16_t)(u >> 16);
}

// A cuBLAS handle remembers its stream: a GEMM waits for the work queued
// on it, as every other operation does.
struct BlasHandle {
    void* stream = nullptr;
};

int cublasCreate_v2(void** h) {
    *h = new BlasHandle;
    return 0;
}
int cublasDestroy_v2(void* h) {
    delete (BlasHandle*)h;
    return 0;
}
int cublasSetStream_v2(void* h, void* s) {
    ((BlasHandle*)h)->stream = s;
    return 0;
}
int cublasSetMathMode(void*, int) { return 0; }
int cublasGetVersion_v2(void*, int* v) {
    *v = 130000;
    return 0;
}

// gemm computes C = alpha op(A) op(B) + beta C, each sum over l in order
// in float32; op(A) and op(B) are unpacked into rows first, so the loop
// that sums reads memory in order. C is float32, or bf16 with bf16 A and B
// (cuBLAS's supported combinations).
static int gemm(void* h, int ta, int tb, int m, int n, int k, const float* alpha, const void* A, int at, int lda,
                long sa, const void* B, int bt, int ldb, long sb, const float* beta, void* C, int ct, int ldc, long sc,
                int batch) {
    if ((at != 0 && at != 14) || bt != at || (ct != 0 && ct != at)) return 7;  // CUBLAS_STATUS_INVALID_VALUE
    if (sync_stream(((BlasHandle*)h)->stream)) return 13;      // CUBLAS_STATUS_EXECUTION_FAILED
    std::vector<float> a((size_t)m * k), b((size_t)n * k);
    for (int q = 0; q < batch; q++) {
        for (int i = 0; i < m; i++)
            for (int l = 0; l < k; l++) a[(size_t)i * k + l] = load(A, at, q * sa + (ta ? (long)i * lda + l : (long)l * lda + i));
        for (int j = 0; j < n; j++)
            for (int l = 0; l < k; l++) b[(size_t)j * k + l] = load(B, bt, q * sb + (tb ? (long)l * ldb + j : (long)j * ldb + l));
        for (int j = 0; j < n; j++)
            for (int i = 0; i < m; i++) {
                const float *ar = &a[(size_t)i * k], *br = &b[(size_t)j * k];
                float s = 0;
                for (int l = 0; l < k; l++) s += ar[l] * br[l];
                long c = q * sc + (long)j * ldc + i;
                store(C, ct, c, *beta == 0 ? *alpha * s : *alpha * s + *beta * load(C, ct, c));
            }
    }
    return 0;
}

int cublasGemmEx(void* h, int ta, int tb, int m, int n, int k, const float* alpha, const void* A, int at, int lda,
                 const void* B, int bt, int ldb, const float* beta, void* C, int ct, int ldc, int, int) {
    return gemm(h, ta, tb, m, n, k, alpha, A, at, lda, 0, B, bt, ldb, 0, beta, C, ct, ldc, 0, 1);
}
int cublasGemmStridedBatchedEx(void* h, int ta, int tb, int m, int n, int k, const float* alpha, const void* A, int at,
                               int lda, long long sa, const void* B, int bt, int ldb, long long sb, const float* beta,
                               void* C, int ct, int ldc, long long sc, int batch, int, int) {
    return gemm(h, ta, tb, m, n, k, alpha, A, at, lda, sa, B, bt, ldb, sb, beta, C, ct, ldc, sc, batch);
}
const char* cublasGetStatusName(int r) {
    return r == 13 ? "CUBLAS_STATUS_EXECUTION_FAILED" : "CUBLAS_STATUS_INVALID_VALUE";
}
const char* cublasGetStatusString(int r) {
    if (r == 13) {
        std::lock_guard<std::mutex> l(mu);
        return last_error.c_str();  // the failed work queued before the GEMM
    }
    return "invalid value (cpusim)";
}

// --- NVRTC: "compiles" to an image that names the simulation ---

static const char image[] = "HPCRUN-CPUSIM";
int nvrtcVersion(int* major, int* minor) {
    *major = 13, *minor = 0;
    return 0;
}
static const int archs[] = {75, 80, 86, 89, 90, 100, 120};
int nvrtcGetNumSupportedArchs(int* n) {
    *n = sizeof(archs) / sizeof(archs[0]);
    return 0;
}
int nvrtcGetSupportedArchs(int* a) {
    memcpy(a, archs, sizeof(archs));
    return 0;
}
int nvrtcCreateProgram(void** p, const char*, const char*, int, const char* const*, const char* const*) {
    *p = &sim_module;
    return 0;
}
int nvrtcDestroyProgram(void**) { return 0; }
int nvrtcCompileProgram(void*, int, const char* const*) { return 0; }
int nvrtcGetProgramLogSize(void*, size_t* n) {
    *n = 1;
    return 0;
}
int nvrtcGetProgramLog(void*, char* s) {
    *s = 0;
    return 0;
}
int nvrtcGetCUBINSize(void*, size_t* n) {
    *n = sizeof(image);
    return 0;
}
int nvrtcGetCUBIN(void*, char* out) {
    memcpy(out, image, sizeof(image));
    return 0;
}
int nvrtcGetPTXSize(void* p, size_t* n) { return nvrtcGetCUBINSize(p, n); }
int nvrtcGetPTX(void* p, char* out) { return nvrtcGetCUBIN(p, out); }
const char* nvrtcGetErrorString(int) { return "NVRTC_ERROR (cpusim)"; }

}  // extern "C"
