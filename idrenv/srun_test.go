package idrenv

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestSrunHpcrunEnv runs `srun -n 4 hpcrun env --json` on a reachable Slurm
// (scripts/slurm-local.sh up starts a one-node one) and checks that the four
// tasks see ranks 0..3 of one world with one master.
func TestSrunHpcrunEnv(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: skipping the srun end-to-end test")
	}
	if _, err := exec.LookPath("srun"); err != nil {
		t.Skip("srun is not on PATH (no Slurm; scripts/slurm-local.sh up starts one)")
	}
	if out, err := exec.Command("sinfo", "-h").CombinedOutput(); err != nil {
		t.Skipf("no Slurm reachable (sinfo: %v: %s); scripts/slurm-local.sh up starts one", err, bytes.TrimSpace(out))
	}
	bin := filepath.Join(t.TempDir(), "hpcrun")
	build := exec.Command("go", "build", "-o", bin, "./cmd/hpcrun")
	build.Dir = ".."
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build ./cmd/hpcrun: %v\n%s", err, out)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	srun := exec.CommandContext(ctx, "srun", "--immediate=120", "--time=2", "-J", "idrenv-test", "-n", "4", bin, "env", "--json")
	srun.Dir = t.TempDir()
	srun.Env = launcherFreeEnv()
	var stdout, stderr bytes.Buffer
	srun.Stdout, srun.Stderr = &stdout, &stderr
	if err := srun.Run(); err != nil {
		if strings.Contains(stderr.String(), "Unable to allocate resources") {
			t.Skipf("Slurm is reachable but has no room for 4 tasks now: %s", strings.TrimSpace(stderr.String()))
		}
		t.Fatalf("srun -n 4 hpcrun env --json: %v\n%s", err, stderr.String())
	}

	var envs []Env
	dec := json.NewDecoder(&stdout)
	for {
		var e Env
		err := dec.Decode(&e)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("decoding srun output: %v\n%s", err, stdout.String())
		}
		envs = append(envs, e)
	}
	if len(envs) != 4 {
		t.Fatalf("got %d JSON objects from 4 tasks", len(envs))
	}
	seen := map[int]bool{}
	masters := 0
	first := envs[0]
	for _, e := range envs {
		if e.Source != SlurmStep || e.WorldSize != 4 {
			t.Errorf("rank %d: source %s, world %d; want slurm-step, 4", e.Rank, e.Source, e.WorldSize)
		}
		if seen[e.Rank] || e.Rank < 0 || e.Rank > 3 {
			t.Errorf("rank %d twice or out of 0..3", e.Rank)
		}
		seen[e.Rank] = true
		if e.IsMaster {
			masters++
			if e.Rank != 0 {
				t.Errorf("rank %d claims to be the master", e.Rank)
			}
		}
		if e.MasterAddr != first.MasterAddr || e.MasterPort != first.MasterPort || e.JobID != first.JobID {
			t.Errorf("rank %d sees master %s:%d job %s, rank %d sees %s:%d job %s",
				e.Rank, e.MasterAddr, e.MasterPort, e.JobID, first.Rank, first.MasterAddr, first.MasterPort, first.JobID)
		}
		if e.MasterAddr != e.Nodes[0] {
			t.Errorf("rank %d: master %s is not the first node of %v", e.Rank, e.MasterAddr, e.Nodes)
		}
	}
	if masters != 1 {
		t.Errorf("%d masters, want 1", masters)
	}
	if want := DerivePort(first.JobID); first.MasterPort != want {
		t.Errorf("master port %d, want %d derived from job %s", first.MasterPort, want, first.JobID)
	}
	t.Logf("job %s: 4 ranks, master %s:%d", first.JobID, first.MasterAddr, first.MasterPort)
}

// launcherFreeEnv is this process's environment without the variables that
// would make the tasks detect torchrun or a fixed master port.
func launcherFreeEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if strings.HasPrefix(kv, "TORCHELASTIC_") || strings.HasPrefix(kv, "MASTER_PORT=") || strings.HasPrefix(kv, "MASTER_ADDR=") {
			continue
		}
		env = append(env, kv)
	}
	return env
}
