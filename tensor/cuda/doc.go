// Package cuda is the NVIDIA GPU backend of package tensor: a tensor.Device
// whose tensors live in device memory and whose kernels run on one CUDA
// stream.
//
// Nothing of CUDA is needed to build it, nor cgo: libcuda.so.1, cuBLAS and
// NVRTC are opened at run time with purego, found by package cudalib's
// rule (HPCRUN_CUDA_LIB_PATH, LD_LIBRARY_PATH, the nvidia-* wheels of the
// job's python3, CUDA_HOME, the dynamic linker; a library found in a
// directory has its companion, libcublasLt or libnvrtc-builtins, opened
// from the same directory first). An NVRTC of a newer major release than
// the driver is passed over for an older one, since its kernels would not
// load. Available says whether the backend can run here and, when not,
// why; Open says what is missing.
//
//	d, err := cuda.Open(0) // primary context, stream, cuBLAS, kernels
//	x, _ := d.Alloc(B, T, C)
//	d.LayerNormForward(out, mean, rstd, x, w, b, 1e-5)
//	err = d.Sync() // the first asynchronous failure, if any
//
// GEMMs go through cublasGemmEx and cublasGemmStridedBatchedEx; row-major
// operands are handled by swapping them (C^T = B^T A^T). SetMatmulPrecision
// picks FP32 (the default: float32 compute, the CPU device's results within
// rounding), TF32, or BF16 (operands rounded to bfloat16 by a kernel that
// packs each batch's matrices, so only their elements are converted;
// float32 accumulation and output).
//
// Every other kernel is CUDA C in kernels.cu, embedded in the binary,
// compiled by NVRTC for the device's architecture (sm_XY) when the device
// is opened and cached on disk under os.UserCacheDir()/hpcrun/cuda (or
// HPCRUN_CUDA_CACHE), keyed by the SHA-256 of the source, the architecture
// and NVRTC's version. Semantics are the CPU device's, and so are the
// argument checks and panic messages: both call tensor/internal/check;
// integer inputs (ids, targets, masks) are staged through a pinned ring so
// that callers may reuse them at once. Kernels launched with up to 1024
// threads a block carry __launch_bounds__; a test compiles kernels.cu for
// sm_70, sm_80 and sm_90 without a GPU and checks every kernel's register
// count (read from the CUBIN) against its largest launch.
//
// The training step's scalars (SumSquaresEach, SumBlocks, ClipNorm, the
// scale AdamW reads, SumTo) keep the gradient norm, the clip coefficient
// and the loss in device memory, and Fetch is its one read a step;
// HostSyncs counts the host's waits on the stream.
//
// Memory comes from a caching allocator: freed blocks are kept in free lists
// per size class and reused, so a training loop calls cuMemAlloc only in
// its first step. MemStats counts the bytes tensors asked for, as on the
// CPU, and its peak also counts the kernels' workspace (bf16 copies of GEMM
// operands, reduction partials, staged ids) held at the time; AllocStats
// adds what is reserved from the driver and the workspace.
package cuda
