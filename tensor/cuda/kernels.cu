// Kernels of the hpcrun CUDA device: every Device method but GEMM. Compiled
// at run time by NVRTC (no headers: only built-in device functions), one
// extern "C" entry point per kernel so that cuModuleGetFunction finds it by
// name. Semantics follow the CPU device (tensor/cpu_kernels.go) exactly;
// the Go side checks shapes before launching. Sizes are long long where a
// tensor may pass 2^31 elements, int for row lengths.
//
// Launch shapes (see kernels.go): elementwise kernels take a grid-stride
// loop over n; row kernels take one block per row (grid-stride over rows)
// with blockDim a multiple of 32, at most 1024 (ROW_BOUNDS). kernels.go's
// kernels table holds each kernel's largest launch; a test compiles this
// file for sm_70, sm_80 and sm_90 and checks the register counts allow it.

typedef unsigned short bf16_t;

// HPCRUN_DYNAMIC_SHARED declares a kernel's dynamic shared memory as an
// array of T (the CPU simulation defines it its own way).
#ifndef HPCRUN_DYNAMIC_SHARED
#define HPCRUN_DYNAMIC_SHARED(T, name) extern __shared__ T name[]
#endif

#define NEG_INF __int_as_float(0xff800000)
#define FULL_MASK 0xffffffffu

__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(FULL_MASK, v, o);
    return v;
}

__device__ __forceinline__ double warp_sum_d(double v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(FULL_MASK, v, o);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(FULL_MASK, v, o));
    return v;
}

// block_sum returns the sum of v over the block to every thread. sh holds
// 32 floats; consecutive calls may reuse it.
__device__ float block_sum(float v, float* sh) {
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
    v = warp_sum(v);
    __syncthreads();
    if (lane == 0) sh[w] = v;
    __syncthreads();
    v = lane < nw ? sh[lane] : 0.f;
    return warp_sum(v);
}

__device__ double block_sum_d(double v, double* sh) {
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
    v = warp_sum_d(v);
    __syncthreads();
    if (lane == 0) sh[w] = v;
    __syncthreads();
    v = lane < nw ? sh[lane] : 0.0;
    return warp_sum_d(v);
}

__device__ float block_max(float v, float* sh) {
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
    v = warp_max(v);
    __syncthreads();
    if (lane == 0) sh[w] = v;
    __syncthreads();
    v = lane < nw ? sh[lane] : NEG_INF;
    return warp_max(v);
}

// ROW_BOUNDS marks the kernels launched with up to 1024 threads a block
// (one block per row, and bias_backward's 32x32): without it the compiler
// may give a thread more than 64 registers, and a 1024-thread launch then
// fails with CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES (65536 registers a block).
#define MAX_ROW_THREADS 1024
#define ROW_BOUNDS __launch_bounds__(MAX_ROW_THREADS)

#define GRID_STRIDE(i, n) \
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < (n); i += (long long)gridDim.x * blockDim.x)

// --- elementwise ---

extern "C" __global__ void fill_f32(float* x, float v, long long n) {
    GRID_STRIDE(i, n) x[i] = v;
}

extern "C" __global__ void add_f32(float* out, const float* a, const float* b, long long n) {
    GRID_STRIDE(i, n) out[i] = a[i] + b[i];
}

extern "C" __global__ void scale_f32(float* x, float alpha, long long n) {
    GRID_STRIDE(i, n) x[i] *= alpha;
}

// block2d copies (accumulate 0) or accumulates alpha* a (rows,cols) block.
extern "C" __global__ void block2d_f32(float* dst, long long ldDst, const float* src, long long ldSrc,
                                       long long rows, int cols, float alpha, int accumulate) {
    long long n = rows * cols;
    GRID_STRIDE(k, n) {
        long long i = k / cols, j = k - i * cols;
        float v = src[i * ldSrc + j];
        if (accumulate) dst[i * ldDst + j] += alpha * v;
        else dst[i * ldDst + j] = v;
    }
}

