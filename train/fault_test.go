package train

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/hpcrun/hpcrun/internal/rundir"
	"github.com/hpcrun/hpcrun/nccl"
	"github.com/hpcrun/hpcrun/train/ckpt"
	"github.com/hpcrun/hpcrun/train/config"
	"github.com/hpcrun/hpcrun/train/data"
	"github.com/hpcrun/hpcrun/train/metrics"
)

// fullDiskChild, set to "DIR:BYTES", makes the test binary one rank that
// trains into run dir DIR on a disk where no file may grow past BYTES
// (RLIMIT_FSIZE): its first checkpoint does not fit.
const fullDiskChild = "HPCRUN_TEST_TRAIN_FSIZE"

func TestMain(m *testing.M) {
	if v := os.Getenv(fullDiskChild); v != "" {
		dir, limit, _ := strings.Cut(v, ":")
		n, _ := strconv.ParseUint(limit, 10, 64)
		cfg := smallConfig("bert")
		cfg.Steps, cfg.CkptEvery = 4, 2
		ds, err := data.Prepare(cfg)
		if err == nil {
			err = syscall.Setrlimit(syscall.RLIMIT_FSIZE, &syscall.Rlimit{Cur: n, Max: n})
		}
		if err == nil {
			err = nccl.RunInProcess(1, func(c nccl.Comm) error {
				_, err := Run(context.Background(), cfg, c, Options{RunDir: dir, Data: ds})
				return err
			})
		}
		fmt.Println("train:", err)
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// A checkpoint that does not fit on the disk fails the run and leaves no
// .tmp-step-* behind to hold the space: nothing was published, and the
// partial files are gone.
func TestFullDiskCheckpointRemovesItsTempDir(t *testing.T) {
	dir := t.TempDir()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), fullDiskChild+"="+dir+":40000")
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "file too large") {
		t.Fatalf("the rank on a full disk: %v: %s", err, out)
	}
	tmps, _ := filepath.Glob(filepath.Join(rundir.Dir(dir).Ckpt(), ".tmp-step-*"))
	if len(tmps) > 0 {
		t.Fatalf("the aborted checkpoint left %v", tmps)
	}
}

// panicWriter panics on its first write: a bug anywhere in the step.
type panicWriter struct{}

func (panicWriter) Write([]byte) (int, error) { panic("boom in the step") }

// A rank that panics records the panic as its failure, not as a completed
// run, and the panic goes on (its stack is what a reader needs).
func TestPanicIsRecordedAsFailure(t *testing.T) {
	dir := t.TempDir()
	cfg := smallConfig("bert")
	cfg.Steps = 2
	ds, err := data.Prepare(cfg)
	if err != nil {
		t.Fatal(err)
	}
	var p any
	func() {
		defer func() { p = recover() }()
		Run(context.Background(), cfg, nccl.NewInProcess(1)[0], Options{RunDir: dir, Data: ds, Log: panicWriter{}})
	}()
	if p != "boom in the step" {
		t.Fatalf("recovered %v, want the panic to go on", p)
	}
	l, err := metrics.ReadRank(metrics.RankFile(dir, 0))
	if err != nil {
		t.Fatal(err)
	}
	if l.End == nil || l.End.Status != metrics.StatusFailed || !strings.Contains(l.End.Error, "panic: boom in the step") {
		t.Fatalf("end line %+v, want failed with the panic", l.End)
	}
}

