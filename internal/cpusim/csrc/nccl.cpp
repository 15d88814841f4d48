// nccl.cpp: a stand-in for libnccl.so.2 on the simulated devices of
// sim.cpp, so that every multi-rank path over NCCL runs without a GPU.
// Ranks are processes (or threads of one process, each with a device of
// its own) that share one POSIX shared-memory segment a communicator,
// named after the unique id. Every entry point hpcrun binds is here, with
// NCCL's prototype and enum values; each call is checked as NCCL checks
// it, then posted on the communicator's device queue and run there, in
// order with the device's other work, as NCCL's kernels run on the
// stream:
//
//   - collectives stage each rank's data in its slot of the segment and
//     reduce it in rank order, rounding to the datatype after each step
//     (avg: each input premultiplied by 1/nranks for floats, as NCCL's
//     PreMulSum, the sum divided for integers); in place as NCCL allows;
//   - ncclSend completes when the peer has received the message (a
//     rendezvous), so two ranks that both send first, outside a group,
//     wait forever as on a GPU; ncclGroupStart/End posts the calls
//     together and progresses them at once;
//   - the descriptors of a collective (kind, datatype, op, count, root)
//     and of a message (count, datatype) are compared across ranks: a
//     mismatch fails every rank's device with one message (NCCL would
//     hang or corrupt memory), and a buffer that is not inside one
//     device allocation is refused (NCCL would fault);
//   - an id used twice by one rank, two ranks on one device, or ranks
//     that disagree on the size fail ncclCommInitRank, as in NCCL;
//   - ncclCommAbort ends the communicator's waits at once.
//
// The details of a failure go to stderr ("NCCL WARN ...") and to
// ncclGetLastError, as NCCL's do.
#include <fcntl.h>
#include <linux/futex.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <memory>
#include <mutex>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "sim.h"

typedef int ncclResult_t;
enum {
    ncclSuccess = 0,
    ncclUnhandledCudaError = 1,
    ncclSystemError = 2,
    ncclInternalError = 3,
    ncclInvalidArgument = 4,
    ncclInvalidUsage = 5,
    ncclRemoteError = 6,
    ncclInProgress = 7,
};

namespace ncclsim {

using cpusim::Dev;

const int kMaxRanks = 64;
const size_t kSlot = 1 << 20;  // a rank's collective staging
const size_t kChan = 64 << 10;  // a message chunk between two ranks
const char kIDMagic[8] = {'n', 'c', 'c', 'l', 's', 'i', 'm', 0};

enum Kind { kAllReduce = 1, kAllGather, kReduceScatter, kBroadcast };
const char* kind_name(int k) {
    static const char* n[] = {"?", "ncclAllReduce", "ncclAllGather", "ncclReduceScatter", "ncclBroadcast"};
    return k >= 1 && k <= 4 ? n[k] : n[0];
}

// The datatypes (ncclDataType_t) and ops (ncclRedOp_t) of NCCL 2.10+.
const int kTypes = 10;
const size_t type_size[kTypes] = {1, 1, 4, 4, 8, 8, 2, 4, 8, 2};
const char* type_name[kTypes] = {"int8", "uint8", "int32", "uint32", "int64", "uint64", "float16", "float32", "float64", "bfloat16"};
enum Op { kSum = 0, kProd, kMax, kMin, kAvg, kOps };
const char* op_name[kOps] = {"sum", "prod", "max", "min", "avg"};

// Desc describes one collective as a rank called it.
struct Desc {
    int32_t kind, dtype, op, root;
    int64_t count;
};

struct RankInfo {
    std::atomic<uint32_t> present;
    int32_t physical, pid;
    char host[64];
    Desc desc;
};

// Chan carries messages from one rank to another, a chunk at a time:
// full while posted > taken.
struct Chan {
    std::atomic<uint64_t> posted, taken;
    int64_t count;  // the message's, in elements
    int32_t dtype;
    int32_t last;  // this chunk ends the message
    uint64_t msg;  // the sender's message number to this peer, from 1
    uint64_t bytes;
};

struct Header {
    std::atomic<int32_t> nranks;  // 0 until the first rank arrives
    std::atomic<int32_t> joined;
    std::atomic<uint32_t> doorbell;  // rung on every change: the futex word
    std::atomic<uint32_t> bar_count, bar_gen;
    RankInfo ranks[kMaxRanks];
};

size_t chan_stride() { return (sizeof(Chan) + 63) / 64 * 64 + kChan; }
size_t segment_size(int n) {
    return (sizeof(Header) + 4095) / 4096 * 4096 + (size_t)n * kSlot + (size_t)n * n * chan_stride();
}

struct Comm {
    int rank = 0, n = 0;
    Dev* dev = nullptr;
    Header* h = nullptr;
    size_t size = 0;
    std::atomic<bool> aborted{false};
    std::atomic<int> async{ncclSuccess};
    std::vector<uint64_t> sent, received;  // messages posted to and from each peer
    std::mutex mu;
    std::condition_variable idle;
    int inflight = 0;  // items on the device queue that use the communicator