// bf16_round rounds to nearest even; NaNs stay NaNs.
__device__ __forceinline__ bf16_t bf16_round(float f) {
    unsigned int u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (bf16_t)((u >> 16) | 0x40u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (bf16_t)(u >> 16);
}

// store_out writes a float32 result as the output's dtype: as is, or
// rounded to bfloat16 (an activation that only products read); load_in
// reads an input as float32, a bfloat16 one widened.
__device__ __forceinline__ void store_out(float* p, float v) { *p = v; }
__device__ __forceinline__ void store_out(bf16_t* p, float v) { *p = bf16_round(v); }
__device__ __forceinline__ float load_in(const float* p) { return *p; }
__device__ __forceinline__ float load_in(const bf16_t* p) { return __uint_as_float((unsigned)*p << 16); }
// add_out adds v to *p, rounding a bfloat16 *p once.
template <typename T>
__device__ __forceinline__ void add_out(T* p, float v) { store_out(p, load_in(p) + v); }

// add_bf16_from_bf16: out and a stored as bfloat16 (a residual stream), b
// float32; the float32 sum rounded. add_bf16: a float32 too (the
// embeddings' sum into the stream).
template <typename A>
__device__ void add_into_bf16(bf16_t* out, const A* a, const float* b, long long n) {
    GRID_STRIDE(i, n) out[i] = bf16_round(load_in(a + i) + b[i]);
}
extern "C" __global__ void add_bf16_from_bf16(bf16_t* out, const bf16_t* a, const float* b, long long n) {
    add_into_bf16(out, a, b, n);
}
extern "C" __global__ void add_bf16(bf16_t* out, const float* a, const float* b, long long n) { add_into_bf16(out, a, b, n); }

// axpy: y += alpha * x, either stored as bfloat16 (a residual stream's
// gradient): x widened, y widened, added to and rounded once. Y is y's
// dtype, X x's.
template <typename Y, typename X>
__device__ void axpy(Y* y, float alpha, const X* x, long long n) {
    GRID_STRIDE(i, n) add_out(y + i, alpha * load_in(x + i));
}
extern "C" __global__ void axpy_f32(float* y, float alpha, const float* x, long long n) { axpy(y, alpha, x, n); }
extern "C" __global__ void axpy_f32_from_bf16(float* y, float alpha, const bf16_t* x, long long n) {
    axpy(y, alpha, x, n);
}
extern "C" __global__ void axpy_bf16(bf16_t* y, float alpha, const float* x, long long n) { axpy(y, alpha, x, n); }
extern "C" __global__ void axpy_bf16_from_bf16(bf16_t* y, float alpha, const bf16_t* x, long long n) {
    axpy(y, alpha, x, n);
}

// fill_bf16 is fill_f32 of a bfloat16 tensor: v rounded once.
extern "C" __global__ void fill_bf16(bf16_t* x, float v, long long n) {
    bf16_t h = bf16_round(v);
    GRID_STRIDE(i, n) x[i] = h;
}

// f32_to_bf16 rounds batch (rows, cols) matrices of in, ld apart in rows
// and stride apart, into out packed: rows of cols, matrices rows*cols apart.
// Only the elements of the matrices are read, however far apart they lie
// (a head's columns of a (T, 3C) tensor). Blocks are (x: columns, y: rows);
// the grid's y walks the batch, so there is no division or modulo per
// element.
extern "C" __global__ void f32_to_bf16(bf16_t* out, const float* in, long long rows, long long cols, long long ld,
                                       long long stride, long long batch) {
    for (long long b = blockIdx.y; b < batch; b += gridDim.y) {
        for (long long i = (long long)blockIdx.x * blockDim.y + threadIdx.y; i < rows; i += (long long)gridDim.x * blockDim.y) {
            const float* src = in + b * stride + i * ld;
            bf16_t* dst = out + (b * rows + i) * cols;
            for (long long j = threadIdx.x; j < cols; j += blockDim.x) dst[j] = bf16_round(src[j]);
        }
    }
}

// copy2d_bf16 copies a (rows,cols) block of bfloat16 elements (Copy2D
// of a bf16 qkv into a KV cache).
extern "C" __global__ void copy2d_bf16(bf16_t* dst, long long ldDst, const bf16_t* src, long long ldSrc, long long rows,
                                       int cols) {
    long long n = rows * cols;
    GRID_STRIDE(k, n) {
        long long i = k / cols, j = k - i * cols;
        dst[i * ldDst + j] = src[i * ldSrc + j];
    }
}

// round_bf16 stores n floats of in as bfloat16 (Copy to a bfloat16
// tensor); widen_bf16 is its way back, exact.
extern "C" __global__ void round_bf16(bf16_t* out, const float* in, long long n) {
    GRID_STRIDE(i, n) out[i] = bf16_round(in[i]);
}

extern "C" __global__ void widen_bf16(float* out, const bf16_t* in, long long n) {
    GRID_STRIDE(i, n) out[i] = __uint_as_float((unsigned)in[i] << 16);
}

// --- bias ---

// add_bias: out is (N,OC), bias is (OC).
extern "C" __global__ void add_bias_f32(float* out, const float* bias, long long n, int oc) {
    GRID_STRIDE(i, n) out[i] += bias[i % oc];
}

// add_bias_bf16: a bfloat16 out, widened, added to and rounded again.
extern "C" __global__ void add_bias_bf16(bf16_t* out, const float* bias, long long n, int oc) {
    GRID_STRIDE(i, n) out[i] = bf16_round(load_in(out + i) + bias[i % oc]);
}

// bias_backward: the first of two deterministic stages of dbias += the
// column sums of dout (N,OC). Blocks (32,32) on a grid (ceil(OC/32),
// chunks): x is a column within the block's 32, and the rows are dealt
// to the chunks 32 at a time, so that a few columns still fill the GPU;
// part[chunk*OC + j] receives chunk's sum of column j, and
// rmsnorm_param_grads_f32 adds the chunks into dbias in order.
// dout may be bfloat16 (widened; the sums in float32).
template <typename In>
__device__ __forceinline__ void bias_backward(float* part, const In* dout, long long rows, int oc) {
    __shared__ float sh[32][33];
    int j = blockIdx.x * 32 + threadIdx.x;
    float s = 0.f;
    if (j < oc) {
        for (long long r = (long long)blockIdx.y * blockDim.y + threadIdx.y; r < rows; r += (long long)gridDim.y * blockDim.y)
            s += load_in(dout + r * oc + j);
    }
    sh[threadIdx.y][threadIdx.x] = s;
    __syncthreads();
    if (threadIdx.y == 0 && j < oc) {
        float t = 0.f;
        for (int y = 0; y < blockDim.y; y++) t += sh[y][threadIdx.x];
        part[(long long)blockIdx.y * oc + j] = t;
    }
}
extern "C" __global__ void ROW_BOUNDS bias_backward_f32(float* part, const float* dout, long long rows, int oc) {
    bias_backward(part, dout, rows, oc);
}
extern "C" __global__ void ROW_BOUNDS bias_backward_f32_from_bf16(float* part, const bf16_t* dout, long long rows, int oc) {
    bias_backward(part, dout, rows, oc);
}

// --- embedding ---

// embedding_forward: out (N,C) = table (V,C) rows ids[i]-start, zeros
// outside. O is out's dtype (a bfloat16 residual stream: rounded).
template <typename O>
__device__ void embedding_forward(O* out, const int* ids, const float* table, long long rows, int c, long long v,
                                  long long start) {
    for (long long i = blockIdx.x; i < rows; i += gridDim.x) {
        long long id = (long long)ids[i] - start;
        O* o = out + i * c;
        if (id >= 0 && id < v) {
            const float* t = table + id * c;
            for (int j = threadIdx.x; j < c; j += blockDim.x) store_out(o + j, t[j]);
        } else {
            for (int j = threadIdx.x; j < c; j += blockDim.x) store_out(o + j, 0.f);
        }
    }
}
#define EMB_FWD_ARGS(O) O *out, const int *ids, const float *table, long long rows, int c, long long v, long long start
#define EMB_FWD_CALL out, ids, table, rows, c, v, start
extern "C" __global__ void ROW_BOUNDS embedding_forward_f32(EMB_FWD_ARGS(float)) { embedding_forward(EMB_FWD_CALL); }
extern "C" __global__ void ROW_BOUNDS embedding_forward_bf16(EMB_FWD_ARGS(bf16_t)) { embedding_forward(EMB_FWD_CALL); }

// embedding_backward: dtable[ids[i]-start] += dout[i]; repeated ids add
// with atomics. G is dout's dtype (a bfloat16 residual stream's gradient
// widened).
template <typename G>
__device__ void embedding_backward(float* dtable, const G* dout, const int* ids, long long rows, int c, long long v,
                                   long long start) {
    for (long long i = blockIdx.x; i < rows; i += gridDim.x) {
        long long id = (long long)ids[i] - start;
        if (id < 0 || id >= v) continue;
        float* d = dtable + id * c;
        const G* g = dout + i * c;
        for (int j = threadIdx.x; j < c; j += blockDim.x) atomicAdd(d + j, load_in(g + j));
    }
}
#define EMB_BWD_ARGS(G) float *dtable, const G *dout, const int *ids, long long rows, int c, long long v, long long start
#define EMB_BWD_CALL dtable, dout, ids, rows, c, v, start
extern "C" __global__ void ROW_BOUNDS embedding_backward_f32(EMB_BWD_ARGS(float)) { embedding_backward(EMB_BWD_CALL); }
extern "C" __global__ void ROW_BOUNDS embedding_backward_f32_from_bf16(EMB_BWD_ARGS(bf16_t)) {
    embedding_backward(EMB_BWD_CALL);
}

// --- layernorm ---

// layernorm_forward: one block per row of inp (N,C); mean and rstd are (N).
// With an addend (a residual add fused in front) the row normalised is
// inp + addend, written into sum first (rounded where sum is bfloat16)
// and read back: each thread reads back only the columns it wrote. T is
// out's dtype, X inp's, S sum's.

template <typename X, typename S>
__device__ __forceinline__ void add_row(S* sum, const X* inp, const float* addend, long long i, int c) {
    const X* x = inp + i * c;
    const float* y = addend + i * c;
    S* z = sum + i * c;
    for (int j = threadIdx.x; j < c; j += blockDim.x) store_out(z + j, load_in(x + j) + y[j]);
}

template <typename T, typename R>
__device__ void layernorm_row(T* o, float* mean, float* rstd, const R* x, const float* weight, const float* bias,
                              long long i, int c, float eps, float* sh) {
    float s = 0.f;
    for (int j = threadIdx.x; j < c; j += blockDim.x) s += load_in(x + j);
    float m = block_sum(s, sh) / c;
    float ss = 0.f;
    for (int j = threadIdx.x; j < c; j += blockDim.x) {
        float d = load_in(x + j) - m;
        ss += d * d;
    }
    float r = rsqrtf(block_sum(ss, sh) / c + eps);
    for (int j = threadIdx.x; j < c; j += blockDim.x) store_out(o + j, (load_in(x + j) - m) * r * weight[j] + bias[j]);
    if (threadIdx.x == 0) {
        mean[i] = m;
        rstd[i] = r;
    }
}

template <typename T, typename X, typename S>
__device__ void layernorm_forward(T* out, float* mean, float* rstd, const X* inp, const float* addend, S* sum,
                                  const float* weight, const float* bias, long long rows, int c, float eps) {
    __shared__ float sh[32];
    for (long long i = blockIdx.x; i < rows; i += gridDim.x) {
        if (addend) {
            add_row(sum, inp, addend, i, c);
            layernorm_row(out + i * c, mean, rstd, sum + i * c, weight, bias, i, c, eps, sh);
        } else {
            layernorm_row(out + i * c, mean, rstd, inp + i * c, weight, bias, i, c, eps, sh);
        }
    }
}

// The entry points: out's dtype, then (_from_bf16) inp's and sum's, or
// (_sum_bf16) sum's alone.
#define LN_FWD_ARGS(T, X, S)                                                                                  \
    T *out, float *mean, float *rstd, const X *inp, const float *addend, S *sum, const float *weight, \
        const float *bias, long long rows, int c, float eps
#define LN_FWD_CALL out, mean, rstd, inp, addend, sum, weight, bias, rows, c, eps
extern "C" __global__ void ROW_BOUNDS layernorm_forward_f32(LN_FWD_ARGS(float, float, float)) {
    layernorm_forward(LN_FWD_CALL);
}
extern "C" __global__ void ROW_BOUNDS layernorm_forward_bf16(LN_FWD_ARGS(bf16_t, float, float)) {
    layernorm_forward(LN_FWD_CALL);
}
extern "C" __global__ void ROW_BOUNDS layernorm_forward_f32_from_bf16(LN_FWD_ARGS(float, bf16_t, bf16_t)) {
    layernorm_forward(LN_FWD_CALL);
}
extern "C" __global__ void ROW_BOUNDS layernorm_forward_bf16_from_bf16(LN_FWD_ARGS(bf16_t, bf16_t, bf16_t)) {
    layernorm_forward(LN_FWD_CALL);
}
extern "C" __global__ void ROW_BOUNDS layernorm_forward_f32_sum_bf16(LN_FWD_ARGS(float, float, bf16_t)) {
    layernorm_forward(LN_FWD_CALL);
}
extern "C" __global__ void ROW_BOUNDS layernorm_forward_bf16_sum_bf16(LN_FWD_ARGS(bf16_t, float, bf16_t)) {
    layernorm_forward(LN_FWD_CALL);
}

// layernorm_backward: block b takes rows b, b+gridDim.x, ...; it adds into
// dinp and keeps its dweight and dbias partial sums in part (gridDim.x,2,C),
// each thread owning the columns j = threadIdx.x mod blockDim.x, so that
// layernorm_param_grads can add them in a fixed order. D is dinp's dtype
// (a bfloat16 residual stream's gradient: added to and rounded once), X
// inp's, G dout's (widened).
template <typename D, typename X, typename G>
__device__ void layernorm_backward(D* dinp, float* part, const G* dout, const X* inp, const float* weight,
                                   const float* mean, const float* rstd, long long rows, int c) {
    __shared__ float sh[32];
    float* dw = part + (long long)blockIdx.x * 2 * c;
    float* db = dw + c;
    for (int j = threadIdx.x; j < c; j += blockDim.x) {
        dw[j] = 0.f;
        db[j] = 0.f;
    }
    for (long long i = blockIdx.x; i < rows; i += gridDim.x) {
        const X* x = inp + i * c;
        const G* g = dout + i * c;
        float m = mean[i], r = rstd[i];
        float sdn = 0.f, sdnn = 0.f;
        for (int j = threadIdx.x; j < c; j += blockDim.x) {
            float norm = (load_in(x + j) - m) * r;
            float gj = load_in(g + j);
            float dn = weight[j] * gj;
            sdn += dn;
            sdnn += dn * norm;
            dw[j] += norm * gj;
            db[j] += gj;
        }
        float mdn = block_sum(sdn, sh) / c;
        float mdnn = block_sum(sdnn, sh) / c;
        D* dx = dinp + i * c;
        for (int j = threadIdx.x; j < c; j += blockDim.x) {
            float norm = (load_in(x + j) - m) * r;
            add_out(dx + j, (weight[j] * load_in(g + j) - mdn - norm * mdnn) * r);
        }
    }
}

#define LN_BWD_ARGS(D, X, G)                                                                     \
    D *dinp, float *part, const G *dout, const X *inp, const float *weight, const float *mean, \
        const float *rstd, long long rows, int c
#define LN_BWD_CALL dinp, part, dout, inp, weight, mean, rstd, rows, c
extern "C" __global__ void ROW_BOUNDS layernorm_backward_f32(LN_BWD_ARGS(float, float, float)) {
    layernorm_backward(LN_BWD_CALL);
}
extern "C" __global__ void ROW_BOUNDS layernorm_backward_f32_from_bf16(LN_BWD_ARGS(float, bf16_t, float)) {
    layernorm_backward(LN_BWD_CALL);
}
extern "C" __global__ void ROW_BOUNDS layernorm_backward_bf16(LN_BWD_ARGS(bf16_t, float, float)) {
    layernorm_backward(LN_BWD_CALL);
}
extern "C" __global__ void ROW_BOUNDS layernorm_backward_bf16_from_bf16(LN_BWD_ARGS(bf16_t, bf16_t, float)) {
    layernorm_backward(LN_BWD_CALL);
}
// _grad_bf16: dout stored as bfloat16 (a norm output's gradient).
extern "C" __global__ void ROW_BOUNDS layernorm_backward_f32_grad_bf16(LN_BWD_ARGS(float, float, bf16_t)) {
    layernorm_backward(LN_BWD_CALL);
}
extern "C" __global__ void ROW_BOUNDS layernorm_backward_f32_from_bf16_grad_bf16(LN_BWD_ARGS(float, bf16_t, bf16_t)) {
    layernorm_backward(LN_BWD_CALL);
}
extern "C" __global__ void ROW_BOUNDS layernorm_backward_bf16_grad_bf16(LN_BWD_ARGS(bf16_t, float, bf16_t)) {
    layernorm_backward(LN_BWD_CALL);
}
extern "C" __global__ void ROW_BOUNDS layernorm_backward_bf16_from_bf16_grad_bf16(LN_BWD_ARGS(bf16_t, bf16_t, bf16_t)) {
    layernorm_backward(LN_BWD_CALL);
}

// layernorm_param_grads adds the nparts partial sums of part (nparts,2,C)
// into dweight and dbias (C).
extern "C" __global__ void layernorm_param_grads_f32(float* dweight, float* dbias, const float* part,
                                                     int nparts, int c) {
    for (int j = blockIdx.x * blockDim.x + threadIdx.x; j < c; j += gridDim.x * blockDim.x) {
        float w = 0.f, b = 0.f;
        for (int p = 0; p < nparts; p++) {
            w += part[(long long)p * 2 * c + j];
            b += part[(long long)p * 2 * c + c + j];
        }
        dweight[j] += w;
        dbias[j] += b;
    }
}

// --- Llama: RMSNorm, rotary embeddings, SwiGLU ---

// rmsnorm_forward: one block per row of inp (N,C); rstd is (N); the
// addend and the dtypes as layernorm_forward's.
template <typename T, typename R>
__device__ void rmsnorm_row(T* o, float* rstd, const R* x, const float* weight, long long i, int c, float eps,
                            float* sh) {
    float ss = 0.f;
    for (int j = threadIdx.x; j < c; j += blockDim.x) ss += load_in(x + j) * load_in(x + j);
    float r = rsqrtf(block_sum(ss, sh) / c + eps);
    for (int j = threadIdx.x; j < c; j += blockDim.x) store_out(o + j, load_in(x + j) * r * weight[j]);
    if (threadIdx.x == 0) rstd[i] = r;
}

template <typename T, typename X, typename S>
__device__ void rmsnorm_forward(T* out, float* rstd, const X* inp, const float* addend, S* sum, const float* weight,
                                long long rows, int c, float eps) {
    __shared__ float sh[32];
    for (long long i = blockIdx.x; i < rows; i += gridDim.x) {
        if (addend) {
            add_row(sum, inp, addend, i, c);
            rmsnorm_row(out + i * c, rstd, sum + i * c, weight, i, c, eps, sh);
        } else {
            rmsnorm_row(out + i * c, rstd, inp + i * c, weight, i, c, eps, sh);
        }
    }
}

#define RMS_FWD_ARGS(T, X, S) \
    T *out, float *rstd, const X *inp, const float *addend, S *sum, const float *weight, long long rows, int c, float eps
#define RMS_FWD_CALL out, rstd, inp, addend, sum, weight, rows, c, eps
extern "C" __global__ void ROW_BOUNDS rmsnorm_forward_f32(RMS_FWD_ARGS(float, float, float)) {
    rmsnorm_forward(RMS_FWD_CALL);
}
extern "C" __global__ void ROW_BOUNDS rmsnorm_forward_bf16(RMS_FWD_ARGS(bf16_t, float, float)) {
    rmsnorm_forward(RMS_FWD_CALL);
}
extern "C" __global__ void ROW_BOUNDS rmsnorm_forward_f32_from_bf16(RMS_FWD_ARGS(float, bf16_t, bf16_t)) {
    rmsnorm_forward(RMS_FWD_CALL);
}
extern "C" __global__ void ROW_BOUNDS rmsnorm_forward_bf16_from_bf16(RMS_FWD_ARGS(bf16_t, bf16_t, bf16_t)) {
    rmsnorm_forward(RMS_FWD_CALL);
}
extern "C" __global__ void ROW_BOUNDS rmsnorm_forward_f32_sum_bf16(RMS_FWD_ARGS(float, float, bf16_t)) {
    rmsnorm_forward(RMS_FWD_CALL);
}
extern "C" __global__ void ROW_BOUNDS rmsnorm_forward_bf16_sum_bf16(RMS_FWD_ARGS(bf16_t, float, bf16_t)) {
    rmsnorm_forward(RMS_FWD_CALL);
}

// rmsnorm_backward: as layernorm_backward, with the dweight partial sums
// in part (gridDim.x,C).
template <typename D, typename X, typename G>
__device__ void rmsnorm_backward(D* dinp, float* part, const G* dout, const X* inp, const float* weight,
                                 const float* rstd, long long rows, int c) {
    __shared__ float sh[32];
    float* dw = part + (long long)blockIdx.x * c;
    for (int j = threadIdx.x; j < c; j += blockDim.x) dw[j] = 0.f;
    for (long long i = blockIdx.x; i < rows; i += gridDim.x) {
        const X* x = inp + i * c;
        const G* g = dout + i * c;
        float r = rstd[i];
        float sdnn = 0.f;
        for (int j = threadIdx.x; j < c; j += blockDim.x) {
            float norm = load_in(x + j) * r;
            float gj = load_in(g + j);
            sdnn += weight[j] * gj * norm;
            dw[j] += norm * gj;
        }
        float mdnn = block_sum(sdnn, sh) / c;
        D* dx = dinp + i * c;
        for (int j = threadIdx.x; j < c; j += blockDim.x)
            add_out(dx + j, (weight[j] * load_in(g + j) - load_in(x + j) * r * mdnn) * r);
    }
}

#define RMS_BWD_ARGS(D, X, G) \
    D *dinp, float *part, const G *dout, const X *inp, const float *weight, const float *rstd, long long rows, int c
#define RMS_BWD_CALL dinp, part, dout, inp, weight, rstd, rows, c
extern "C" __global__ void ROW_BOUNDS rmsnorm_backward_f32(RMS_BWD_ARGS(float, float, float)) {
    rmsnorm_backward(RMS_BWD_CALL);
}
extern "C" __global__ void ROW_BOUNDS rmsnorm_backward_f32_from_bf16(RMS_BWD_ARGS(float, bf16_t, float)) {
    rmsnorm_backward(RMS_BWD_CALL);
}
extern "C" __global__ void ROW_BOUNDS rmsnorm_backward_bf16(RMS_BWD_ARGS(bf16_t, float, float)) {
    rmsnorm_backward(RMS_BWD_CALL);
}
extern "C" __global__ void ROW_BOUNDS rmsnorm_backward_bf16_from_bf16(RMS_BWD_ARGS(bf16_t, bf16_t, float)) {
    rmsnorm_backward(RMS_BWD_CALL);
}
extern "C" __global__ void ROW_BOUNDS rmsnorm_backward_f32_grad_bf16(RMS_BWD_ARGS(float, float, bf16_t)) {
    rmsnorm_backward(RMS_BWD_CALL);
}
extern "C" __global__ void ROW_BOUNDS rmsnorm_backward_f32_from_bf16_grad_bf16(RMS_BWD_ARGS(float, bf16_t, bf16_t)) {
    rmsnorm_backward(RMS_BWD_CALL);
}
extern "C" __global__ void ROW_BOUNDS rmsnorm_backward_bf16_grad_bf16(RMS_BWD_ARGS(bf16_t, float, bf16_t)) {
    rmsnorm_backward(RMS_BWD_CALL);
}
extern "C" __global__ void ROW_BOUNDS rmsnorm_backward_bf16_from_bf16_grad_bf16(RMS_BWD_ARGS(bf16_t, bf16_t, bf16_t)) {
    rmsnorm_backward(RMS_BWD_CALL);
}

// rmsnorm_param_grads adds the nparts partial sums of part (nparts,C) into
// dweight (C), in order (bias_backward's second stage too).
extern "C" __global__ void rmsnorm_param_grads_f32(float* dweight, const float* part, int nparts, int c) {
    for (int j = blockIdx.x * blockDim.x + threadIdx.x; j < c; j += gridDim.x * blockDim.x) {
        float w = 0.f;
        for (int p = 0; p < nparts; p++) w += part[(long long)p * c + j];
        dweight[j] += w;
    }
}

// rope: one thread per rotated pair (row, head, j < hd/2) of x (rows,
// heads*hd), in place; table row p is [cos | sin] of position p's angles;
// sign -1 rotates back (the backward).
template <typename X>
__device__ __forceinline__ void rope(X* x, const float* table, long long rows, int seqLen, int heads, int hd, int period,
                                     int rotated, float sign) {
    int half = hd / 2;
    long long n = rows * heads * half;
    GRID_STRIDE(i, n) {
        int j = i % half;
        long long rh = i / half;
        int h = rh % heads;
        long long row = rh / heads;
        if (h % period >= rotated) continue;
        const float* t = table + (long long)(row % seqLen) * hd;
        X* v = x + row * heads * hd + (long long)h * hd;
        float a = load_in(v + j), b = load_in(v + j + half), c = t[j], s = sign * t[j + half];
        store_out(v + j, a * c - b * s);
        store_out(v + j + half, b * c + a * s);
    }
}

extern "C" __global__ void rope_f32(float* x, const float* table, long long rows, int seqLen, int heads, int hd,
                                    int period, int rotated, float sign) {
    rope(x, table, rows, seqLen, heads, hd, period, rotated, sign);
}

// rope_bf16: x stored as bfloat16 (a Llama's qkv under bf16 compute),
// widened, rotated and rounded again.
extern "C" __global__ void rope_bf16(bf16_t* x, const float* table, long long rows, int seqLen, int heads, int hd,
                                     int period, int rotated, float sign) {
    rope(x, table, rows, seqLen, heads, hd, period, rotated, sign);
}

// swiglu_forward: out (N,F) = silu(gate)*up with inp's rows [gate | up];
// inp and out float32 or bfloat16 (the kernel names' _bf16: a bfloat16
// out; _from_bf16: a bfloat16 inp).
template <typename Out, typename In>
__device__ __forceinline__ void swiglu_forward(Out* out, const In* inp, long long n, int f) {
    GRID_STRIDE(i, n) {
        long long r = i / f;
        int j = i % f;
        float g = load_in(inp + 2 * r * f + j), u = load_in(inp + (2 * r + 1) * f + j);
        store_out(out + i, g / (1.f + expf(-g)) * u);
    }
}

extern "C" __global__ void swiglu_forward_f32(float* out, const float* inp, long long n, int f) {
    swiglu_forward(out, inp, n, f);
}
extern "C" __global__ void swiglu_forward_bf16(bf16_t* out, const float* inp, long long n, int f) {
    swiglu_forward(out, inp, n, f);
}
extern "C" __global__ void swiglu_forward_f32_from_bf16(float* out, const bf16_t* inp, long long n, int f) {
    swiglu_forward(out, inp, n, f);
}
extern "C" __global__ void swiglu_forward_bf16_from_bf16(bf16_t* out, const bf16_t* inp, long long n, int f) {
    swiglu_forward(out, inp, n, f);
}

// swiglu_backward: dinp (N,2F) += [dgate | dup] from dout (N,F); bfloat16
// gradients (dinp and dout both) widened, the sums rounded into dinp.
template <typename Grad, typename In>
__device__ __forceinline__ void swiglu_backward(Grad* dinp, const In* inp, const Grad* dout, long long n, int f) {
    GRID_STRIDE(i, n) {
        long long r = i / f;
        int j = i % f;
        float g = load_in(inp + 2 * r * f + j), u = load_in(inp + (2 * r + 1) * f + j), d = load_in(dout + i);
        float s = 1.f / (1.f + expf(-g));
        Grad* dg = dinp + 2 * r * f + j;
        Grad* du = dinp + (2 * r + 1) * f + j;
        store_out(dg, load_in(dg) + d * u * s * (1.f + g * (1.f - s)));
        store_out(du, load_in(du) + d * g * s);
    }
}

extern "C" __global__ void swiglu_backward_f32(float* dinp, const float* inp, const float* dout, long long n, int f) {
    swiglu_backward(dinp, inp, dout, n, f);
}
extern "C" __global__ void swiglu_backward_f32_from_bf16(float* dinp, const bf16_t* inp, const float* dout, long long n,
                                                         int f) {
    swiglu_backward(dinp, inp, dout, n, f);
}
extern "C" __global__ void swiglu_backward_bf16(bf16_t* dinp, const float* inp, const bf16_t* dout, long long n, int f) {
    swiglu_backward(dinp, inp, dout, n, f);
}
extern "C" __global__ void swiglu_backward_bf16_from_bf16(bf16_t* dinp, const bf16_t* inp, const bf16_t* dout, long long n,
                                                          int f) {
    swiglu_backward(dinp, inp, dout, n, f);
}

// --- GELU, tanh approximation: gelu(x) = x - x/(exp(2u)+1), u = s*(x+a*x^3) ---

#define GELU_S 0.7978845608028654f
#define GELU_A 0.044715f

__device__ __forceinline__ float gelu_f(float x) {
    float e = expf(2.f * GELU_S * (x + GELU_A * x * x * x));
    return x - x / (e + 1.f);
}

// gelu'(x) = (1-w)*(1+2*x*w*du), w = 1/(exp(2u)+1), du = du/dx.
__device__ __forceinline__ float gelu_grad(float x) {
    float w = 1.f / (expf(2.f * GELU_S * (x + GELU_A * x * x * x)) + 1.f);
    float du = GELU_S * (1.f + 3.f * GELU_A * x * x);
    return (1.f - w) * (1.f + 2.f * x * w * du);
}

// tanh; its gradient recomputes y = tanh(x) for tanh' = 1 - y^2.
__device__ __forceinline__ float tanh_f(float x) { return tanhf(x); }
__device__ __forceinline__ float tanh_grad(float x) {
    float y = tanhf(x);
    return 1.f - y * y;
}

// The activations' kernels, as swiglu's: <act>_forward_<out>[_from_bf16]
// (out = f(inp); a bfloat16 out is an activation saved for products that
// read bfloat16) and <act>_backward_f32[_from_bf16] (dinp += f'(inp)*dout,
// inp the forward's input). Each extern "C" entry is written out: the CPU
// simulation finds kernels by their declarations.
template <float (*F)(float), typename Out, typename In>
__device__ __forceinline__ void activation_forward(Out* out, const In* inp, long long n) {
    GRID_STRIDE(i, n) store_out(out + i, F(load_in(inp + i)));
}

template <float (*Grad)(float), typename In>
__device__ __forceinline__ void activation_backward(float* dinp, const In* inp, const float* dout, long long n) {
    GRID_STRIDE(i, n) dinp[i] += Grad(load_in(inp + i)) * dout[i];
}

// bias_activation_forward: a linear layer's bias and the activation after
// it in one pass: pre (N,OC) += bias, stored as pre's dtype, and out =
// F(pre as stored); the bits of add_bias and then activation_forward.
template <float (*F)(float), typename Out, typename Pre>
__device__ __forceinline__ void bias_activation_forward(Out* out, Pre* pre, const float* bias, long long n, int oc) {
    GRID_STRIDE(i, n) {
        float v = load_in(pre + i) + bias[i % oc];
        store_out(pre + i, v);
        store_out(out + i, F(load_in(pre + i)));
    }
}

// activation_backward_in_place: dout = F'(inp)*dout, overwriting dout
// (activation_backward into zeros, without them); a bfloat16 dout is
// widened and the product rounded into it.
template <float (*Grad)(float), typename Out, typename In>
__device__ __forceinline__ void activation_backward_in_place(Out* dout, const In* inp, long long n) {
    GRID_STRIDE(i, n) store_out(dout + i, Grad(load_in(inp + i)) * load_in(dout + i));
}

extern "C" __global__ void gelu_forward_f32(float* out, const float* inp, long long n) {
    activation_forward<gelu_f>(out, inp, n);
}
extern "C" __global__ void gelu_forward_bf16(bf16_t* out, const float* inp, long long n) {
    activation_forward<gelu_f>(out, inp, n);
}
extern "C" __global__ void gelu_forward_f32_from_bf16(float* out, const bf16_t* inp, long long n) {
    activation_forward<gelu_f>(out, inp, n);
}
extern "C" __global__ void gelu_forward_bf16_from_bf16(bf16_t* out, const bf16_t* inp, long long n) {
    activation_forward<gelu_f>(out, inp, n);
}
extern "C" __global__ void gelu_backward_f32(float* dinp, const float* inp, const float* dout, long long n) {
    activation_backward<gelu_grad>(dinp, inp, dout, n);
}
extern "C" __global__ void gelu_backward_f32_from_bf16(float* dinp, const bf16_t* inp, const float* dout, long long n) {
    activation_backward<gelu_grad>(dinp, inp, dout, n);
}
extern "C" __global__ void tanh_forward_f32(float* out, const float* inp, long long n) {
    activation_forward<tanh_f>(out, inp, n);
}
extern "C" __global__ void tanh_forward_bf16(bf16_t* out, const float* inp, long long n) {
    activation_forward<tanh_f>(out, inp, n);
}
extern "C" __global__ void tanh_forward_f32_from_bf16(float* out, const bf16_t* inp, long long n) {
    activation_forward<tanh_f>(out, inp, n);
}
extern "C" __global__ void tanh_forward_bf16_from_bf16(bf16_t* out, const bf16_t* inp, long long n) {
    activation_forward<tanh_f>(out, inp, n);
}
extern "C" __global__ void tanh_backward_f32(float* dinp, const float* inp, const float* dout, long long n) {
    activation_backward<tanh_grad>(dinp, inp, dout, n);
}
extern "C" __global__ void tanh_backward_f32_from_bf16(float* dinp, const bf16_t* inp, const float* dout, long long n) {
    activation_backward<tanh_grad>(dinp, inp, dout, n);
}
extern "C" __global__ void bias_gelu_forward_f32(float* out, float* pre, const float* bias, long long n, int oc) {
    bias_activation_forward<gelu_f>(out, pre, bias, n, oc);
}
extern "C" __global__ void bias_gelu_forward_bf16(bf16_t* out, float* pre, const float* bias, long long n, int oc) {
    bias_activation_forward<gelu_f>(out, pre, bias, n, oc);
}
extern "C" __global__ void bias_gelu_forward_f32_from_bf16(float* out, bf16_t* pre, const float* bias, long long n, int oc) {
    bias_activation_forward<gelu_f>(out, pre, bias, n, oc);
}
extern "C" __global__ void bias_gelu_forward_bf16_from_bf16(bf16_t* out, bf16_t* pre, const float* bias, long long n, int oc) {
    bias_activation_forward<gelu_f>(out, pre, bias, n, oc);
}
extern "C" __global__ void gelu_backward_in_place_f32(float* dout, const float* inp, long long n) {
    activation_backward_in_place<gelu_grad>(dout, inp, n);
}
extern "C" __global__ void gelu_backward_in_place_f32_from_bf16(float* dout, const bf16_t* inp, long long n) {
    activation_backward_in_place<gelu_grad>(dout, inp, n);
}
extern "C" __global__ void gelu_backward_in_place_bf16(bf16_t* dout, const float* inp, long long n) {
    activation_backward_in_place<gelu_grad>(dout, inp, n);
}
extern "C" __global__ void gelu_backward_in_place_bf16_from_bf16(bf16_t* dout, const bf16_t* inp, long long n) {
    activation_backward_in_place<gelu_grad>(dout, inp, n);
}
extern "C" __global__ void bias_tanh_forward_f32(float* out, float* pre, const float* bias, long long n, int oc) {
    bias_activation_forward<tanh_f>(out, pre, bias, n, oc);
}
extern "C" __global__ void bias_tanh_forward_bf16(bf16_t* out, float* pre, const float* bias, long long n, int oc) {
    bias_activation_forward<tanh_f>(out, pre, bias, n, oc);
}
extern "C" __global__ void bias_tanh_forward_f32_from_bf16(float* out, bf16_t* pre, const float* bias, long long n, int oc) {
    bias_activation_forward<tanh_f>(out, pre, bias, n, oc);
}
extern "C" __global__ void bias_tanh_forward_bf16_from_bf16(bf16_t* out, bf16_t* pre, const float* bias, long long n, int oc) {
    bias_activation_forward<tanh_f>(out, pre, bias, n, oc);
}
extern "C" __global__ void tanh_backward_in_place_f32(float* dout, const float* inp, long long n) {
    activation_backward_in_place<tanh_grad>(dout, inp, n);
}
extern "C" __global__ void tanh_backward_in_place_f32_from_bf16(float* dout, const bf16_t* inp, long long n) {
    activation_backward_in_place<tanh_grad>(dout, inp, n);
}
extern "C" __global__ void tanh_backward_in_place_bf16(bf16_t* dout, const float* inp, long long n) {
    activation_backward_in_place<tanh_grad>(dout, inp, n);
}
extern "C" __global__ void tanh_backward_in_place_bf16_from_bf16(bf16_t* dout, const bf16_t* inp, long long n) {
    activation_backward_in_place<tanh_grad>(dout, inp, n);
}

// --- softmax: one warp per row of Tk keys, 8 rows per block of 256 ---

// softmax_forward: out = softmax(scale*inp) over the unmasked keys of each
// row, 0 on masked ones and on rows with no key left. Keys j >= end are
// causally masked; keyValid (B,Tk), when not null, masks the keys where it
// is 0 for every row of batch item r/rowsPerItem. out may be inp (float32);
// a bfloat16 out (the _bf16 kernel: the unfused attention's probabilities
// under bf16 compute) gets the float32 probabilities rounded. The exps are
// summed, then computed again and scaled as they are stored: out is
// written once (a lane reads and writes only its own keys, so in place
// is safe).
template <typename T>
__device__ void softmax_forward(T* out, const float* inp, float scale, long long rows, int tq, int tk, int causal,
                                const int* keyValid, long long rowsPerItem) {
    int lane = threadIdx.x & 31;
    long long warps = (long long)gridDim.x * (blockDim.x >> 5);
    for (long long r = (long long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5); r < rows; r += warps) {
        int end = tk;
        if (causal) {
            long long e = r % tq + 1 + tk - tq;
            end = (int)(e < 0 ? 0 : (e > tk ? tk : e));
        }
        const int* valid = keyValid ? keyValid + (r / rowsPerItem) * tk : 0;
        const float* x = inp + r * tk;
        T* o = out + r * tk;
        float mx = NEG_INF;
        for (int j = lane; j < end; j += 32)
            if (!valid || valid[j]) mx = fmaxf(mx, x[j]);
        mx = warp_max(mx);
        if (mx == NEG_INF) {
            for (int j = lane; j < tk; j += 32) store_out(o + j, 0.f);
            continue;
        }
        float sum = 0.f;
        for (int j = lane; j < end; j += 32)
            if (!valid || valid[j]) sum += expf(scale * (x[j] - mx));
        float inv = 1.f / warp_sum(sum);
        for (int j = lane; j < tk; j += 32) {
            float e = 0.f;
            if (j < end && (!valid || valid[j])) e = expf(scale * (x[j] - mx));
            store_out(o + j, e * inv);
        }
    }
}

extern "C" __global__ void softmax_forward_f32(float* out, const float* inp, float scale, long long rows,
                                               int tq, int tk, int causal, const int* keyValid,
                                               long long rowsPerItem) {
    softmax_forward(out, inp, scale, rows, tq, tk, causal, keyValid, rowsPerItem);
}

extern "C" __global__ void softmax_forward_bf16(bf16_t* out, const float* inp, float scale, long long rows,
                                                int tq, int tk, int causal, const int* keyValid,
                                                long long rowsPerItem) {
    softmax_forward(out, inp, scale, rows, tq, tk, causal, keyValid, rowsPerItem);
}

// softmax_backward: dinp += scale*out*(dout - rowsum(dout*out)); out may
// be bfloat16 (_from_bf16), read widened, and dinp (_bf16: widened, added
// to and rounded).
template <typename D, typename T>
__device__ void softmax_backward(D* dinp, const float* dout, const T* out, float scale, long long rows, int tk) {
    int lane = threadIdx.x & 31;
    long long warps = (long long)gridDim.x * (blockDim.x >> 5);
    for (long long r = (long long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5); r < rows; r += warps) {
        const float* g = dout + r * tk;
        const T* y = out + r * tk;
        D* dx = dinp + r * tk;
        float dot = 0.f;
        for (int j = lane; j < tk; j += 32) dot += load_in(y + j) * g[j];
        dot = warp_sum(dot);
        for (int j = lane; j < tk; j += 32) store_out(dx + j, load_in(dx + j) + scale * load_in(y + j) * (g[j] - dot));
    }
}

extern "C" __global__ void softmax_backward_f32(float* dinp, const float* dout, const float* out, float scale,
                                                long long rows, int tk) {
    softmax_backward(dinp, dout, out, scale, rows, tk);
}

extern "C" __global__ void softmax_backward_f32_from_bf16(float* dinp, const float* dout, const bf16_t* out,
                                                          float scale, long long rows, int tk) {
    softmax_backward(dinp, dout, out, scale, rows, tk);
}

extern "C" __global__ void softmax_backward_bf16(bf16_t* dinp, const float* dout, const float* out, float scale,
                                                 long long rows, int tk) {
    softmax_backward(dinp, dout, out, scale, rows, tk);
}

extern "C" __global__ void softmax_backward_bf16_from_bf16(bf16_t* dinp, const float* dout, const bf16_t* out,
                                                           float scale, long long rows, int tk) {
    softmax_backward(dinp, dout, out, scale, rows, tk);
}

// --- cross-entropy pieces: one block per row of logits (N,V) ---
//
// The logits are float32 or bfloat16 (an LM head's output under bf16
// compute: the kernel names' _from_bf16); every sum, the max and the loss
// are float32 over the widened values.

template <typename T>
__device__ void ce_row_max(float* rowMax, const T* logits, long long rows, int v) {
    __shared__ float sh[32];
    for (long long i = blockIdx.x; i < rows; i += gridDim.x) {
        const T* x = logits + i * v;
        float m = NEG_INF;
        for (int j = threadIdx.x; j < v; j += blockDim.x) m = fmaxf(m, load_in(x + j));
        m = block_max(m, sh);
        if (threadIdx.x == 0) rowMax[i] = m;
    }
}

extern "C" __global__ void ROW_BOUNDS ce_row_max_f32(float* rowMax, const float* logits, long long rows, int v) {
    ce_row_max(rowMax, logits, rows, v);
}

extern "C" __global__ void ROW_BOUNDS ce_row_max_f32_from_bf16(float* rowMax, const bf16_t* logits, long long rows,
                                                               int v) {
    ce_row_max(rowMax, logits, rows, v);
}

template <typename T>
__device__ void ce_sum_exp(float* sumExp, const T* logits, const float* rowMax, long long rows, int v) {
    __shared__ float sh[32];
    for (long long i = blockIdx.x; i < rows; i += gridDim.x) {
        const T* x = logits + i * v;
        float m = rowMax[i], s = 0.f;
        for (int j = threadIdx.x; j < v; j += blockDim.x) s += expf(load_in(x + j) - m);
        s = block_sum(s, sh);
        if (threadIdx.x == 0) sumExp[i] = s;
    }
}

extern "C" __global__ void ROW_BOUNDS ce_sum_exp_f32(float* sumExp, const float* logits, const float* rowMax,
                                          long long rows, int v) {
    ce_sum_exp(sumExp, logits, rowMax, rows, v);
}

extern "C" __global__ void ROW_BOUNDS ce_sum_exp_f32_from_bf16(float* sumExp, const bf16_t* logits,
                                                               const float* rowMax, long long rows, int v) {
    ce_sum_exp(sumExp, logits, rowMax, rows, v);
}

// ce_forward: the unsharded cross-entropy of a row in one kernel: the max,
// then the sum of exps (the row read again, from the cache), then the
// loss; the same bits as ce_row_max, ce_sum_exp, ce_target_logit, ce_loss.
template <typename T>
__device__ void ce_forward(float* losses, float* rowMax, float* sumExp, const T* logits, const int* targets,
                           long long rows, int v) {
    __shared__ float sh[32];
    for (long long i = blockIdx.x; i < rows; i += gridDim.x) {
        const T* x = logits + i * v;
        float m = NEG_INF;
        for (int j = threadIdx.x; j < v; j += blockDim.x) m = fmaxf(m, load_in(x + j));
        m = block_max(m, sh);
        float s = 0.f;
        for (int j = threadIdx.x; j < v; j += blockDim.x) s += expf(load_in(x + j) - m);
        s = block_sum(s, sh);
        if (threadIdx.x == 0) {
            int t = targets[i];
            float tl = (t >= 0 && t < v) ? load_in(x + t) : 0.f;
            rowMax[i] = m;
            sumExp[i] = s;
            losses[i] = t < 0 ? 0.f : (float)(log((double)s) + (double)m - (double)tl);
        }
    }
}

extern "C" __global__ void ROW_BOUNDS ce_forward_f32(float* losses, float* rowMax, float* sumExp, const float* logits,
                                          const int* targets, long long rows, int v) {
    ce_forward(losses, rowMax, sumExp, logits, targets, rows, v);
}

extern "C" __global__ void ROW_BOUNDS ce_forward_f32_from_bf16(float* losses, float* rowMax, float* sumExp,
                                                               const bf16_t* logits, const int* targets,
                                                               long long rows, int v) {
    ce_forward(losses, rowMax, sumExp, logits, targets, rows, v);
}

// ce_target_logit: out[i] = logits[i, targets[i]-start] when in the slice, else 0.
template <typename T>
__device__ __forceinline__ void ce_target_logit(float* out, const T* logits, const int* targets, long long rows, int v,
                                                long long start) {
    GRID_STRIDE(i, rows) {
        long long t = targets[i], j = t - start;
        out[i] = (t >= 0 && j >= 0 && j < v) ? load_in(logits + i * v + j) : 0.f;
    }
}

extern "C" __global__ void ce_target_logit_f32(float* out, const float* logits, const int* targets,
                                               long long rows, int v, long long start) {
    ce_target_logit(out, logits, targets, rows, v, start);
}

extern "C" __global__ void ce_target_logit_f32_from_bf16(float* out, const bf16_t* logits, const int* targets,
                                                         long long rows, int v, long long start) {
    ce_target_logit(out, logits, targets, rows, v, start);
}

// ce_loss: losses = log(sumExp) + rowMax - targetLogit, 0 for ignored targets.
extern "C" __global__ void ce_loss_f32(float* losses, const float* rowMax, const float* sumExp,
                                       const float* targetLogit, const int* targets, long long rows) {
    GRID_STRIDE(i, rows) {
        losses[i] = targets[i] < 0 ? 0.f
                                   : (float)(log((double)sumExp[i]) + (double)rowMax[i] - (double)targetLogit[i]);
    }
}

// ce_backward: dlogits += dloss*(softmax - onehot) on rows with a target.
extern "C" __global__ void ROW_BOUNDS ce_backward_f32(float* dlogits, const float* logits, const float* rowMax,
                                           const float* sumExp, const int* targets, long long rows, int v,
                                           long long start, float dloss) {
    for (long long i = blockIdx.x; i < rows; i += gridDim.x) {
        long long t = targets[i];
        if (t < 0) continue;
        long long tj = t - start;
        float m = rowMax[i], c = dloss / sumExp[i];
        const float* x = logits + i * v;
        float* dx = dlogits + i * v;
        for (int j = threadIdx.x; j < v; j += blockDim.x) {
            float g = dx[j] + c * expf(x[j] - m);
            if (j == tj) g -= dloss;
            dx[j] = g;
        }
    }
}

// ce_backward_in_place: logits[:, :cols] = dloss*(softmax - onehot), the
// gradient written over the logits it is made from (0 on rows without a
// target); the columns from cols on are left alone. A bfloat16 row gets
// the float32 gradient rounded.
template <typename T>
__device__ void ce_backward_in_place(T* logits, const float* rowMax, const float* sumExp, const int* targets,
                                     long long rows, int v, int cols, long long start, float dloss) {
    for (long long i = blockIdx.x; i < rows; i += gridDim.x) {
        T* x = logits + i * v;
        long long t = targets[i];
        if (t < 0) {
            for (int j = threadIdx.x; j < cols; j += blockDim.x) store_out(x + j, 0.f);
            continue;
        }
        long long tj = t - start;
        float m = rowMax[i], c = dloss / sumExp[i];
        for (int j = threadIdx.x; j < cols; j += blockDim.x) {
            float g = c * expf(load_in(x + j) - m);
            if (j == tj) g -= dloss;
            store_out(x + j, g);
        }
    }
}

extern "C" __global__ void ROW_BOUNDS ce_backward_in_place_f32(float* logits, const float* rowMax, const float* sumExp,
                                                    const int* targets, long long rows, int v, int cols,
                                                    long long start, float dloss) {
    ce_backward_in_place(logits, rowMax, sumExp, targets, rows, v, cols, start, dloss);
}

extern "C" __global__ void ROW_BOUNDS ce_backward_in_place_bf16_from_bf16(bf16_t* logits, const float* rowMax,
                                                                          const float* sumExp, const int* targets,
                                                                          long long rows, int v, int cols,
                                                                          long long start, float dloss) {
    ce_backward_in_place(logits, rowMax, sumExp, targets, rows, v, cols, start, dloss);
}

// --- optimizer and norms ---

// A tensor table (kernels.go's tensorTable): for each of n tensors nine
// 64-bit words: [0..3] pointers, [4] its element count, [5] the first
// block of the launch's flat grid it takes, [6] how many blocks it takes,
// [7] a float the kernel reads (its bits in the low half), [8] a fifth
// pointer. One launch
// walks many tensors: block b works on tensor table_find(b), as block
// b-[5] of a grid of [6] blocks would on it alone.
__device__ int table_find(const long long* table, int n, long long b) {
    int lo = 0, hi = n - 1;
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (table[9 * mid + 5] <= b) lo = mid;
        else hi = mid - 1;
    }
    return lo;
}

