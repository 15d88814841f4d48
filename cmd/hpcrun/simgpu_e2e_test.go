package main

import (
	"bytes"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hpcrun/hpcrun/internal/cpusim"
	"github.com/hpcrun/hpcrun/internal/rundir"
	"github.com/hpcrun/hpcrun/slurm"
	"github.com/hpcrun/hpcrun/tensor/cuda"
	"github.com/hpcrun/hpcrun/train/metrics"
)

// Many GPUs without a GPU: every layout trains as processes launched by
// hpcrun run, as on a node, on simulated CUDA devices (package cpusim:
// the device's kernels on the CPU, cuBLAS, and a stand-in NCCL between
// the processes over shared memory), with collectives on the device
// through NCCL; the same run with the host-staged fallback (--comm tcp)
// and the CPU device's run give the same curve within simTolerance.

// simTolerance bounds the relative difference between the losses and
// gradient norms of two runs of one layout: the CPU device's kernels sum
// in other orders than the CUDA kernels, and the host-staged path reduces
// the loss and the norm's squares on the host (measured below 1e-7 over
// these runs).
const simTolerance = 1e-6

// simEnv returns an env whose hpcrun runs on the simulation with devices
// devices; it skips without g++ unless cpusim.RequireEnv is set.
func simEnv(t *testing.T, devices int) *env {
	t.Helper()
	dir := cpusim.SharedForTest(t, cuda.KernelSource())
	e := newEnv(t)
	e.extra = cpusim.Env(dir, devices)
	return e
}

