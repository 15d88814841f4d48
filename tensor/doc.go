// Package tensor is the compute engine under the parallel layers: tensors of
// float32 on a Device (CPU always; CUDA when its libraries load), GEMM and the
// kernels a transformer's forward and backward passes need, with memory
// accounting. It knows nothing of parallelism.
package tensor