// adamw_step is one element's AdamW update: the gradient scaled by s, the
// moments, then the parameter with decoupled weight decay wd, rounded
// into its bfloat16 copy half when there is one.
__device__ __forceinline__ void adamw_step(float* param, const float* grad, float* m, float* v, bf16_t* half, long long i,
                                           float s, float lr, float b1, float b2, float eps, float wd, float bc1,
                                           float bc2) {
    float g = grad[i] * s;
    float mi = b1 * m[i] + (1.f - b1) * g;
    float vi = b2 * v[i] + (1.f - b2) * g * g;
    m[i] = mi;
    v[i] = vi;
    float mhat = mi / bc1, vhat = vi / bc2;
    float p = param[i] - lr * (mhat / (sqrtf(vhat) + eps) + wd * param[i]);
    param[i] = p;
    if (half) half[i] = bf16_round(p);
}

// adamw: gradients are scaled by *scale when it is not null (a clip
// coefficient computed on the device), else by 1.
extern "C" __global__ void adamw_f32(float* param, const float* grad, float* m, float* v, bf16_t* half, long long n,
                                     float lr, float b1, float b2, float eps, float wd,
                                     float bc1, float bc2, const float* scale) {
    float s = scale ? *scale : 1.f;
    GRID_STRIDE(i, n) adamw_step(param, grad, m, v, half, i, s, lr, b1, b2, eps, wd, bc1, bc2);
}