// simText writes a small text file for the GPT runs (a few validation
// samples, so the final eval is short) and returns its path.
func simText(t *testing.T, dir string) string {
	var sb strings.Builder
	for i := 0; sb.Len() < 6000; i++ {
		fmt.Fprintf(&sb, "The %s cat sat on the %s mat, line %d.\n", []string{"red", "big", "old"}[i%3], []string{"blue", "small", "new", "warm"}[i%4], i%10)
	}
	path := filepath.Join(dir, "text.txt")
	if err := os.WriteFile(path, []byte(sb.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// curve is a run's per-step loss and gradient norm on its last rank (the
// last pipeline stage holds the loss), and what it printed.
type curve struct {
	loss, norm []float64
	out        string
}

func simCurve(t *testing.T, e *env, args ...string) curve {
	t.Helper()
	out := e.mustRun(append([]string{"run"}, args...)...)
	ents, err := os.ReadDir(filepath.Join(e.dir, "runs"))
	if err != nil || len(ents) == 0 {
		t.Fatalf("no run dir: %v", err)
	}
	run, err := metrics.ReadRun(filepath.Join(e.dir, "runs", ents[len(ents)-1].Name()))
	if err != nil {
		t.Fatal(err)
	}
	c := curve{out: out}
	for _, r := range run.Ranks {
		if r.End == nil || r.End.Status != metrics.StatusCompleted {
			t.Fatalf("hpcrun run %s: rank %d did not complete\n%s", strings.Join(args, " "), r.Rank, out)
		}
	}
	for _, st := range run.Ranks[len(run.Ranks)-1].Steps {
		c.loss = append(c.loss, st.Loss)
		c.norm = append(c.norm, st.GradNorm)
	}
	return c
}

func TestRunSimulatedGPUs(t *testing.T) {
	if testing.Short() {
		t.Skip("trains on simulated GPUs")
	}
	layouts := []struct {
		name  string
		nproc int
		args  []string
	}{
		{"tp2", 2, []string{"--tp", "2"}},
		{"dp2", 2, nil},
		{"pp2", 2, []string{"--pp", "2", "--micro-batches", "2"}},
		{"tp2xdp2-sp-zero1", 4, []string{"--tp", "2", "--sp", "--zero", "1"}},
		{"llama-tp2-kv-replicas", 2, []string{"--model", "llama", "--tp", "2", "--kv-heads", "1"}},
	}
	for _, l := range layouts {
		t.Run(l.name, func(t *testing.T) {
			e := simEnv(t, 4)
			common := append([]string{"--nproc", fmt.Sprint(l.nproc), "--model", "gpt", "--data", simText(t, e.dir),
				"--steps", "6", "--layers", "2", "--dim", "32", "--heads", "4", "--seq", "16", "--bsz", "8",
				"--eval-every", "0", "--eval-samples", "16", "--ckpt-every", "-1"}, l.args...)
			dev := simCurve(t, e, append(common, "--device", "cuda", "--comm", "nccl")...)
			host := simCurve(t, e, append(common, "--device", "cuda", "--comm", "tcp")...)
			cpu := simCurve(t, e, append(common, "--device", "cpu")...)
			if len(dev.loss) != 6 {
				t.Fatalf("%d steps, want 6", len(dev.loss))
			}
			// The training log says when collectives leave the device.
			const staged = "collectives go through host memory"
			if strings.Contains(dev.out, staged) || !strings.Contains(host.out, staged) {
				t.Errorf("--comm nccl ran on the device %v, --comm tcp through host memory %v:\n%s\n%s",
					!strings.Contains(dev.out, staged), strings.Contains(host.out, staged), dev.out, host.out)
			}
			worst := map[string]float64{}
			for _, other := range []struct {
				name string
				c    curve
			}{{"host-staged", host}, {"CPU device", cpu}} {
				for i := range dev.loss {
					for _, v := range [][2]float64{{dev.loss[i], other.c.loss[i]}, {dev.norm[i], other.c.norm[i]}} {
						d := math.Abs(v[0]-v[1]) / math.Abs(v[1])
						worst[other.name] = math.Max(worst[other.name], d)
						if !(d <= simTolerance) {
							t.Errorf("step %d: loss %.9g norm %.9g over NCCL, %.9g %.9g %s (relative %.2g)", i+1,
								dev.loss[i], dev.norm[i], other.c.loss[i], other.c.norm[i], other.name, d)
						}
					}
				}
			}
			t.Logf("loss %.5f -> %.5f; largest relative difference from the host-staged run %.2g, from the CPU device %.2g",
				dev.loss[0], dev.loss[5], worst["host-staged"], worst["CPU device"])
		})
	}
}

// A rank lost in the middle of training over NCCL (killed, or stopped: a
// peer alive that never posts its next call) stops the other: its device,
// waiting inside an NCCL call, is freed by the job's abort within the
// comm timeout, and it fails saying which rank it lost.
func TestSimulatedGPULostRankStopsThePeer(t *testing.T) {
	if testing.Short() {
		t.Skip("trains on simulated GPUs")
	}
	for _, sig := range []syscall.Signal{syscall.SIGKILL, syscall.SIGSTOP} {
		t.Run(sig.String(), func(t *testing.T) {
			e := simEnv(t, 2)
			e.mustRun("run", "--nproc", "2", "--tp", "2", "--model", "gpt", "--data", simText(t, e.dir), "--layers", "2",
				"--dim", "32", "--seq", "16", "--bsz", "8", "--steps", "1", "--ckpt-every", "-1",
				"--device", "cuda", "--comm", "nccl", "--comm-timeout", "3s")
			dir := rundir.Dir(e.onlyRun())
			conf, err := os.ReadFile(dir.Config())
			if err != nil {
				t.Fatal(err)
			}
			conf = regexp.MustCompile(`(?m)^steps = 1$`).ReplaceAll(conf, []byte("steps = 100000"))
			if err := os.WriteFile(dir.Config(), conf, 0o644); err != nil {
				t.Fatal(err)
			}
			ln, port, err := slurm.ListenMaster()
			if err != nil {
				t.Fatal(err)
			}
			ln.Close()
			ranks := make([]*exec.Cmd, 2)
			stderr := make([]bytes.Buffer, 2)
			for r := range ranks {
				os.Remove(dir.RankMetrics(r))
				cmd := exec.Command(e.bin, "train", "--run-dir", dir.Path())
				cmd.Env = append(append(os.Environ(), e.extra...), slurm.TorchrunVars(2, port, dir.ExecID(), "run")(r)...)
				cmd.Stderr = &stderr[r]
				if err := cmd.Start(); err != nil {
					t.Fatal(err)
				}
				ranks[r] = cmd
				defer cmd.Process.Kill()
			}
			// Two steps done: the world trains.
			deadline := time.Now().Add(time.Minute)
			for {
				if l, err := metrics.ReadRank(dir.RankMetrics(0)); err == nil && len(l.Steps) >= 2 {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("no two steps in a minute: %s%s", stderr[0].String(), stderr[1].String())
				}
				time.Sleep(50 * time.Millisecond)
			}
			start := time.Now()
			if err := ranks[1].Process.Signal(sig); err != nil {
				t.Fatal(err)
			}
			done := make(chan error, 1)
			go func() { done <- ranks[0].Wait() }()
			select {
			case err := <-done:
				if err == nil {
					t.Fatalf("rank 0 succeeded after losing rank 1: %s", stderr[0].String())
				}
			case <-time.After(30 * time.Second):
				t.Fatalf("rank 0 still runs 30 s after rank 1 got %v (comm timeout 3s): %s", sig, stderr[0].String())
			}
			msg := stderr[0].String()
			if !strings.Contains(msg, "rank 1") {
				t.Errorf("rank 0 says %q: want it to name rank 1", msg)
			}
			t.Logf("rank 0 stopped %v after rank 1 got %v: %s", time.Since(start).Round(time.Millisecond), sig, strings.TrimSpace(msg))
		})
	}
}
