package main

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hpcrun/hpcrun/internal/rundir"
	"github.com/hpcrun/hpcrun/train/metrics"
)

// nodesUp skips unless the local Slurm has at least n namespace nodes
// (scripts/slurm-local.sh up --nodes 3, which make test starts as root).
func nodesUp(t testing.TB, n int) {
	t.Helper()
	if testing.Short() {
		t.Skip("e2e: -short")
	}
	slurmUp(t)
	out, err := exec.Command("sinfo", "-h", "-N", "-t", "idle,mixed,allocated", "-o", "%N").Output()
	nodes := strings.Fields(string(out))
	if err != nil || len(nodes) < n || !strings.HasPrefix(nodes[0], "n") {
		t.Skipf("the local Slurm has nodes %v; these tests need %d namespace nodes: as root, scripts/slurm-local.sh up --nodes 3", nodes, n)
	}
}

// TestMultiNodeEnv: srun -N 3 -n 6 hpcrun env --json sees three hosts, two
// local ranks on each, and one master, the first node.
func TestMultiNodeEnv(t *testing.T) {
	nodesUp(t, 3)
	e := newEnv(t)
	out := filepath.Join(e.dir, "env-%t.json")
	cmd := exec.Command("srun", "-N", "3", "-n", "6", "--ntasks-per-node", "2", "--output", out, e.bin, "env", "--json")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("srun: %v: %s", err, b)
	}
	hosts, masters := map[string]int{}, map[string]bool{}
	for r := range 6 {
		b, err := os.ReadFile(filepath.Join(e.dir, fmt.Sprintf("env-%d.json", r)))
		if err != nil {
			t.Fatal(err)
		}
		var env struct {
			Rank       int    `json:"rank"`
			LocalRank  int    `json:"local_rank"`
			Node       string `json:"node"`
			NodeRank   int    `json:"node_rank"`
			MasterAddr string `json:"master_addr"`
		}
		if err := json.Unmarshal(b, &env); err != nil {
			t.Fatalf("task %d: %v: %s", r, err, b)
		}
		if env.Rank != r || env.LocalRank != r%2 || env.NodeRank != r/2 || env.Node != fmt.Sprintf("n%d", r/2+1) {
			t.Errorf("task %d: %+v, want local rank %d on node n%d", r, env, r%2, r/2+1)
		}
		hosts[env.Node]++
		masters[env.MasterAddr] = true
	}
	if len(hosts) != 3 || len(masters) != 1 || !masters["n1"] {
		t.Errorf("hosts %v, masters %v: want 3 hosts and the one master n1", hosts, masters)
	}
}

// TestMultiNodeTrainingMatchesOneNode: tp=2 x dp=2 over two nodes (tp
// groups inside a node, dp across, the all-reduces crossing the bridge)
// gives the loss curve of the same job on one node.
func TestMultiNodeTrainingMatchesOneNode(t *testing.T) {
	nodesUp(t, 2)
	e := newEnv(t)
	args := []string{"--executor", "slurm", "--wait", "--ntasks", "4", "--tp", "2", "--steps", "20", "--eval-every", "0", "--device", "cpu"}
	two := e.submit(append(args, "--nodes", "2")...)
	one := e.submit(append(args, "--nodes", "1")...)
	errLog, _ := os.ReadFile(filepath.Join(two.RunDir, "slurm-"+two.JobID+".err"))
	for _, want := range []string{"shared memory on one host", "TCP ring across 2 hosts"} {
		if !strings.Contains(string(errLog), want) {
			t.Errorf("the 2-node job's log does not say %q:\n%s", want, errLog)
		}
	}
	hosts := map[string]bool{}
	for r := range 4 {
		b, _ := os.ReadFile(filepath.Join(two.RunDir, "metrics", fmt.Sprintf("rank-%05d.jsonl", r)))
		var run struct {
			Host string `json:"host"`
		}
		json.Unmarshal([]byte(strings.SplitN(string(b), "\n", 2)[0]), &run)
		hosts[run.Host] = true
	}
	if len(hosts) != 2 {
		t.Errorf("the ranks ran on %v, want two hosts", hosts)
	}
	a, _, _ := stepLosses(t, filepath.Join(two.RunDir, "metrics", "rank-00000.jsonl"))
	b, _, _ := stepLosses(t, filepath.Join(one.RunDir, "metrics", "rank-00000.jsonl"))
	if len(a) != 20 || len(b) != 20 {
		t.Fatalf("%d and %d steps, want 20", len(a), len(b))
	}
	for s := 1; s <= 20; s++ {
		if d := math.Abs(a[s]-b[s]) / math.Max(math.Abs(b[s]), 1e-12); d > 1e-6 {
			t.Errorf("step %d: loss %v on 2 nodes, %v on 1 (rel %.2g)", s, a[s], b[s], d)
		}
	}
}