// adamw_multi: adamw_f32 on every tensor of a table (param, grad, m, v;
// the weight decay in [7], the bfloat16 copy or null in [8]) in one launch.
extern "C" __global__ void adamw_multi_f32(const long long* table, int ntensors, float lr, float b1, float b2,
                                           float eps, float bc1, float bc2, const float* scale) {
    float s = scale ? *scale : 1.f;
    const long long* e = table + 9 * table_find(table, ntensors, blockIdx.x);
    float* param = (float*)e[0];
    const float* grad = (const float*)e[1];
    float *m = (float*)e[2], *v = (float*)e[3];
    bf16_t* half = (bf16_t*)e[8];
    long long n = e[4], count = e[6];
    float wd = __int_as_float((int)e[7]);
    for (long long i = (blockIdx.x - e[5]) * blockDim.x + threadIdx.x; i < n; i += count * blockDim.x)
        adamw_step(param, grad, m, v, half, i, s, lr, b1, b2, eps, wd, bc1, bc2);
}

// sum_multi writes, for every tensor x of a table, one float64 partial sum
// of its elements (square: of their squares) per block of its own into
// part, at the block's index in the flat grid.
extern "C" __global__ void sum_multi_f64(double* part, const long long* table, int ntensors, int square) {
    __shared__ double sh[32];
    const long long* e = table + 9 * table_find(table, ntensors, blockIdx.x);
    const float* x = (const float*)e[0];
    long long n = e[4], count = e[6];
    double s = 0.0;
    for (long long i = (blockIdx.x - e[5]) * blockDim.x + threadIdx.x; i < n; i += count * blockDim.x) {
        double v = x[i];
        s += square ? v * v : v;
    }
    s = block_sum_d(s, sh);
    if (threadIdx.x == 0) part[blockIdx.x] = s;
}

