// Kernels that exercise the simulation's intrinsics (cpusim_test.go):
// every shuffle, __syncwarp, dynamic shared memory, and a race between
// warps that thread order hides.
#define FULL 0xffffffffu

// shuffles: out[5*t + k] is what thread t got from shuffle k.
extern "C" __global__ void shuffles(int* out) {
    int t = threadIdx.x, lane = t & 31, v = 100 * t;
    out[5 * t + 0] = __shfl_sync(FULL, v, (lane * 7) & 31);
    out[5 * t + 1] = __shfl_down_sync(FULL, v, 3);
    out[5 * t + 2] = __shfl_up_sync(FULL, v, 5);
    out[5 * t + 3] = __shfl_xor_sync(FULL, v, 9);
    out[5 * t + 4] = __shfl_down_sync(FULL, v, 2, 8);
}

// syncwarp_exchange: each lane writes its slot, waits for its warp, and
// reads the slot of the lane opposite.
extern "C" __global__ void syncwarp_exchange(int* out) {
    __shared__ int sh[64];
    int t = threadIdx.x, w = t >> 5, lane = t & 31;
    sh[t] = t;
    __syncwarp();
    out[t] = sh[32 * w + 31 - lane];
}

// dyn_reverse: a block reverses its slice through dynamic shared memory.
extern "C" __global__ void dyn_reverse(float* out, const float* in) {
    HPCRUN_DYNAMIC_SHARED(float, sh);
    int t = threadIdx.x, n = blockDim.x, base = blockIdx.x * n;
    sh[t] = in[base + t];
    __syncthreads();
    out[base + t] = sh[n - 1 - t];
}

// dyn_unwritten: reads dynamic shared memory no thread wrote.
extern "C" __global__ void dyn_unwritten(float* out) {
    HPCRUN_DYNAMIC_SHARED(float, sh);
    out[threadIdx.x] = sh[threadIdx.x];
}

// racy_warps: warp 1 reads what warp 0 wrote with no barrier between:
// right in thread order, wrong (an earlier launch's value) when warp 1
// runs first.
extern "C" __global__ void racy_warps(float* out, int gen) {
    __shared__ float sh[64];
    int t = threadIdx.x;
    sh[t] = 1000 * gen + t;
    out[t] = t >= 32 ? sh[t - 32] : sh[t];
}

// mma_fragments: one warp computes D = A B + C with the fragments loaded
// from global memory by PTX's layout formulas: A 16x16 row-major, bt B's
// transpose (8x16 row-major: B column-major), C and D 16x8 row-major.
extern "C" __global__ void mma_fragments(float* D, const unsigned short* A, const unsigned short* bt, const float* C) {
    int lane = threadIdx.x, g = lane >> 2, t = lane & 3;
    unsigned a[4], b[2];
    float c[4], d[4];
    for (int i = 0; i < 4; i++) {
        int row = g + 8 * (i & 1), col = 2 * t + 8 * (i >> 1);
        a[i] = (unsigned)A[row * 16 + col] | (unsigned)A[row * 16 + col + 1] << 16;
    }
    for (int i = 0; i < 2; i++) {
        int k = 2 * t + 8 * i;
        b[i] = (unsigned)bt[g * 16 + k] | (unsigned)bt[g * 16 + k + 1] << 16;
    }
    for (int i = 0; i < 4; i++) c[i] = C[(g + 8 * (i >> 1)) * 8 + 2 * t + (i & 1)];
    mma_bf16_16816(d, a, b, c);
    for (int i = 0; i < 4; i++) D[(g + 8 * (i >> 1)) * 8 + 2 * t + (i & 1)] = d[i];
}

// ldmatrix_mma: the same product with A (16x16) and B (16x8, row-major:
// k by n) staged in shared memory and loaded by ldmatrix (A x4, B x2
// transposed); frag receives each lane's A registers.
extern "C" __global__ void ldmatrix_mma(float* D, unsigned* frag, const unsigned short* A, const unsigned short* B,
                                        const float* C) {
    __shared__ unsigned short sa[16 * 16], sb[16 * 8];
    int lane = threadIdx.x, g = lane >> 2, t = lane & 3;
    for (int i = lane; i < 256; i += 32) sa[i] = A[i];
    for (int i = lane; i < 128; i += 32) sb[i] = B[i];
    __syncwarp();
    unsigned a[4], b[2];
    int j = lane >> 3, r = lane & 7;
    ldmatrix_x4(a, &sa[(r + 8 * (j & 1)) * 16 + 8 * (j >> 1)]);
    ldmatrix_x2_trans(b, &sb[(r + 8 * (j & 1)) * 8]);
    for (int i = 0; i < 4; i++) frag[4 * lane + i] = a[i];
    float c[4], d[4];
    for (int i = 0; i < 4; i++) c[i] = C[(g + 8 * (i >> 1)) * 8 + 2 * t + (i & 1)];
    mma_bf16_16816(d, a, b, c);
    for (int i = 0; i < 4; i++) D[(g + 8 * (i >> 1)) * 8 + 2 * t + (i & 1)] = d[i];
}