// TestMultiNodeCheck: the tensor-parallel checks as a 2-node job.
func TestMultiNodeCheck(t *testing.T) {
	nodesUp(t, 2)
	e := newEnv(t)
	s := e.submit("--executor", "slurm", "--wait", "--check", "all", "--tp", "2", "--ntasks", "4", "--nodes", "2")
	out, _ := os.ReadFile(filepath.Join(s.RunDir, "slurm-"+s.JobID+".out"))
	if !regexp.MustCompile(`all \d+ checks passed`).Match(out) {
		t.Errorf("check job output:\n%s", out)
	}
}

// TestMultiNodeBadInput: too many nodes is Slurm's refusal passed on;
// tensor-parallel groups that would straddle nodes are refused before
// anything is written.
func TestMultiNodeBadInput(t *testing.T) {
	nodesUp(t, 2)
	e := newEnv(t)
	_, errOut, code := e.run("submit", "--executor", "slurm", "--nodes", "9", "--ntasks", "18", "--tp", "2")
	if code == 0 || !strings.Contains(errOut, "sbatch") || strings.Count(strings.TrimSpace(errOut), "\n") > 0 {
		t.Errorf("9 nodes: exit %d, %q; want sbatch's refusal on one line", code, errOut)
	}
	_, errOut, code = e.run("submit", "--executor", "slurm", "--nodes", "2", "--ntasks", "6", "--tp", "2")
	if code == 0 || !strings.Contains(errOut, "straddle") {
		t.Errorf("tp across nodes: exit %d, %q", code, errOut)
	}
	if ents, _ := os.ReadDir(filepath.Join(e.dir, "runs")); len(ents) != 1 {
		t.Errorf("%d run dirs, want only the one of the refused sbatch", len(ents))
	}
}