// sum_squares_each_f64 writes into out[i], for each of n tensors, the sum
// of its float64 partial sums part[offsets[i]..offsets[i+1]), added in
// order by one thread (deterministic): each tensor's sum of squares, a
// float64 that collectives carry bit for bit.
extern "C" __global__ void sum_squares_each_f64(double* out, const double* part, const int* offsets, long long n) {
    GRID_STRIDE(i, n) {
        double s = 0.0;
        for (int p = offsets[i]; p < offsets[i + 1]; p++) s += part[p];
        out[i] = s;
    }
}

// sum_blocks_f64 adds the nblocks blocks of n float64s of in element by
// element, in block order from 0.0, into out (n).
extern "C" __global__ void sum_blocks_f64(double* out, const double* in, long long n, int nblocks) {
    GRID_STRIDE(i, n) {
        double s = 0.0;
        for (int r = 0; r < nblocks; r++) s += in[(long long)r * n + i];
        out[i] = s;
    }
}

// clip_norm_f64 sums the n float64s of sq in order (one thread), and
// writes the square root as a float64 at out[0:2] and, at out[2], the
// gradient scale that clips it to clip: clip/(norm+1e-6) when clip > 0
// and the norm exceeds it, else 1.
extern "C" __global__ void clip_norm_f64(float* out, const double* sq, long long n, double clip) {
    if (blockIdx.x != 0 || threadIdx.x != 0) return;
    double total = 0.0;
    for (long long i = 0; i < n; i++) total += sq[i];
    double norm = sqrt(total);
    *(double*)out = norm;
    out[2] = (clip > 0.0 && norm > clip) ? (float)(clip / (norm + 1e-6)) : 1.f;
}


