package bench

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
)

// runMPI builds bench/mpi/mpi_allreduce.c and runs it on n ranks with
// mpirun and the transports btl; inside a Slurm allocation mpirun places
// the ranks on its nodes.
func runMPI(ctx context.Context, n int, lo, hi int64, btl string) (map[int64]float64, error) {
	mpicc, err := exec.LookPath("mpicc")
	if err != nil {
		return nil, errors.New("mpicc not found (apt-get install openmpi-bin libopenmpi-dev)")
	}
	mpirun, err := exec.LookPath("mpirun")
	if err != nil {
		return nil, errors.New("mpirun not found (apt-get install openmpi-bin)")
	}
	// The binary must be where every node can read it: next to the runs,
	// in the working directory's file system, not in a node's /tmp.
	dir, err := os.MkdirTemp(".", ".hpcrun-bench-mpi-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	src, bin := filepath.Join(dir, "mpi_allreduce.c"), filepath.Join(dir, "mpi_allreduce")
	if err := os.WriteFile(src, MPIAllreduceC, 0o644); err != nil {
		return nil, err
	}
	if out, err := exec.CommandContext(ctx, mpicc, "-O2", "-o", bin, src).CombinedOutput(); err != nil {
		return nil, fmt.Errorf("mpicc: %v: %s", err, out)
	}
	// Yield when idle: the ranks share few cores, and a busy-polling rank
	// would starve the one it waits for (mpirun only yields by itself when
	// it knows it oversubscribes, which inside an allocation it does not).
	args := []string{"-np", strconv.Itoa(n), "--oversubscribe", "--mca", "pml", "ob1", "--mca", "btl", btl, "--mca", "mpi_yield_when_idle", "1"}
	if os.Geteuid() == 0 {
		args = append([]string{"--allow-run-as-root"}, args...)
	}
	args = append(args, bin, strconv.FormatInt(lo, 10), strconv.FormatInt(hi, 10))
	var out, errb bytes.Buffer
	cmd := exec.CommandContext(ctx, mpirun, args...)
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("mpirun --mca btl %s: %v: %s", btl, err, strings.TrimSpace(errb.String()))
	}
	return parseTimes(&out)
}