// TestMultiNodeLostNode loses one node under three 2-node jobs at once
// (Slurm's detection of a dead node takes most of the time, so the jobs
// share one loss): it kills every process of the node (its slurmd and
// tasks) and checks what each job then does.
//   - A checkpointing tp 2 x dp 2 job: the surviving ranks fail within
//     60 s naming the lost rank and host; rank 0 requeues the job, which
//     resumes from its last checkpoint on nodes that work and completes
//     with the losses of an undisturbed job, bit for bit.
//   - The same job without checkpoints: it ends FAILED or NODE_FAIL
//     within a minute, the survivors naming the lost host; nothing hangs.
//   - pp 2 x tp 2 x dp 2, stage 1 on the lost node: every rank of stage 0
//     fails within 60 s naming a rank of the lost stage and its host (in
//     the schedule, or in the step's reductions over the stages); the job
//     then ends FAILED or NODE_FAIL.
func TestMultiNodeLostNode(t *testing.T) {
	nodesUp(t, 3)
	e := newEnv(t)
	conf := `default_profile = "mn"
[profiles.mn]
executor = "slurm"
time = "10:00"
checkpoint = true
[train]
max_requeues = 2
ckpt_every = 20
`
	os.WriteFile(filepath.Join(e.dir, "hpcrun.toml"), []byte(conf), 0o644)
	// Enough steps that the checkpointing job is still training when its
	// node is lost: a tiny step takes ~6 ms on an idle machine, so 300
	// could end first.
	const steps = 1000
	args := []string{"--ntasks", "4", "--tp", "2", "--nodes", "2", "--preset", "tiny", "--steps", strconv.Itoa(steps), "--samples", "512", "--device", "cpu", "--eval-every", "0"}
	ckpt := e.submit(args...)
	defer restoreNodes(t)
	metricsFile := filepath.Join(ckpt.RunDir, "metrics", "rank-00000.jsonl")
	deadline := time.Now().Add(150 * time.Second)
	waitForSteps(t, ckpt.RunDir, 1)
	// The jobs without checkpoints run on the same two nodes.
	nodes := jobNodes(t, ckpt.JobID)
	os.WriteFile(filepath.Join(e.dir, "hpcrun.toml"), []byte(conf+fmt.Sprintf(`[profiles.pinned]
executor = "slurm"
time = "10:00"
sbatch_extra = ["--nodelist=%s"]
`, strings.Join(nodes, ","))), 0o644)
	noCkpt := []string{"--profile", "pinned", "--nodes", "2", "--preset", "tiny", "--steps", "100000", "--samples", "512",
		"--device", "cpu", "--eval-every", "0", "--ckpt-every", "-1"}
	plain := e.submit(append([]string{"--ntasks", "4", "--tp", "2"}, noCkpt...)...)
	pipe := e.submit(append([]string{"--ntasks", "8", "--pp", "2", "--tp", "2"}, noCkpt...)...)
	waitForSteps(t, plain.RunDir, 5)
	waitForSteps(t, pipe.RunDir, 5)
	for {
		if losses, _, _ := stepLosses(t, metricsFile); len(losses) >= 50 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the checkpointing job made too few steps in 150 s")
		}
		time.Sleep(50 * time.Millisecond)
	}
	for _, s := range []submitted{plain, pipe} {
		if got := jobNodes(t, s.JobID); strings.Join(got, ",") != strings.Join(nodes, ",") {
			t.Fatalf("job %s runs on %v, want %v", s.JobID, got, nodes)
		}
	}
	// The second node of the allocation is lost.
	lost := killSecondNode(t, ckpt.JobID)
	killed := time.Now()

	t.Run("pipeline stage lost", func(t *testing.T) {
		for ; ; time.Sleep(100 * time.Millisecond) {
			run, err := metrics.ReadRun(pipe.RunDir)
			if err != nil {
				t.Fatal(err)
			}
			ended := 0
			for _, r := range run.Ranks[:4] {
				if r.End != nil {
					ended++
				}
			}
			if ended == 4 {
				for _, r := range run.Ranks[:4] {
					if r.End.Status != metrics.StatusFailed || !strings.Contains(r.End.Error, "("+lost+")") {
						t.Errorf("rank %d ended %s: %q, want a failure naming host %s", r.Rank, r.End.Status, r.End.Error, lost)
					}
				}
				break
			}
			if time.Since(killed) > 60*time.Second {
				t.Fatalf("60 s after node %s was lost, %d of stage 0's 4 ranks have ended", lost, ended)
			}
		}
	})
	t.Run("checkpointing job requeues", func(t *testing.T) {
		errPath := filepath.Join(ckpt.RunDir, "slurm-"+ckpt.JobID+".err")
		for ; ; time.Sleep(100 * time.Millisecond) {
			b, _ := os.ReadFile(errPath)
			if strings.Contains(string(b), "requeued job "+ckpt.JobID) {
				if !strings.Contains(string(b), "("+lost+")") {
					t.Errorf("the survivors' errors do not name the lost host %s:\n%s", lost, b)
				}
				break
			}
			if time.Since(killed) > 60*time.Second {
				t.Fatalf("60 s after node %s was lost, rank 0 did not requeue the job:\n%s", lost, b)
			}
		}
		requeueNow(t, ckpt, 1, deadline, nil)
	})
	// Slurm ends the jobs before the node comes back, or it stays down.
	for name, s := range map[string]submitted{"job without checkpoints fails": plain, "pipeline job fails": pipe} {
		t.Run(name, func(t *testing.T) {
			for ; ; time.Sleep(200 * time.Millisecond) {
				if st, _ := slurmJob(t, s.JobID); st == "FAILED" || st == "NODE_FAIL" {
					break
				}
				if time.Since(killed) > 90*time.Second {
					st, _ := slurmJob(t, s.JobID)
					t.Fatalf("job %s is %s 90 s after node %s was lost, want FAILED or NODE_FAIL", s.JobID, st, lost)
				}
			}
			errLog, _ := os.ReadFile(filepath.Join(s.RunDir, "slurm-"+s.JobID+".err"))
			if !strings.Contains(string(errLog), "("+lost+")") {
				t.Errorf("the survivors do not name the lost host %s:\n%s", lost, errLog)
			}
		})
	}
	t.Run("checkpointing job resumes and completes", func(t *testing.T) {
		waitCompleted(t, ckpt, deadline.Add(60*time.Second))
		losses, starts, _ := stepLosses(t, metricsFile)
		if starts != 2 || len(losses) != steps {
			t.Fatalf("%d starts, %d steps; want 2 and %d", starts, len(losses), steps)
		}
		// The same job undisturbed, on two working nodes.
		sameAsUndisturbed(t, e, args, metricsFile, losses, steps)
	})
}

