package train

import (
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/hpcrun/hpcrun/internal/cpusim"
	"github.com/hpcrun/hpcrun/tensor/cuda"
)

// simChildEnv marks the child process of TestGPUTwoRanksOnCPUSim.
const simChildEnv = "HPCRUN_TRAIN_SIM_CHILD"

// The GPU tests of two ranks, and the fused attention's curves, on the
// CPU simulation of CUDA and NCCL (package cpusim), with two devices: in
// a child process, since the libraries load once a process. They must
// pass there, not skip.
func TestGPUTwoRanksOnCPUSim(t *testing.T) {
	if os.Getenv(simChildEnv) != "" {
		t.Skip("the child process")
	}
	if testing.Short() {
		t.Skip("trains on simulated GPUs")
	}
	dir := cpusim.SharedForTest(t, cuda.KernelSource())
	names := []string{"TestGPUZeROTwoRanksMatchesCPU", "TestGPUBF16ZeROTwoRanks", "TestGPUFusedAttentionCurves"}
	cmd := exec.Command(os.Args[0], "-test.run", "^("+strings.Join(names, "|")+")$", "-test.v", "-test.count=1")
	cmd.Env = append(os.Environ(), append(cpusim.Env(dir, 2), simChildEnv+"=1")...)
	out, err := cmd.CombinedOutput()
	for _, name := range names {
		if err != nil || !strings.Contains(string(out), "--- PASS: "+name+" ") {
			t.Fatalf("%s on the simulation: %v\n%s", name, err, out)
		}
	}
	t.Logf("%s", out)
}