// sum_finish sets (or adds to, when accumulate) out[0] alpha times the sum
// of the nparts partials, added in order by one thread.
extern "C" __global__ void sum_finish_f32(float* out, const double* part, int nparts, float alpha, int accumulate) {
    if (blockIdx.x != 0 || threadIdx.x != 0) return;
    double s = 0.0;
    for (int i = 0; i < nparts; i++) s += part[i];
    double v = (double)alpha * s;
    out[0] = accumulate ? (float)((double)out[0] + v) : (float)v;
}

// --- fused causal attention (FlashAttention-2, Dao 2023) ---
//
// Attention over a packed qkv activation without the (T,T) scores in
// memory: a block takes 64 query rows (16 a warp) of one head and walks
// the key tiles, keeping each row's running max m and sum l (online
// softmax) and its output in registers; the scores and products run on
// tensor cores (mma.sync m16n8k16, bf16 operands rounded to nearest even,
// float32 sums). The backward recomputes the probabilities from the saved
// log-sum-exp: one kernel takes a key tile and walks the queries (dK, dV;
// a key/value head gathers its group's query heads), another takes a
// query tile and walks the keys (dQ), so every gradient is summed by one
// block in a fixed order: deterministic, with no atomics.
//
// qkv rows are W floats; kv head j's columns start at j*A, its g query
// heads at j*A + q0 + r*hd (r < g), its key at j*A + k0 and value at
// j*A + v0 (GPT's [q | k | v]: A = hd, q0 = 0, k0 = C, v0 = 2C; Llama's
// groups [q.. | k | v]: A = (g+2)*hd, k0 = g*hd, v0 = (g+1)*hd). out and
// dout are (B,T,nh*hd); lse and delta are (B,nh,T). Key j is visible to
// query i when j < T, j <= i under causal, and keyValid[b*T+j] != 0 where
// keyValid is given; a row with no visible key outputs 0 (lse +inf).
// Grids: (ceil(T/64), heads, B), 128 threads, dynamic shared memory
// flash_shared_bytes (kernels.go's flashShared).

#define FA_ROWS 64
#define FA_THREADS 128
#define FA_PAD 8
#define FA_BOUNDS __launch_bounds__(FA_THREADS)
#define POS_INF __int_as_float(0x7f800000)

#ifndef HPCRUN_CPUSIM
// The warp's matrix instructions as PTX defines them (sm_80 and later);
// the CPU simulation defines the same functions on its fibers.
__device__ __forceinline__ unsigned smem_addr(const void* p) {
    unsigned a;
    asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(a) : "l"(p));
    return a;
}
#if __CUDA_ARCH__ >= 800
__device__ __forceinline__ void mma_bf16_16816(float* d, const unsigned* a, const unsigned* b, const float* c) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%10,%11,%12,%13};"
                 : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "f"(c[0]), "f"(c[1]), "f"(c[2]),
                   "f"(c[3]));
}
__device__ __forceinline__ void ldmatrix_x2(unsigned* r, const void* row) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];" : "=r"(r[0]), "=r"(r[1]) : "r"(smem_addr(row)));
}
__device__ __forceinline__ void ldmatrix_x4(unsigned* r, const void* row) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_addr(row)));
}
__device__ __forceinline__ void ldmatrix_x2_trans(unsigned* r, const void* row) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0,%1}, [%2];" : "=r"(r[0]), "=r"(r[1]) : "r"(smem_addr(row)));
}
#else
// Before sm_80 there are no bf16 tensor cores: the Go side never
// launches the fused kernels there (Device.FusedAttentionUnsupported).
__device__ __forceinline__ void mma_bf16_16816(float*, const unsigned*, const unsigned*, const float*) { asm("trap;"); }
__device__ __forceinline__ void ldmatrix_x2(unsigned*, const void*) { asm("trap;"); }
__device__ __forceinline__ void ldmatrix_x4(unsigned*, const void*) { asm("trap;"); }
__device__ __forceinline__ void ldmatrix_x2_trans(unsigned*, const void*) { asm("trap;"); }
#endif
#endif