// jobNodes is the nodes job id runs on.
func jobNodes(t *testing.T, id string) []string {
	t.Helper()
	out, _ := exec.Command("squeue", "-h", "-j", id, "-o", "%N").Output()
	nodes, _ := exec.Command("scontrol", "show", "hostnames", strings.TrimSpace(string(out))).Output()
	return strings.Fields(string(nodes))
}

// killSecondNode kills every process (slurmd and tasks) of the second node
// of job id's allocation, as if the node died, and returns its name.
func killSecondNode(t *testing.T, id string) string {
	t.Helper()
	names := jobNodes(t, id)
	if len(names) != 2 {
		t.Fatalf("job %s runs on %q, want 2 nodes", id, names)
	}
	if b, err := exec.Command("sh", "-c", "ip netns pids hpcrun-"+names[1]+" | xargs -r kill -9").CombinedOutput(); err != nil {
		t.Fatalf("kill node %s: %v: %s", names[1], err, b)
	}
	return names[1]
}

// restoreNodes starts the slurmd of a killed node again and returns it to
// service, so that later tests find every node idle.
func restoreNodes(t *testing.T) {
	if b, err := exec.Command("../../scripts/slurm-local.sh", "up", "--nodes", "3").CombinedOutput(); err != nil {
		t.Errorf("restore the nodes: %v: %s", err, b)
	}
}

// TestMultiNodePipeline is the command on the local Slurm:
// `hpcrun submit --ntasks 8 --pp 2 --tp 2` over two nodes (one stage a
// node) completes, every rank on its stage, with a checkpoint in the pp-1
// layout and the bubble in the summary.
func TestMultiNodePipeline(t *testing.T) {
	nodesUp(t, 2)
	e := newEnv(t)
	s := e.submit("--executor", "slurm", "--ntasks", "8", "--pp", "2", "--tp", "2", "--nodes", "2", "--preset", "tiny",
		"--steps", "10", "--samples", "512", "--device", "cpu", "--eval-every", "0")
	waitCompleted(t, s, time.Now().Add(120*time.Second))
	run, err := metrics.ReadRun(s.RunDir)
	if err != nil {
		t.Fatal(err)
	}
	hosts := map[int]map[string]bool{0: {}, 1: {}}
	for _, r := range run.Ranks {
		if r.End == nil || r.End.Status != metrics.StatusCompleted || r.Info == nil || r.Info.PPRank != r.Rank/4 {
			t.Fatalf("rank %d: %+v, end %+v", r.Rank, r.Info, r.End)
		}
		hosts[r.Info.PPRank][r.Info.Host] = true
	}
	if len(hosts[0]) != 1 || len(hosts[1]) != 1 {
		t.Errorf("stages on hosts %v, want one host each", hosts)
	}
	if _, err := os.Stat(filepath.Join(rundir.Dir(s.RunDir).Ckpt(), "step-000010", "model-tp1-of-2.safetensors")); err != nil {
		t.Errorf("checkpoint: %v", err)
	}
	sum, _ := metrics.Summarize(run)
	if len(sum.Bubble) != 2 || sum.Config.PP != 2 || sum.Config.DP != 2 {
		t.Errorf("summary: bubble %+v, pp %d dp %d", sum.Bubble, sum.Config.PP, sum.Config.DP)
	}
}