// A token file truncated while a run reads it (rewritten in place) stops
// the run with an error naming the file, not SIGBUS and a stack trace.
func TestTokenFileTruncatedWhileTraining(t *testing.T) {
	path := filepath.Join(t.TempDir(), "tokens.bin")
	ids := make([]int, 20000)
	for i := range ids {
		ids[i] = i % 200
	}
	if err := data.WriteTokenFile(path, ids, 256); err != nil {
		t.Fatal(err)
	}
	cfg := smallConfig("gpt")
	cfg.Data, cfg.Tokenizer, cfg.Steps = path, "byte", 3
	ds, err := data.Prepare(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(path, 1024); err != nil { // the header alone
		t.Fatal(err)
	}
	_, err = Run(context.Background(), cfg, nccl.NewInProcess(1)[0], Options{RunDir: t.TempDir(), Data: ds})
	if err == nil || !strings.Contains(err.Error(), "data "+path+": the file shrank while training (now 1024 bytes") {
		t.Fatalf("Run on a truncated token file: %v, want an error naming it", err)
	}
}

// A config value that is not a finite number is refused naming its key,
// not later by the JSON encoder ("json: unsupported value: +Inf").
func TestConfigRefusesNonFiniteValues(t *testing.T) {
	for _, tc := range []struct {
		set  func(*config.Config)
		want string
	}{
		{func(c *config.Config) { c.LR = math.Inf(1) }, "lr = +Inf: must be a finite number"},
		{func(c *config.Config) { c.MinLR = math.NaN() }, "min_lr = NaN: must be a finite number"},
		{func(c *config.Config) { c.AdamBeta2 = math.NaN() }, "adam_beta2 = NaN: must be a finite number"},
		{func(c *config.Config) { c.GradClip = math.Inf(1) }, "grad_clip = +Inf: must be a finite number"},
		{func(c *config.Config) { c.WeightDecay = math.NaN() }, "weight_decay = NaN: must be a finite number"},
	} {
		cfg := smallConfig("gpt")
		tc.set(&cfg)
		if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Validate: %v, want %q", err, tc.want)
		}
	}
}

// Weights that are NaN in a checkpoint are named when it is loaded, not
// found as "loss is NaN: lower --lr" a step later.
func TestResumeNamesNaNWeights(t *testing.T) {
	cfg := smallConfig("bert")
	cfg.Steps = 2
	ds, err := data.Prepare(cfg)
	if err != nil {
		t.Fatal(err)
	}
	step := poisonedCheckpoint(t, cfg, ds, float32(math.NaN()))
	cfg.Steps = 4
	_, err = Run(context.Background(), cfg, nccl.NewInProcess(1)[0], Options{RunDir: t.TempDir(), Data: ds, Resume: step})
	if err == nil || !strings.Contains(err.Error(), "checkpoint "+step+": the weights of ") || !strings.Contains(err.Error(), "hold NaN") {
		t.Fatalf("resume from NaN weights: %v, want the checkpoint and tensor named", err)
	}
}

// generate and eval name NaN weights of the checkpoint they load too.
func TestGenerateNamesNaNWeights(t *testing.T) {
	cfg, ds := gptConfig(t, 1, 1)
	cfg.Steps, cfg.EvalEvery = 2, 0
	step := poisonedCheckpoint(t, cfg, ds, float32(math.Inf(1)))
	_, err := Generate(context.Background(), nccl.NewInProcess(1)[0], GenerateOptions{Source: step, Prompt: "alpha", Tokens: 2})
	if err == nil || !strings.Contains(err.Error(), "checkpoint "+step+": the weights of ") || !strings.Contains(err.Error(), "hold +Inf") {
		t.Fatalf("generate from a checkpoint with +Inf weights: %v, want the checkpoint and tensor named", err)
	}
}

// poisonedCheckpoint trains cfg (2 steps, a checkpoint at step 2) on one
// rank and sets the last weight of its model file to v; it returns the
// checkpoint's step dir.
func poisonedCheckpoint(t *testing.T, cfg config.Config, ds *data.Data, v float32) string {
	t.Helper()
	dir := t.TempDir()
	if _, err := Run(context.Background(), cfg, nccl.NewInProcess(1)[0], Options{RunDir: dir, Data: ds}); err != nil {
		t.Fatal(err)
	}
	step := filepath.Join(rundir.Dir(dir).Ckpt(), "step-000002")
	files, _ := filepath.Glob(filepath.Join(step, "model*.safetensors"))
	if len(files) != 1 {
		t.Fatalf("model files %v", files)
	}
	b, err := os.ReadFile(files[0])
	if err != nil {
		t.Fatal(err)
	}
	binary.LittleEndian.PutUint32(b[len(b)-4:], math.Float32bits(v))
	if err := os.WriteFile(files[0], b, 0o644); err != nil {
		t.Fatal(err)
	}
	return step
}

