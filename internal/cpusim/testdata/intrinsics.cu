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