// fa_pack rounds two floats to bf16, lo in the low half.
__device__ __forceinline__ unsigned fa_pack(float lo, float hi) {
    return (unsigned)bf16_round(lo) | (unsigned)bf16_round(hi) << 16;
}

// fa_stage rounds a FA_ROWS x HD tile to bf16 into shared memory (rows
// HD+FA_PAD apart, so that ldmatrix's eight rows fall in different
// banks): row r of src is ld elements after row r-1; rows from n on are
// 0. A bfloat16 src (qkv stored as bf16) is copied as is.
template <int HD, typename Src>
__device__ void fa_stage(bf16_t* dst, const Src* src, long long ld, int n) {
    for (int i = threadIdx.x; i < FA_ROWS * (HD / 2); i += blockDim.x) {
        int r = i / (HD / 2), c = 2 * (i - r * (HD / 2));
        float a = 0.f, b = 0.f;
        if (r < n) {
            a = load_in(src + r * ld + c);
            b = load_in(src + r * ld + c + 1);
        }
        *(unsigned*)&dst[r * (HD + FA_PAD) + c] = fa_pack(a, b);
    }
}

// fa_visible says whether query i sees key j.
__device__ __forceinline__ bool fa_visible(int i, int j, int T, int causal, const int* valid) {
    return i < T && j < T && (!causal || j <= i) && (!valid || valid[j]);
}

// fa_scores computes the warp's 16 x 64 block of A B^T into s: a (rows 16w..)
// and b are tiles in shared memory, the k dimension HD; s[n] holds columns
// 8n..8n+7 in the accumulator layout.
template <int HD>
__device__ __forceinline__ void fa_scores(float (*s)[4], const bf16_t* a, const bf16_t* b) {
    const int LD = HD + FA_PAD;
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    for (int n = 0; n < FA_ROWS / 8; n++)
        for (int e = 0; e < 4; e++) s[n][e] = 0.f;
    for (int kk = 0; kk < HD / 16; kk++) {
        unsigned af[4];
        ldmatrix_x4(af, &a[(warp * 16 + (lane & 15)) * LD + kk * 16 + (lane >> 4) * 8]);
        for (int n = 0; n < FA_ROWS / 8; n++) {
            unsigned bf[2];
            ldmatrix_x2(bf, &b[(n * 8 + (lane & 7)) * LD + kk * 16 + ((lane >> 3) & 1) * 8]);
            mma_bf16_16816(s[n], af, bf, s[n]);
        }
    }
}

// fa_accumulate adds the warp's 16 x 64 block p (accumulator layout, as
// fa_scores leaves it) times the 64 x HD tile v in shared memory into acc
// (16 x HD, acc[dn] holding columns 8dn..8dn+7).
template <int HD>
__device__ __forceinline__ void fa_accumulate(float (*acc)[4], float (*p)[4], const bf16_t* v) {
    const int LD = HD + FA_PAD;
    int lane = threadIdx.x & 31;
    for (int kk = 0; kk < FA_ROWS / 16; kk++) {
        // The accumulator's layout of two column blocks is the A operand's.
        unsigned pa[4] = {fa_pack(p[2 * kk][0], p[2 * kk][1]), fa_pack(p[2 * kk][2], p[2 * kk][3]),
                          fa_pack(p[2 * kk + 1][0], p[2 * kk + 1][1]), fa_pack(p[2 * kk + 1][2], p[2 * kk + 1][3])};
        for (int dn = 0; dn < HD / 8; dn++) {
            unsigned bf[2];
            ldmatrix_x2_trans(bf, &v[(kk * 16 + (lane & 15)) * LD + dn * 8]);
            mma_bf16_16816(acc[dn], pa, bf, acc[dn]);
        }
    }
}

template <int HD, typename QKV>
__device__ void flash_forward(QKV* out, float* lse, const QKV* qkv, const int* keyValid, int T, int nh, int g,
                              int W, int A, int q0, int k0, int v0, int causal, float scale) {
    HPCRUN_DYNAMIC_SHARED(bf16_t, fa_smem);
    const int LD = HD + FA_PAD;
    bf16_t *sq = fa_smem, *sk = sq + FA_ROWS * LD, *sv = sk + FA_ROWS * LD;
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, gq = lane >> 2, tq = lane & 3;
    int i0 = blockIdx.x * FA_ROWS, h = blockIdx.y, b = blockIdx.z, kvh = h / g;
    const QKV* rows = qkv + (long long)b * T * W + (long long)kvh * A;
    const int* valid = keyValid ? keyValid + (long long)b * T : 0;
    fa_stage<HD>(sq, rows + (long long)i0 * W + q0 + (h % g) * HD, W, min(FA_ROWS, T - i0));
    float o[HD / 8][4], m[2] = {NEG_INF, NEG_INF}, l[2] = {0.f, 0.f};
    for (int dn = 0; dn < HD / 8; dn++)
        for (int e = 0; e < 4; e++) o[dn][e] = 0.f;
    int row0 = i0 + warp * 16 + gq;  // this lane's rows: row0 and row0+8
    int kend = causal ? min(T, i0 + FA_ROWS) : T;
    for (int j0 = 0; j0 < kend; j0 += FA_ROWS) {
        fa_stage<HD>(sk, rows + (long long)j0 * W + k0, W, min(FA_ROWS, T - j0));
        fa_stage<HD>(sv, rows + (long long)j0 * W + v0, W, min(FA_ROWS, T - j0));
        __syncthreads();
        float s[FA_ROWS / 8][4];
        fa_scores<HD>(s, sq, sk);
        float mx[2] = {m[0], m[1]};
        for (int n = 0; n < FA_ROWS / 8; n++)
            for (int e = 0; e < 4; e++) {
                float x = fa_visible(row0 + 8 * (e >> 1), j0 + n * 8 + 2 * tq + (e & 1), T, causal, valid) ? s[n][e] * scale
                                                                                                            : NEG_INF;
                s[n][e] = x;
                mx[e >> 1] = fmaxf(mx[e >> 1], x);
            }
        for (int r = 0; r < 2; r++) {
            // A row lies in the four lanes of a group.
            mx[r] = fmaxf(mx[r], __shfl_xor_sync(FULL_MASK, mx[r], 1));
            mx[r] = fmaxf(mx[r], __shfl_xor_sync(FULL_MASK, mx[r], 2));
            float corr = mx[r] == NEG_INF ? 1.f : expf(m[r] - mx[r]);
            m[r] = mx[r];
            l[r] *= corr;
            for (int dn = 0; dn < HD / 8; dn++) {
                o[dn][2 * r] *= corr;
                o[dn][2 * r + 1] *= corr;
            }
        }
        for (int n = 0; n < FA_ROWS / 8; n++)
            for (int e = 0; e < 4; e++) {
                float p = s[n][e] == NEG_INF ? 0.f : expf(s[n][e] - m[e >> 1]);
                s[n][e] = p;
                l[e >> 1] += p;
            }
        fa_accumulate<HD>(o, s, sv);
        __syncthreads();
    }
    for (int r = 0; r < 2; r++) {
        l[r] += __shfl_xor_sync(FULL_MASK, l[r], 1);
        l[r] += __shfl_xor_sync(FULL_MASK, l[r], 2);
        int row = row0 + 8 * r;
        if (row >= T) continue;
        float inv = l[r] > 0.f ? 1.f / l[r] : 0.f;
        QKV* dst = out + ((long long)b * T + row) * nh * HD + h * HD + 2 * tq;
        for (int dn = 0; dn < HD / 8; dn++) {
            store_out(dst + dn * 8, o[dn][2 * r] * inv);
            store_out(dst + dn * 8 + 1, o[dn][2 * r + 1] * inv);
        }
        if (tq == 0) lse[((long long)b * nh + h) * T + row] = l[r] > 0.f ? m[r] + logf(l[r]) : POS_INF;
    }
}

// flash_backward_delta: delta[b,h,i] = sum_d dout[b,i,h,d] * out[b,i,h,d],
// one warp per (b, i, h) row of hd floats.
template <typename O>
__device__ __forceinline__ void flash_delta(float* delta, const O* out, const O* dout, long long rows, int T, int nh,
                                            int hd) {
    int lane = threadIdx.x & 31;
    long long warps = (long long)gridDim.x * (blockDim.x >> 5);
    for (long long r = (long long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5); r < rows; r += warps) {
        const O* o = out + r * hd;
        const O* d = dout + r * hd;
        float s = 0.f;
        for (int j = lane; j < hd; j += 32) s += load_in(o + j) * load_in(d + j);
        s = warp_sum(s);
        long long bt = r / nh, b = bt / T;
        if (lane == 0) delta[(b * nh + r % nh) * T + bt % T] = s;
    }
}

extern "C" __global__ void flash_backward_delta(float* delta, const float* out, const float* dout, long long rows, int T,
                                                int nh, int hd) {
    flash_delta(delta, out, dout, rows, T, nh, hd);
}

// flash_backward_delta_bf16: the forward's output and its gradient stored
// as bfloat16.
extern "C" __global__ void flash_backward_delta_bf16(float* delta, const bf16_t* out, const bf16_t* dout, long long rows,
                                                     int T, int nh, int hd) {
    flash_delta(delta, out, dout, rows, T, nh, hd);
}

