// Package bench holds the sources of the peer programs that hpcrun's
// benchmarks measure themselves against, embedded so that the hpcrun
// binary can build them wherever it runs.
package bench

import _ "embed"

// MPIAllreduceC is the C source of the Open MPI all-reduce peer of
// `hpcrun bench comm` (build it with mpicc).
//
//go:embed mpi/mpi_allreduce.c
var MPIAllreduceC []byte
