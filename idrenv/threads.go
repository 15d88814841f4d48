package idrenv

import (
	"os"
	"runtime"
)

// LimitThreads makes this process's threads (GOMAXPROCS, which the
// engine's kernels follow) the CPUs the launcher gave this task, as
// OMP_NUM_THREADS would, at most this machine's: tasks sharing a node must
// not each take all its cores. A GOMAXPROCS variable, set, wins. It
// returns the number set, 0 when it left the default.
func (e Env) LimitThreads() int {
	n := e.threads(os.Getenv("GOMAXPROCS"), runtime.NumCPU())
	if n > 0 {
		runtime.GOMAXPROCS(n)
	}
	return n
}

// threads is LimitThreads' number on a machine of numCPU cores where the
// GOMAXPROCS variable is gomaxprocs; 0: leave the default.
func (e Env) threads(gomaxprocs string, numCPU int) int {
	if e.CPUsPerTask <= 0 || gomaxprocs != "" {
		return 0
	}
	return min(e.CPUsPerTask, numCPU)
}
