/* mpi_allreduce: the Open MPI peer of `hpcrun bench comm`.
 *
 * Usage: mpi_allreduce MIN_BYTES MAX_BYTES
 * For sizes MIN_BYTES, 4*MIN_BYTES, ... up to MAX_BYTES it runs in-place
 * MPI_Allreduce(SUM) on float32 buffers with the same warm-up and iteration
 * counts as hpcrun's side and prints, on rank 0, one line per size:
 *   <bytes> <seconds per all-reduce>
 * where the time is the slowest rank's. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

/* iters mirrors CommIters in bench/comm.go. */
static int iters(long bytes) {
	long n = (256L << 20) / bytes;
	if (n < 3) n = 3;
	if (n > 200) n = 200;
	return (int)n;
}

/* warmups mirrors CommWarmups in bench/comm.go. */
static int warmups(long bytes) {
	long n = (16L << 20) / bytes;
	if (n < 1) n = 1;
	return n < iters(bytes) ? (int)n : iters(bytes);
}

int main(int argc, char **argv) {
	MPI_Init(&argc, &argv);
	int rank;
	MPI_Comm_rank(MPI_COMM_WORLD, &rank);
	if (argc != 3) {
		if (rank == 0) fprintf(stderr, "usage: mpi_allreduce MIN_BYTES MAX_BYTES\n");
		MPI_Finalize();
		return 2;
	}
	long lo = atol(argv[1]), hi = atol(argv[2]);
	float *buf = malloc(hi > 4 ? hi : 4);
	if (!buf) {
		fprintf(stderr, "mpi_allreduce: out of memory for %ld bytes\n", hi);
		MPI_Abort(MPI_COMM_WORLD, 1);
	}
	for (long bytes = lo; bytes <= hi; bytes *= 4) {
		int count = (int)(bytes / 4), n = iters(bytes);
		for (int i = 0; i < count; i++) buf[i] = (float)(rank + i % 7) * 0.25f;
		for (int i = 0, w = warmups(bytes); i < w; i++)
			MPI_Allreduce(MPI_IN_PLACE, buf, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
		MPI_Barrier(MPI_COMM_WORLD);
		double t0 = MPI_Wtime();
		for (int i = 0; i < n; i++)
			MPI_Allreduce(MPI_IN_PLACE, buf, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
		double dt = (MPI_Wtime() - t0) / n, worst;
		MPI_Reduce(&dt, &worst, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
		if (rank == 0) printf("%ld %.9f\n", bytes, worst);
		fflush(stdout);
	}
	free(buf);
	MPI_Finalize();
	return 0;
}
