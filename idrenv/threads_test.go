package idrenv

import (
	"runtime"
	"testing"
)

func TestThreads(t *testing.T) {
	for _, tt := range []struct {
		cpus       int
		gomaxprocs string
		numCPU     int
		want       int
	}{
		{4, "", 16, 4},   // the CPUs Slurm gave the task
		{32, "", 16, 16}, // at most the machine's
		{0, "", 16, 0},   // the launcher did not say: the default
		{4, "2", 16, 0},  // GOMAXPROCS set wins
	} {
		if got := (Env{CPUsPerTask: tt.cpus}).threads(tt.gomaxprocs, tt.numCPU); got != tt.want {
			t.Errorf("%d CPUs a task, GOMAXPROCS=%q, %d cores: %d threads, want %d", tt.cpus, tt.gomaxprocs, tt.numCPU, got, tt.want)
		}
	}
}

func TestLimitThreads(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(0))
	t.Setenv("GOMAXPROCS", "")
	if n := (Env{CPUsPerTask: 1}).LimitThreads(); n != 1 || runtime.GOMAXPROCS(0) != 1 {
		t.Errorf("LimitThreads = %d, GOMAXPROCS %d; want 1, 1", n, runtime.GOMAXPROCS(0))
	}
	runtime.GOMAXPROCS(2)
	if n := (Env{}).LimitThreads(); n != 0 || runtime.GOMAXPROCS(0) != 2 {
		t.Errorf("without CPUs a task: LimitThreads = %d, GOMAXPROCS %d; want 0, left at 2", n, runtime.GOMAXPROCS(0))
	}
}
