// Package bench runs hpcrun's benchmarks, each against a peer measured in
// the same run: Comm the all-reduce (its ranks run CommWorker) beside Open
// MPI's MPI_Allreduce, Gemm tensor.Sgemm beside OpenBLAS, Step a training
// step beside OpenBLAS on the step's own GEMMs (StepCUDA: on a GPU, for
// PyTorch's figures). It holds the sources of the peer programs,
// embedded so that the hpcrun binary can build them wherever it runs.
package bench

import _ "embed"

// MPIAllreduceC is the C source of the Open MPI all-reduce peer of
// `hpcrun bench comm` (build it with mpicc).
//
//go:embed mpi/mpi_allreduce.c
var MPIAllreduceC []byte