// flash_backward_dkdv: a block takes 64 keys of kv head blockIdx.y and
// adds their dK and dV into dqkv, over the group's query heads and every
// query tile that sees them (summed in float32: a bfloat16 dqkv is
// rounded once, as it is written).
template <int HD, typename QKV>
__device__ void flash_backward_dkdv(QKV* dqkv, const QKV* qkv, const QKV* dout, const float* lse,
                                    const float* delta, const int* keyValid, int T, int nh, int g, int W, int A,
                                    int q0, int k0, int v0, int causal, float scale) {
    HPCRUN_DYNAMIC_SHARED(bf16_t, fa_smem);
    const int LD = HD + FA_PAD;
    bf16_t *sk = fa_smem, *sv = sk + FA_ROWS * LD, *sq = sv + FA_ROWS * LD, *sdo = sq + FA_ROWS * LD;
    float *sl = (float*)(sdo + FA_ROWS * LD), *sd = sl + FA_ROWS;
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, gq = lane >> 2, tq = lane & 3;
    int j0 = blockIdx.x * FA_ROWS, kvh = blockIdx.y, b = blockIdx.z;
    const QKV* rows = qkv + (long long)b * T * W + (long long)kvh * A;
    const int* valid = keyValid ? keyValid + (long long)b * T : 0;
    fa_stage<HD>(sk, rows + (long long)j0 * W + k0, W, min(FA_ROWS, T - j0));
    fa_stage<HD>(sv, rows + (long long)j0 * W + v0, W, min(FA_ROWS, T - j0));
    float dk[HD / 8][4], dv[HD / 8][4];
    for (int dn = 0; dn < HD / 8; dn++)
        for (int e = 0; e < 4; e++) dk[dn][e] = dv[dn][e] = 0.f;
    int key0 = j0 + warp * 16 + gq;  // this lane's keys: key0 and key0+8
    for (int r = 0; r < g; r++) {
        int h = kvh * g + r;
        const float* hl = lse + ((long long)b * nh + h) * T;
        const float* hd = delta + ((long long)b * nh + h) * T;
        for (int i0 = causal ? j0 : 0; i0 < T; i0 += FA_ROWS) {
            int nq = min(FA_ROWS, T - i0);
            fa_stage<HD>(sq, rows + (long long)i0 * W + q0 + r * HD, W, nq);
            fa_stage<HD>(sdo, dout + ((long long)b * T + i0) * nh * HD + h * HD, (long long)nh * HD, nq);
            for (int i = threadIdx.x; i < FA_ROWS; i += blockDim.x) {
                sl[i] = i < nq ? hl[i0 + i] : POS_INF;
                sd[i] = i < nq ? hd[i0 + i] : 0.f;
            }
            __syncthreads();
            // P^T and dP^T: 16 keys x 64 queries.
            float p[FA_ROWS / 8][4], dp[FA_ROWS / 8][4];
            fa_scores<HD>(p, sk, sq);
            fa_scores<HD>(dp, sv, sdo);
            for (int n = 0; n < FA_ROWS / 8; n++)
                for (int e = 0; e < 4; e++) {
                    int qi = n * 8 + 2 * tq + (e & 1);
                    float x = fa_visible(i0 + qi, key0 + 8 * (e >> 1), T, causal, valid) ? expf(p[n][e] * scale - sl[qi])
                                                                                         : 0.f;
                    p[n][e] = x;
                    dp[n][e] = x * (dp[n][e] - sd[qi]);  // dS^T
                }
            fa_accumulate<HD>(dv, p, sdo);
            fa_accumulate<HD>(dk, dp, sq);
            __syncthreads();
        }
    }
    for (int r = 0; r < 2; r++) {
        int key = key0 + 8 * r;
        if (key >= T) continue;
        QKV* row = dqkv + ((long long)b * T + key) * W + (long long)kvh * A + 2 * tq;
        for (int dn = 0; dn < HD / 8; dn++) {
            add_out(row + k0 + dn * 8, dk[dn][2 * r] * scale);
            add_out(row + k0 + dn * 8 + 1, dk[dn][2 * r + 1] * scale);
            add_out(row + v0 + dn * 8, dv[dn][2 * r]);
            add_out(row + v0 + dn * 8 + 1, dv[dn][2 * r + 1]);
        }
    }
}

// flash_backward_dq: a block takes 64 queries of head blockIdx.y and adds
// their dQ into dqkv, over every key tile they see.
template <int HD, typename QKV>
__device__ void flash_backward_dq(QKV* dqkv, const QKV* qkv, const QKV* dout, const float* lse,
                                  const float* delta, const int* keyValid, int T, int nh, int g, int W, int A, int q0,
                                  int k0, int v0, int causal, float scale) {
    HPCRUN_DYNAMIC_SHARED(bf16_t, fa_smem);
    const int LD = HD + FA_PAD;
    bf16_t *sq = fa_smem, *sdo = sq + FA_ROWS * LD, *sk = sdo + FA_ROWS * LD, *sv = sk + FA_ROWS * LD;
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, gq = lane >> 2, tq = lane & 3;
    int i0 = blockIdx.x * FA_ROWS, h = blockIdx.y, b = blockIdx.z, kvh = h / g;
    const QKV* rows = qkv + (long long)b * T * W + (long long)kvh * A;
    const int* valid = keyValid ? keyValid + (long long)b * T : 0;
    int nq = min(FA_ROWS, T - i0);
    fa_stage<HD>(sq, rows + (long long)i0 * W + q0 + (h % g) * HD, W, nq);
    fa_stage<HD>(sdo, dout + ((long long)b * T + i0) * nh * HD + h * HD, (long long)nh * HD, nq);
    int row0 = i0 + warp * 16 + gq;
    float rl[2], rd[2];
    for (int r = 0; r < 2; r++) {
        int row = row0 + 8 * r;
        rl[r] = row < T ? lse[((long long)b * nh + h) * T + row] : POS_INF;
        rd[r] = row < T ? delta[((long long)b * nh + h) * T + row] : 0.f;
    }
    float dq[HD / 8][4];
    for (int dn = 0; dn < HD / 8; dn++)
        for (int e = 0; e < 4; e++) dq[dn][e] = 0.f;
    int kend = causal ? min(T, i0 + FA_ROWS) : T;
    for (int j0 = 0; j0 < kend; j0 += FA_ROWS) {
        fa_stage<HD>(sk, rows + (long long)j0 * W + k0, W, min(FA_ROWS, T - j0));
        fa_stage<HD>(sv, rows + (long long)j0 * W + v0, W, min(FA_ROWS, T - j0));
        __syncthreads();
        float p[FA_ROWS / 8][4], dp[FA_ROWS / 8][4];
        fa_scores<HD>(p, sq, sk);
        fa_scores<HD>(dp, sdo, sv);
        for (int n = 0; n < FA_ROWS / 8; n++)
            for (int e = 0; e < 4; e++) {
                int r = e >> 1;
                float x = fa_visible(row0 + 8 * r, j0 + n * 8 + 2 * tq + (e & 1), T, causal, valid)
                              ? expf(p[n][e] * scale - rl[r])
                              : 0.f;
                dp[n][e] = x * (dp[n][e] - rd[r]);  // dS
            }
        fa_accumulate<HD>(dq, dp, sk);
        __syncthreads();
    }
    for (int r = 0; r < 2; r++) {
        int row = row0 + 8 * r;
        if (row >= T) continue;
        QKV* dst = dqkv + ((long long)b * T + row) * W + (long long)kvh * A + q0 + (h % g) * HD + 2 * tq;
        for (int dn = 0; dn < HD / 8; dn++) {
            add_out(dst + dn * 8, dq[dn][2 * r] * scale);
            add_out(dst + dn * 8 + 1, dq[dn][2 * r + 1] * scale);
        }
    }
}

// The entry points, one per head size and qkv dtype (_bf16: qkv, the
// forward's output, its gradient and dqkv stored as bfloat16).
#define FA_FWD_ARGS(QKV)                                                                                          \
    QKV *out, float *lse, const QKV *qkv, const int *keyValid, int T, int nh, int g, int W, int A, int q0, int k0, \
        int v0, int causal, float scale
#define FA_BWD_ARGS(QKV)                                                                                    \
    QKV *dqkv, const QKV *qkv, const QKV *dout, const float *lse, const float *delta, const int *keyValid, \
        int T, int nh, int g, int W, int A, int q0, int k0, int v0, int causal, float scale
#define FA_FWD_CALL out, lse, qkv, keyValid, T, nh, g, W, A, q0, k0, v0, causal, scale
#define FA_BWD_CALL dqkv, qkv, dout, lse, delta, keyValid, T, nh, g, W, A, q0, k0, v0, causal, scale

extern "C" __global__ void FA_BOUNDS flash_forward_32(FA_FWD_ARGS(float)) { flash_forward<32>(FA_FWD_CALL); }
extern "C" __global__ void FA_BOUNDS flash_forward_64(FA_FWD_ARGS(float)) { flash_forward<64>(FA_FWD_CALL); }
extern "C" __global__ void FA_BOUNDS flash_forward_128(FA_FWD_ARGS(float)) { flash_forward<128>(FA_FWD_CALL); }
extern "C" __global__ void FA_BOUNDS flash_forward_32_bf16(FA_FWD_ARGS(bf16_t)) { flash_forward<32>(FA_FWD_CALL); }
extern "C" __global__ void FA_BOUNDS flash_forward_64_bf16(FA_FWD_ARGS(bf16_t)) { flash_forward<64>(FA_FWD_CALL); }
extern "C" __global__ void FA_BOUNDS flash_forward_128_bf16(FA_FWD_ARGS(bf16_t)) { flash_forward<128>(FA_FWD_CALL); }
extern "C" __global__ void FA_BOUNDS flash_backward_dkdv_32(FA_BWD_ARGS(float)) { flash_backward_dkdv<32>(FA_BWD_CALL); }
extern "C" __global__ void FA_BOUNDS flash_backward_dkdv_64(FA_BWD_ARGS(float)) { flash_backward_dkdv<64>(FA_BWD_CALL); }
extern "C" __global__ void FA_BOUNDS flash_backward_dkdv_128(FA_BWD_ARGS(float)) { flash_backward_dkdv<128>(FA_BWD_CALL); }
extern "C" __global__ void FA_BOUNDS flash_backward_dkdv_32_bf16(FA_BWD_ARGS(bf16_t)) { flash_backward_dkdv<32>(FA_BWD_CALL); }
extern "C" __global__ void FA_BOUNDS flash_backward_dkdv_64_bf16(FA_BWD_ARGS(bf16_t)) { flash_backward_dkdv<64>(FA_BWD_CALL); }
extern "C" __global__ void FA_BOUNDS flash_backward_dkdv_128_bf16(FA_BWD_ARGS(bf16_t)) { flash_backward_dkdv<128>(FA_BWD_CALL); }
extern "C" __global__ void FA_BOUNDS flash_backward_dq_32(FA_BWD_ARGS(float)) { flash_backward_dq<32>(FA_BWD_CALL); }
extern "C" __global__ void FA_BOUNDS flash_backward_dq_64(FA_BWD_ARGS(float)) { flash_backward_dq<64>(FA_BWD_CALL); }
extern "C" __global__ void FA_BOUNDS flash_backward_dq_128(FA_BWD_ARGS(float)) { flash_backward_dq<128>(FA_BWD_CALL); }
extern "C" __global__ void FA_BOUNDS flash_backward_dq_32_bf16(FA_BWD_ARGS(bf16_t)) { flash_backward_dq<32>(FA_BWD_CALL); }
extern "C" __global__ void FA_BOUNDS flash_backward_dq_64_bf16(FA_BWD_ARGS(bf16_t)) { flash_backward_dq<64>(FA_BWD_CALL); }
extern "C" __global__ void FA_BOUNDS flash_backward_dq_128_bf16(FA_BWD_ARGS(bf16_t)) { flash_backward_dq<128>(FA_BWD_CALL); }