// TestMultiNodeOwnFailureNamesTheRank: on a 2-node job, rank 2 (on the
// second node) cannot open its metrics file. Its error becomes the job's:
// the other ranks stop within seconds, each quoting rank 2, its host and
// its message (before, they timed out after 30 s and blamed a healthy rank
// as stalled), their end lines say so, and the job ends FAILED.
func TestMultiNodeOwnFailureNamesTheRank(t *testing.T) {
	nodesUp(t, 2)
	e := newEnv(t)
	conf := "default_profile = \"held\"\n[profiles.held]\nexecutor = \"slurm\"\npartition = \"debug\"\ncpus_per_task = 1\ntime = \"00:10:00\"\nsbatch_extra = [\"--hold\"]\n[train]\ndevice = \"cpu\"\n"
	if err := os.WriteFile(filepath.Join(e.dir, "hpcrun.toml"), []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	s := e.submit("--ntasks", "4", "--tp", "2", "--nodes", "2", "--preset", "tiny", "--steps", "200", "--samples", "512", "--eval-every", "0", "--ckpt-every", "-1")
	defer exec.Command("scancel", s.JobID).Run()
	bad := rundir.Dir(s.RunDir).RankMetrics(2)
	if err := os.MkdirAll(bad, 0o755); err != nil { // opening it for appending fails
		t.Fatal(err)
	}
	if b, err := exec.Command("scontrol", "release", s.JobID).CombinedOutput(); err != nil {
		t.Fatalf("scontrol release: %v: %s", err, b)
	}
	var started time.Time
	for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(200 * time.Millisecond) {
		st, _ := slurmJob(t, s.JobID)
		if st == "RUNNING" && started.IsZero() {
			started = time.Now()
		}
		if st == "FAILED" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("job %s is %s 2 minutes after its release, want FAILED", s.JobID, st)
		}
	}
	if took := time.Since(started); took > 25*time.Second {
		t.Errorf("the job took %v to fail: the ranks waited for rank 2 instead of hearing of its failure", took)
	}
	errLog, _ := os.ReadFile(filepath.Join(s.RunDir, "slurm-"+s.JobID+".err"))
	t.Logf("job %s failed %v after it started:\n%s", s.JobID, time.Since(started).Round(100*time.Millisecond), errLog)
	for _, r := range []int{0, 1, 3} {
		if !regexp.MustCompile(fmt.Sprintf(`rank %d: .*rank 2 \(n\d\): metrics: .*is a directory`, r)).Match(errLog) {
			t.Errorf("rank %d does not quote rank 2's error:\n%s", r, errLog)
		}
		l, err := metrics.ReadRank(rundir.Dir(s.RunDir).RankMetrics(r))
		if err != nil {
			t.Fatal(err)
		}
		if l.End == nil || l.End.Status != metrics.StatusFailed || !strings.Contains(l.End.Error, "is a directory") {
			t.Errorf("rank %d's end line %+v: want failed, quoting rank 2", r, l.End)
		}
	}
	if strings.Contains(string(errLog), "timed out") || strings.Contains(string(errLog), "stalled") {
		t.Errorf("a rank reports a timeout or a stall:\n%s", errLog)
	}
	if row, ok := e.row(true, s.ExecID); !ok || row.State != "FAILED" {
		t.Errorf("queue --all: %+v, want the run FAILED", row)
	}
}