    char* slot(int r) { return (char*)h + (sizeof(Header) + 4095) / 4096 * 4096 + (size_t)r * kSlot; }
    Chan* chan(int from, int to) {
        return (Chan*)((char*)h + (sizeof(Header) + 4095) / 4096 * 4096 + (size_t)n * kSlot +
                       ((size_t)from * n + to) * chan_stride());
    }
    char* chan_data(int from, int to) { return (char*)chan(from, to) + (sizeof(Chan) + 63) / 64 * 64; }
    ~Comm() {
        if (h) munmap(h, size);
    }
};

// A communicator handle: the queue's items hold the Comm as long as they
// run, so that an abort never frees what a wait still reads.
struct Handle {
    uint32_t magic = 0x4e43434c;
    std::shared_ptr<Comm> c;
};

std::mutex last_mu;
std::string last_error;
std::mutex used_mu;
std::set<std::string> used_ids;  // id and rank of every communicator this process made

// warn records a failure's detail for ncclGetLastError and prints it as
// NCCL's WARN lines are; it returns the message.
std::string warn(const char* fmt, ...) {
    char buf[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    fprintf(stderr, "NCCL WARN %s\n", buf);
    std::lock_guard<std::mutex> l(last_mu);
    last_error = buf;
    return buf;
}

long futex(std::atomic<uint32_t>* addr, int op, uint32_t val, const struct timespec* ts) {
    return syscall(SYS_futex, (uint32_t*)addr, op, val, ts, nullptr, 0);
}

void ring(Header* h) {
    h->doorbell.fetch_add(1);
    futex(&h->doorbell, FUTEX_WAKE, INT_MAX, nullptr);
}

// wait returns once pred holds (true) or the communicator is aborted
// (false). Waiters sleep on the doorbell, and look again every 2 ms
// whatever it says.
template <class P>
bool wait(Comm* c, P pred) {
    for (int spin = 0;; spin++) {
        uint32_t bell = c->h->doorbell.load();
        if (pred()) return true;
        if (c->aborted) return false;
        if (spin < 16) {
            sched_yield();
            continue;
        }
        struct timespec ts = {0, 2000000};
        futex(&c->h->doorbell, FUTEX_WAIT, bell, &ts);
    }
}

bool barrier(Comm* c) {
    Header* h = c->h;
    uint32_t gen = h->bar_gen.load();
    if ((int)h->bar_count.fetch_add(1) + 1 == c->n) {
        h->bar_count.store(0);
        h->bar_gen.fetch_add(1);
        ring(h);
        return true;
    }
    return wait(c, [&] { return h->bar_gen.load() != gen; });
}

// --- arithmetic in each datatype ---

struct F16 {
    uint16_t v;
};
struct BF16 {
    uint16_t v;
};

template <class T>
struct Num {
    typedef T A;
    static A get(T x) { return x; }
    static T put(A a) { return a; }
};
template <>
struct Num<F16> {
    typedef float A;
    static float get(F16 x) {
        _Float16 h;
        memcpy(&h, &x.v, 2);
        return (float)h;
    }
    static F16 put(float a) {
        _Float16 h = (_Float16)a;
        F16 r;
        memcpy(&r.v, &h, 2);
        return r;
    }
};
template <>
struct Num<BF16> {
    typedef float A;
    static float get(BF16 x) {
        uint32_t u = (uint32_t)x.v << 16;
        float f;
        memcpy(&f, &u, 4);
        return f;
    }
    static BF16 put(float a) {  // to nearest, ties to even; a NaN stays quiet
        uint32_t u;
        memcpy(&u, &a, 4);
        if ((u & 0x7fffffffu) > 0x7f800000u) return BF16{(uint16_t)((u >> 16) | 0x40u)};
        u += 0x7fffu + ((u >> 16) & 1u);
        return BF16{(uint16_t)(u >> 16)};
    }
};

template <class T>
bool is_float() {
    return std::is_same<T, float>::value || std::is_same<T, double>::value || std::is_same<T, F16>::value ||
           std::is_same<T, BF16>::value;
}

// reduce sets out[i] to the reduction of in[0][i], in[1][i], ... in rank
// order, storing each partial result in T.
template <class T>
void reduce_t(int op, const char* const* in, int n, char* outp, size_t cnt) {
    typedef typename Num<T>::A A;
    const T* const* x = (const T* const*)in;
    T* out = (T*)outp;
    bool fl = is_float<T>();
    for (size_t i = 0; i < cnt; i++) {
        auto term = [&](int r) {
            A v = Num<T>::get(x[r][i]);
            if (op == kAvg && fl) v = Num<T>::get(Num<T>::put(v * (A)(1.0 / n)));
            return v;
        };
        A acc = term(0);
        for (int r = 1; r < n; r++) {
            A v = term(r), s;
            switch (op) {
            case kProd:
                s = acc * v;
                break;
            case kMax:
                s = std::max(acc, v);
                break;
            case kMin:
                s = std::min(acc, v);
                break;
            default:
                s = acc + v;
            }
            acc = Num<T>::get(Num<T>::put(s));
        }
        if (op == kAvg && !fl) acc = acc / (A)n;
        out[i] = Num<T>::put(acc);
    }
}

void reduce(int dtype, int op, const char* const* in, int n, char* out, size_t cnt) {
    switch (dtype) {
    case 0: return reduce_t<int8_t>(op, in, n, out, cnt);
    case 1: return reduce_t<uint8_t>(op, in, n, out, cnt);
    case 2: return reduce_t<int32_t>(op, in, n, out, cnt);
    case 3: return reduce_t<uint32_t>(op, in, n, out, cnt);
    case 4: return reduce_t<int64_t>(op, in, n, out, cnt);
    case 5: return reduce_t<uint64_t>(op, in, n, out, cnt);
    case 6: return reduce_t<F16>(op, in, n, out, cnt);
    case 7: return reduce_t<float>(op, in, n, out, cnt);
    case 8: return reduce_t<double>(op, in, n, out, cnt);
    case 9: return reduce_t<BF16>(op, in, n, out, cnt);
    }
}

std::string describe(const Desc& d) {
    char b[160];
    if (d.kind == kAllReduce || d.kind == kReduceScatter)
        snprintf(b, sizeof b, "%s of %lld %s (%s)", kind_name(d.kind), (long long)d.count, type_name[d.dtype], op_name[d.op]);
    else if (d.kind == kBroadcast)
        snprintf(b, sizeof b, "%s of %lld %s from root %d", kind_name(d.kind), (long long)d.count, type_name[d.dtype], d.root);
    else
        snprintf(b, sizeof b, "%s of %lld %s", kind_name(d.kind), (long long)d.count, type_name[d.dtype]);
    return b;
}

// collective runs one collective on the device queue: it returns "" or
// why every rank failed.
std::string collective(Comm* c, Desc d, const char* send, char* recv) {
    Header* h = c->h;
    int me = c->rank, n = c->n;
    h->ranks[me].desc = d;
    if (!barrier(c)) return "";
    for (int r = 0; r < n; r++) {
        const Desc& o = h->ranks[r].desc;
        if (o.kind != d.kind || o.dtype != d.dtype || o.count != d.count ||
            ((d.kind == kAllReduce || d.kind == kReduceScatter) && o.op != d.op) ||
            (d.kind == kBroadcast && o.root != d.root)) {
            c->async = ncclInvalidUsage;
            return warn("collectives do not match across ranks: rank %d called %s, rank %d %s", me, describe(d).c_str(), r,
                        describe(o).c_str());
        }
    }
    size_t es = type_size[d.dtype], count = d.count;
    size_t per = d.kind == kReduceScatter ? kSlot / es / n : kSlot / es;  // elements a chunk
    std::vector<const char*> in(n);
    for (size_t off = 0; off == 0 || off < count; off += per) {
        size_t m = std::min(per, count - off);
        char* mine = c->slot(me);
        switch (d.kind) {
        case kAllReduce:
        case kAllGather:
            memcpy(mine, send + off * es, m * es);
            break;
        case kBroadcast:
            if (me == d.root) memcpy(mine, send + off * es, m * es);
            break;
        case kReduceScatter:
            for (int j = 0; j < n; j++) memcpy(mine + j * m * es, send + (j * count + off) * es, m * es);
            break;
        }
        if (!barrier(c)) return "";
        switch (d.kind) {
        case kAllReduce:
            for (int r = 0; r < n; r++) in[r] = c->slot(r);
            reduce(d.dtype, d.op, in.data(), n, recv + off * es, m);
            break;
        case kAllGather:
            for (int r = 0; r < n; r++) memcpy(recv + (r * count + off) * es, c->slot(r), m * es);
            break;
        case kBroadcast:
            memcpy(recv + off * es, c->slot(d.root), m * es);
            break;
        case kReduceScatter:
            for (int r = 0; r < n; r++) in[r] = c->slot(r) + me * m * es;
            reduce(d.dtype, d.op, in.data(), n, recv + off * es, m);
            break;
        }
        if (!barrier(c)) return "";
        if (count == 0) break;
    }
    return "";
}

// P2P is one ncclSend or ncclRecv in progress.
struct P2P {
    std::shared_ptr<Comm> c;
    bool send;
    int peer, dtype;
    char* buf;
    size_t count;
    uint64_t msg;  // the message's number between the two ranks
    size_t done = 0;
    bool posted_last = false, finished = false;
    uint64_t last_chunk = 0;  // the channel's posted count after this message's last chunk
};

// progress moves p as far as it can without waiting; it returns "" or why
// it failed.
std::string progress(P2P& p) {
    Comm* c = p.c.get();
    size_t es = type_size[p.dtype], total = p.count * es;
    if (p.send) {
        Chan* ch = c->chan(c->rank, p.peer);
        while (!p.posted_last) {
            uint64_t posted = ch->posted.load();
            if (ch->taken.load() != posted) return "";  // the peer has not taken the last chunk yet
            size_t m = std::min(kChan, total - p.done);
            memcpy(c->chan_data(c->rank, p.peer), p.buf + p.done, m);
            ch->count = (int64_t)p.count;
            ch->dtype = p.dtype;
            ch->msg = p.msg;
            ch->bytes = m;
            p.done += m;
            ch->last = p.done == total;
            p.posted_last = ch->last;
            p.last_chunk = posted + 1;
            ch->posted.store(posted + 1);
            ring(c->h);
        }
        if (ch->taken.load() >= p.last_chunk) p.finished = true;
        return "";
    }
    Chan* ch = c->chan(p.peer, c->rank);
    while (!p.finished) {
        uint64_t taken = ch->taken.load();
        if (ch->posted.load() == taken) return "";
        if (ch->msg != p.msg || ch->count != (int64_t)p.count || ch->dtype != p.dtype) {
            c->async = ncclInvalidUsage;
            return warn("ncclRecv of %zu %s from rank %d (message %llu between them) met ncclSend of %lld %s (message %llu)",
                        p.count, type_name[p.dtype], p.peer, (unsigned long long)p.msg, (long long)ch->count,
                        ch->dtype >= 0 && ch->dtype < kTypes ? type_name[ch->dtype] : "?", (unsigned long long)ch->msg);
        }
        memcpy(p.buf + p.done, c->chan_data(p.peer, c->rank), ch->bytes);
        p.done += ch->bytes;
        p.finished = ch->last;
        ch->taken.store(taken + 1);
        ring(c->h);
    }
    return "";
}

// run_p2p progresses the transfers together until each is done.
std::string run_p2p(std::vector<P2P>& ops) {
    Header* h = ops[0].c->h;  // the doorbell to sleep on
    for (;;) {
        uint32_t bell = h->doorbell.load();
        bool all = true, moved = false;
        for (auto& p : ops) {
            if (p.c->aborted) return "";
            if (p.finished) continue;
            size_t before = p.done;
            bool last = p.posted_last;
            std::string e = progress(p);
            if (!e.empty()) return e;
            moved |= p.finished || p.done != before || p.posted_last != last;
            all &= p.finished;
        }
        if (all) return "";
        if (!moved) {
            struct timespec ts = {0, 2000000};
            futex(&h->doorbell, FUTEX_WAIT, bell, &ts);
        }
    }
}

// Call is a collective or transfer posted and not yet on the queue.
struct Call {
    std::shared_ptr<Comm> c;
    bool p2p;
    Desc d;
    const char* send;
    char* recv;
    P2P t;
};

thread_local int group_depth;
thread_local std::vector<Call> group_calls;
thread_local ncclResult_t group_error;

// hold counts an item on c's queue; release ends it.
void hold(Comm* c) {
    std::lock_guard<std::mutex> l(c->mu);
    c->inflight++;
}
void release(Comm* c) {
    std::lock_guard<std::mutex> l(c->mu);
    if (--c->inflight == 0) c->idle.notify_all();
}

// post puts calls on their device's queue as one item.
void post(std::vector<Call> calls) {
    Dev* dev = calls[0].c->dev;
    for (auto& k : calls) hold(k.c.get());
    cpusim::enqueue(dev, [calls = std::move(calls)]() mutable {
        std::string err;
        std::vector<P2P> ts;
        for (auto& k : calls) {
            if (k.p2p) {
                ts.push_back(k.t);
            } else if (err.empty() && !k.c->aborted) {
                err = collective(k.c.get(), k.d, k.send, k.recv);
            }
        }
        if (err.empty() && !ts.empty()) err = run_p2p(ts);
        for (auto& k : calls) release(k.c.get());
        return err;
    });
}

ncclResult_t submit(Call k) {
    if (group_depth > 0) {
        group_calls.push_back(std::move(k));
        return ncclSuccess;
    }
    std::vector<Call> one;
    one.push_back(std::move(k));
    post(std::move(one));
    return ncclSuccess;
}

Comm* comm_of(void* handle) {
    Handle* h = (Handle*)handle;
    if (!h || h->magic != 0x4e43434c || !h->c) return nullptr;
    return h->c.get();
}

// check_buffer refuses a buffer that is not inside one device allocation.
ncclResult_t check_buffer(const char* fn, const char* what, const void* p, size_t count, int dtype) {
    size_t bytes = count * type_size[dtype];
    if (count == 0) return ncclSuccess;
    if (!p) {
        warn("%s: %s is null", fn, what);
        return ncclInvalidArgument;
    }
    if (!cpusim::allocation_fits(p, bytes)) {
        warn("%s: %s %p: %zu elements of %s (%zu bytes) are not inside one device allocation", fn, what, p, count,
             type_name[dtype], bytes);
        return ncclInvalidArgument;
    }
    return ncclSuccess;
}

ncclResult_t check_args(const char* fn, void* comm, int dtype, int op) {
    if (!comm_of(comm)) {
        warn("%s: invalid communicator", fn);
        return ncclInvalidArgument;
    }
    if (dtype < 0 || dtype >= kTypes) {
        warn("%s: invalid type %d", fn, dtype);
        return ncclInvalidArgument;
    }
    if (op < 0 || op >= kOps) {
        warn("%s: invalid reduction operation %d", fn, op);
        return ncclInvalidArgument;
    }
    return ncclSuccess;
}

ncclResult_t fail_group(ncclResult_t r) {
    if (group_depth > 0 && r != ncclSuccess) group_error = r;
    return r;
}

ncclResult_t collective_call(const char* fn, int kind, const void* send, void* recv, size_t count, int dtype, int op,
                             int root, void* comm) {
    if (ncclResult_t r = check_args(fn, comm, dtype, op)) return fail_group(r);
    auto c = ((Handle*)comm)->c;
    size_t sendCount = count, recvCount = count;
    if (kind == kAllGather) recvCount = count * c->n;
    if (kind == kReduceScatter) sendCount = count * c->n;
    if (kind == kBroadcast && (root < 0 || root >= c->n)) {
        warn("%s: invalid root %d (%d ranks)", fn, root, c->n);
        return fail_group(ncclInvalidArgument);
    }
    if (kind != kBroadcast || c->rank == root)
        if (ncclResult_t r = check_buffer(fn, "sendbuff", send, sendCount, dtype)) return fail_group(r);
    if (ncclResult_t r = check_buffer(fn, "recvbuff", recv, recvCount, dtype)) return fail_group(r);
    Call k{c, false, Desc{kind, dtype, kind == kAllGather || kind == kBroadcast ? 0 : op, root, (int64_t)count},
           (const char*)send, (char*)recv, P2P{}};
    return submit(std::move(k));
}

ncclResult_t p2p_call(const char* fn, bool send, void* buf, size_t count, int dtype, int peer, void* comm) {
    if (ncclResult_t r = check_args(fn, comm, dtype, 0)) return fail_group(r);
    auto c = ((Handle*)comm)->c;
    if (peer < 0 || peer >= c->n) {
        warn("%s: invalid peer %d (%d ranks)", fn, peer, c->n);
        return fail_group(ncclInvalidArgument);
    }
    if (ncclResult_t r = check_buffer(fn, send ? "sendbuff" : "recvbuff", buf, count, dtype)) return fail_group(r);
    P2P t;
    t.c = c, t.send = send, t.peer = peer, t.dtype = dtype, t.buf = (char*)buf, t.count = count;
    {
        std::lock_guard<std::mutex> l(c->mu);
        t.msg = send ? ++c->sent[peer] : ++c->received[peer];
    }
    Call k{c, true, Desc{}, nullptr, nullptr, t};
    return submit(std::move(k));
}

std::string hostname() {
    char h[64] = {0};
    gethostname(h, sizeof h - 1);
    return h;
}

}  // namespace ncclsim

using namespace ncclsim;

extern "C" {

struct ncclUniqueId {
    char internal[128];
};

ncclResult_t ncclGetVersion(int* v) {
    *v = 22304;  // 2.23.4
    return ncclSuccess;
}

const char* ncclGetErrorString(ncclResult_t r) {
    switch (r) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
    case ncclSystemError: return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
    case ncclInternalError: return "internal error - please report this issue to the NCCL developers";
    case ncclInvalidArgument: return "invalid argument (run with NCCL_DEBUG=WARN for details)";
    case ncclInvalidUsage: return "invalid usage (run with NCCL_DEBUG=WARN for details)";
    case ncclRemoteError: return "remote process exited or there was a network error";
    case ncclInProgress: return "NCCL operation in progress";
    }
    return "unknown result code";
}

const char* ncclGetLastError(void*) {
    std::lock_guard<std::mutex> l(last_mu);
    return last_error.c_str();
}

ncclResult_t ncclGetUniqueId(ncclUniqueId* id) {
    memset(id, 0, sizeof *id);
    memcpy(id->internal, kIDMagic, 8);
    std::random_device rd;
    for (int i = 8; i < 24; i += 4) {
        uint32_t v = rd();
        memcpy(id->internal + i, &v, 4);
    }
    return ncclSuccess;
}

ncclResult_t ncclCommInitRank(void** out, int nranks, ncclUniqueId id, int rank) {
    const char* fn = "ncclCommInitRank";
    if (!out) return ncclInvalidArgument;
    if (nranks < 1 || nranks > kMaxRanks) {
        warn("%s: nranks %d: this stand-in supports 1 to %d", fn, nranks, kMaxRanks);
        return ncclInvalidArgument;
    }
    if (rank < 0 || rank >= nranks) {
        warn("%s: rank %d is not in [0, %d)", fn, rank, nranks);
        return ncclInvalidArgument;
    }
    if (memcmp(id.internal, kIDMagic, 8) != 0) {
        warn("%s: the unique id did not come from ncclGetUniqueId", fn);
        return ncclInvalidArgument;
    }
    char name[64] = "/hpcrun-ncclsim-";
    for (int i = 8; i < 24; i++) snprintf(name + strlen(name), 3, "%02x", (unsigned char)id.internal[i]);
    {
        std::lock_guard<std::mutex> l(used_mu);
        if (!used_ids.insert(std::string(name) + "/" + std::to_string(rank)).second) {
            warn("%s: rank %d already made a communicator from this unique id: an id serves one communicator", fn, rank);
            return ncclInvalidUsage;
        }
    }
    auto c = std::make_shared<Comm>();
    c->rank = rank, c->n = nranks, c->dev = cpusim::current_device();
    c->sent.assign(nranks, 0);
    c->received.assign(nranks, 0);
    c->size = segment_size(nranks);
    int fd = shm_open(name, O_CREAT | O_RDWR, 0600);
    if (fd < 0) {
        warn("%s: shm_open %s: %s", fn, name, strerror(errno));
        return ncclSystemError;
    }
    if (ftruncate(fd, (off_t)c->size) != 0) {
        warn("%s: ftruncate %s: %s", fn, name, strerror(errno));
        close(fd);
        return ncclSystemError;
    }
    void* m = mmap(nullptr, c->size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (m == MAP_FAILED) {
        warn("%s: mmap %s: %s", fn, name, strerror(errno));
        return ncclSystemError;
    }
    c->h = (Header*)m;
    Header* h = c->h;
    int32_t zero = 0;
    if (!h->nranks.compare_exchange_strong(zero, nranks) && zero != nranks) {
        warn("%s: rank %d says the communicator has %d ranks, a rank before it said %d", fn, rank, nranks, zero);
        return ncclInvalidUsage;
    }
    uint32_t absent = 0;
    if (!h->ranks[rank].present.compare_exchange_strong(absent, 1)) {
        warn("%s: rank %d joined this communicator twice (a unique id used again?)", fn, rank);
        return ncclInvalidUsage;
    }
    RankInfo& me = h->ranks[rank];
    me.physical = c->dev->physical;
    me.pid = getpid();
    snprintf(me.host, sizeof me.host, "%s", hostname().c_str());
    h->joined.fetch_add(1);
    ring(h);
    wait(c.get(), [&] { return h->joined.load() == nranks; });  // as NCCL, until every rank comes
    for (int r = 0; r < nranks; r++)
        if (r != rank && h->ranks[r].physical == me.physical && !strcmp(h->ranks[r].host, me.host)) {
            warn("%s: Duplicate GPU detected : rank %d and rank %d both on CUDA device %d of %s", fn, rank, r,
                 me.physical, me.host);
            return ncclInvalidUsage;
        }
    barrier(c.get());
    if (rank == 0) shm_unlink(name);  // everyone has it mapped
    *out = new Handle{0x4e43434c, c};
    return ncclSuccess;
}

ncclResult_t ncclCommInitRankConfig(void** out, int nranks, ncclUniqueId id, int rank, void*) {
    return ncclCommInitRank(out, nranks, id, rank);
}

ncclResult_t ncclCommCount(void* comm, int* n) {
    Comm* c = comm_of(comm);
    if (!c) return ncclInvalidArgument;
    *n = c->n;
    return ncclSuccess;
}

ncclResult_t ncclCommUserRank(void* comm, int* r) {
    Comm* c = comm_of(comm);
    if (!c) return ncclInvalidArgument;
    *r = c->rank;
    return ncclSuccess;
}

ncclResult_t ncclCommGetAsyncError(void* comm, ncclResult_t* r) {
    Comm* c = comm_of(comm);
    if (!c) return ncclInvalidArgument;
    *r = c->async.load();
    return ncclSuccess;
}

// ncclCommDestroy waits for the communicator's queued work, then frees it.
ncclResult_t ncclCommDestroy(void* comm) {
    Comm* c = comm_of(comm);
    if (!c) return ncclInvalidArgument;
    {
        std::unique_lock<std::mutex> l(c->mu);
        c->idle.wait(l, [&] { return c->inflight == 0; });
    }
    Handle* h = (Handle*)comm;
    h->magic = 0;
    delete h;
    return ncclSuccess;
}

// ncclCommAbort ends the communicator's waits and frees it once its
// queued work has returned.
ncclResult_t ncclCommAbort(void* comm) {
    Comm* c = comm_of(comm);
    if (!c) return ncclInvalidArgument;
    c->aborted = true;
    ring(c->h);
    Handle* h = (Handle*)comm;
    h->magic = 0;
    delete h;
    return ncclSuccess;
}

ncclResult_t ncclAllReduce(const void* send, void* recv, size_t count, int dtype, int op, void* comm, void*) {
    return collective_call("ncclAllReduce", kAllReduce, send, recv, count, dtype, op, 0, comm);
}
ncclResult_t ncclAllGather(const void* send, void* recv, size_t count, int dtype, void* comm, void*) {
    return collective_call("ncclAllGather", kAllGather, send, recv, count, dtype, 0, 0, comm);
}
ncclResult_t ncclReduceScatter(const void* send, void* recv, size_t count, int dtype, int op, void* comm, void*) {
    return collective_call("ncclReduceScatter", kReduceScatter, send, recv, count, dtype, op, 0, comm);
}
ncclResult_t ncclBroadcast(const void* send, void* recv, size_t count, int dtype, int root, void* comm, void*) {
    return collective_call("ncclBroadcast", kBroadcast, send, recv, count, dtype, 0, root, comm);
}
ncclResult_t ncclSend(const void* buf, size_t count, int dtype, int peer, void* comm, void*) {
    return p2p_call("ncclSend", true, (void*)buf, count, dtype, peer, comm);
}
ncclResult_t ncclRecv(void* buf, size_t count, int dtype, int peer, void* comm, void*) {
    return p2p_call("ncclRecv", false, buf, count, dtype, peer, comm);
}

ncclResult_t ncclGroupStart() {
    if (group_depth++ == 0) group_error = ncclSuccess;
    return ncclSuccess;
}

// ncclGroupEnd posts the group's calls, one queue item a device; a call
// that failed inside the group fails the group, and none is posted.
ncclResult_t ncclGroupEnd() {
    if (group_depth <= 0) {
        warn("ncclGroupEnd: not in a group");
        return ncclInvalidUsage;
    }
    if (--group_depth > 0) return ncclSuccess;
    std::vector<Call> calls;
    calls.swap(group_calls);
    if (group_error != ncclSuccess) return group_error;
    while (!calls.empty()) {
        Dev* d = calls[0].c->dev;
        std::vector<Call> same, rest;
        for (auto& k : calls) (k.c->dev == d ? same : rest).push_back(std::move(k));
        post(std::move(same));
        calls.swap(rest);
    }
    return ncclSuccess;
}

}  // extern "C"