// bertCheckpoint trains a small BERT 2 steps and returns its config, data
// and the step dir of its checkpoint.
func bertCheckpoint(t *testing.T) (config.Config, *data.Data, string) {
	t.Helper()
	cfg := smallConfig("bert")
	cfg.Steps = 2
	ds, err := data.Prepare(cfg)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if _, err := Run(context.Background(), cfg, nccl.NewInProcess(1)[0], Options{RunDir: dir, Data: ds}); err != nil {
		t.Fatal(err)
	}
	return cfg, ds, filepath.Join(rundir.Dir(dir).Ckpt(), "step-000002")
}

// A state.json edited out of range is refused naming the field, before any
// weight is loaded: sampler_pos -7 panicked in nextBatch, and epoch -1 or
// 10^9 and a saved dp of 5e8 were taken.
func TestResumeRefusesBadState(t *testing.T) {
	cfg, ds, step := bertCheckpoint(t)
	path := filepath.Join(step, ckpt.StateFile)
	orig, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	n := ds.Train.Len()
	for _, tc := range []struct {
		set  func(st map[string]any)
		want string
	}{
		{func(st map[string]any) { st["sampler_pos"] = -7 }, "sampler_pos -7: must be 0 or more"},
		{func(st map[string]any) { st["epoch"] = -1 }, "epoch -1 at step 2"},
		{func(st map[string]any) { st["epoch"] = 1e9 }, "epoch 1000000000 at step 2"},
		{func(st map[string]any) { st["mesh"].(map[string]any)["dp"] = 5e8 }, "mesh.world 1 is not mesh.tp 1 x mesh.dp 500000000"},
		{func(st map[string]any) {
			st["mesh"].(map[string]any)["dp"], st["mesh"].(map[string]any)["world"] = 5e8, 5e8
		}, fmt.Sprintf("mesh.dp 500000000: more data-parallel ranks than this run's %d training samples", n)},
		{func(st map[string]any) { st["sampler_pos"] = n + 1 }, fmt.Sprintf("sampler_pos %d: past the %d samples", n+1, n)},
		{func(st map[string]any) { st["tensors"].([]any)[0].(map[string]any)["full"] = []int{-1} }, "tensors[0].full [-1]"},
	} {
		var st map[string]any
		if err := json.Unmarshal(orig, &st); err != nil {
			t.Fatal(err)
		}
		tc.set(st)
		b, _ := json.Marshal(st)
		if err := os.WriteFile(path, b, 0o644); err != nil {
			t.Fatal(err)
		}
		c := cfg
		c.Steps = 4
		_, err = Run(context.Background(), c, nccl.NewInProcess(1)[0], Options{RunDir: t.TempDir(), Data: ds, Resume: step})
		if err == nil || !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("resume from a state with %s: %v", tc.want, err)
		}
	}
}

// A second moment below zero (AdamW's v is a mean of squares) is refused
// when the checkpoint is loaded, naming the tensor: it resumed, and the
// step's sqrt(v) then failed as "loss is NaN: lower --lr".
func TestResumeRefusesNegativeSecondMoment(t *testing.T) {
	cfg, ds, step := bertCheckpoint(t)
	path := filepath.Join(step, ckpt.OptimFile(0, 0))
	h, err := ckpt.ReadHeader(path)
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var name string
	for _, e := range h.Tensors {
		if strings.HasPrefix(e.Name, "v.") {
			name = strings.TrimPrefix(e.Name, "v.")
			at := 8 + int64(binary.LittleEndian.Uint64(b)) + e.Begin + 4
			binary.LittleEndian.PutUint32(b[at:], math.Float32bits(-0.5))
			break
		}
	}
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
	cfg.Steps = 4
	_, err = Run(context.Background(), cfg, nccl.NewInProcess(1)[0], Options{RunDir: t.TempDir(), Data: ds, Resume: step})
	if err == nil || !strings.Contains(err.Error(), "checkpoint "+step+": the second moment (v) of "+name+" holds -0.5 at element 1 of this rank's shard: AdamW's v is never negative") {
		t.Fatalf("resume from a negative second moment: %v, want the checkpoint and tensor named", err)
	}
}
