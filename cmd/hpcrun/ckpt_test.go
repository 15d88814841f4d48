package main

import (
	"bytes"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/hpcrun/hpcrun/train/ckpt"
)

// TestCkptCLI: a local run leaves checkpoints; ckpt info (text and --json)
// describes them, ckpt merge writes a GPT-2-named file and refuses to
// overwrite one, and a truncated shard is refused naming the file.
func TestCkptCLI(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the hpcrun binary: -short")
	}
	e := newEnv(t)
	text := filepath.Join(e.dir, "text.txt")
	os.WriteFile(text, []byte(strings.Repeat("the quick brown fox jumps over the lazy dog. ", 400)), 0o644)
	e.mustRun("run", "--nproc", "2", "--tp", "2", "--model", "gpt", "--data", text, "--layers", "2", "--dim", "32",
		"--heads", "4", "--seq", "16", "--bsz", "4", "--steps", "4", "--device", "cpu")
	runs, _ := filepath.Glob(filepath.Join(e.dir, "runs", "*"))
	if len(runs) != 1 {
		t.Fatalf("runs %v", runs)
	}
	execID := filepath.Base(runs[0])

	out := e.mustRun("ckpt", "info", execID)
	for _, want := range []string{"step 4", "model gpt", "tp 2 x dp 1", "h.0.attn.c_attn.weight", "dim 0 over tp 2 (3 blocks)"} {
		if !strings.Contains(out, want) {
			t.Errorf("ckpt info lacks %q:\n%s", want, out)
		}
	}
	var info struct {
		Step    int              `json:"step"`
		Vocab   int              `json:"vocab"`
		Mesh    struct{ TP int } `json:"mesh"`
		Tensors []struct {
			Name  string `json:"name"`
			Shape []int  `json:"shape"`
		} `json:"tensors"`
	}
	if err := json.Unmarshal([]byte(e.mustRun("--json", "ckpt", "info", runs[0])), &info); err != nil {
		t.Fatal(err)
	}
	if info.Step != 4 || info.Mesh.TP != 2 || len(info.Tensors) != 2+12*2+2 {
		t.Errorf("ckpt info --json: %+v", info)
	}

	merged := filepath.Join(e.dir, "model.safetensors")
	e.mustRun("ckpt", "merge", execID, "-o", merged)
	b, err := os.ReadFile(merged)
	if err != nil {
		t.Fatal(err)
	}
	n := int(b[0]) | int(b[1])<<8 | int(b[2])<<16
	var hdr map[string]struct {
		Shape []int `json:"shape"`
	}
	if err := json.Unmarshal(b[8:8+n], &hdr); err != nil {
		t.Fatal(err)
	}
	if s := hdr["h.1.mlp.c_fc.weight"].Shape; len(s) != 2 || s[0] != 32 || s[1] != 128 {
		t.Errorf("merged h.1.mlp.c_fc.weight is %v, want Conv1D's [32 128]", s)
	}
	if s := hdr["wte.weight"].Shape; len(s) != 2 || s[0] != info.Vocab || s[1] != 32 {
		t.Errorf("merged wte.weight is %v, want the unpadded vocabulary x 32", s)
	}
	if _, errOut, code := e.run("ckpt", "merge", execID, "-o", merged); code == 0 || !strings.Contains(errOut, "exists") {
		t.Errorf("merge over an existing file: exit %d, %q", code, errOut)
	}

	shard := filepath.Join(runs[0], "ckpt", "step-000004", "model-tp1-of-2.safetensors")
	st, _ := os.Stat(shard)
	os.Truncate(shard, st.Size()-4)
	_, errOut, code := e.run("ckpt", "merge", execID, "-o", merged, "--force")
	if code == 0 || !strings.Contains(errOut, shard) || !strings.Contains(errOut, "truncated") {
		t.Errorf("merge of a truncated shard: exit %d, %q", code, errOut)
	}
	if b2, _ := os.ReadFile(merged); len(b2) != len(b) {
		t.Errorf("a refused merge changed %s", merged)
	}
}

// TestSubmitResume submits a run with the Local executor, moves its latest
// checkpoint back to step 10 of 20, and resubmits it with --resume: the job
// starts again in the same run dir from step 10, and its steps 11..20 give
// the same losses as the first time.
func TestSubmitResume(t *testing.T) {
	if testing.Short() {
		t.Skip("e2e: -short")
	}
	e := newEnv(t)
	os.WriteFile(filepath.Join(e.dir, "hpcrun.toml"), []byte("[train]\nckpt_every = 5\nckpt_keep = 3\n"), 0o644)
	args := []string{"--executor", "local", "--ntasks", "2", "--tp", "1", "--preset", "tiny", "--steps", "20", "--samples", "256", "--device", "cpu"}
	out, errOut, code := e.run(append([]string{"submit", "--wait"}, args...)...)
	if code != 0 {
		t.Fatalf("submit: exit %d\n%s%s", code, out, errOut)
	}
	runs, _ := filepath.Glob(filepath.Join(e.dir, "runs", "*"))
	dir := runs[0]
	first, _, _ := stepLosses(t, filepath.Join(dir, "metrics", "rank-00001.jsonl"))
	os.WriteFile(filepath.Join(dir, "ckpt", "latest"), []byte("step-000010\n"), 0o644)

	if _, errOut, code := e.run("submit", "--resume", filepath.Base(dir), "--steps", "30"); code != 2 || !strings.Contains(errOut, "--steps") {
		t.Errorf("--resume with a training flag: exit %d, %q", code, errOut)
	}
	out = e.mustRun("submit", "--resume", filepath.Base(dir), "--wait")
	if !strings.Contains(out, "resumes from step 10") {
		t.Errorf("submit --resume said %q", out)
	}
	again, starts, ends := stepLosses(t, filepath.Join(dir, "metrics", "rank-00001.jsonl"))
	if starts != 2 || len(ends) != 2 || ends[1] != "completed" {
		t.Fatalf("%d starts, ends %v", starts, ends)
	}
	for step := 11; step <= 20; step++ {
		if math.Float64bits(again[step]) != math.Float64bits(first[step]) {
			t.Errorf("step %d: %v resumed, %v the first time", step, again[step], first[step])
		}
	}
}

// tinyCkpt writes a checkpoint of one replicated tensor at tp 1 under
// run/ckpt/step-000004 (with ckpt/latest naming it) and returns the run
// dir and the step dir.
func tinyCkpt(t *testing.T, root string) (string, string) {
	t.Helper()
	run := filepath.Join(root, "run")
	step := filepath.Join(run, "ckpt", ckpt.StepDir(4))
	if err := os.MkdirAll(step, 0o755); err != nil {
		t.Fatal(err)
	}
	state := `{"format":1,"step":4,"epoch":0,"sampler_pos":0,"rng":{"kind":"pcg(seed, epoch)","seed":1},
		"model":"bert","vocab":10,"config":{"model":"bert"},"mesh":{"tp":1,"dp":1,"world":1},
		"tensors":[{"name":"ln","full":[4],"split":false,"dim":0}],"saved":"2026-01-02T03:04:05Z"}`
	if err := os.WriteFile(filepath.Join(step, ckpt.StateFile), []byte(state), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := ckpt.WriteModel(step, 0, 1, 4, []ckpt.Tensor{{Name: "ln", Shape: []int{4}, Data: []float32{1, 2, 3, 4}}}); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(run, "ckpt", ckpt.LatestFile), []byte(ckpt.StepDir(4)+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	return run, step
}

// TestCkptMergeRefusesOutputInsideCheckpoint: merge -o a file of the
// checkpoint being merged, with --force, replaced that shard with the
// merged file (the checkpoint was gone); now it is refused naming both,
// however the path reaches the step dir (relative, through .., through a
// symlinked dir, the step dir itself), and the files stay as they were. A
// file beside the checkpoint, or a symlink outside pointing into it (the
// merge replaces the link, not its target), is written.
func TestCkptMergeRefusesOutputInsideCheckpoint(t *testing.T) {
	root := t.TempDir()
	run, step := tinyCkpt(t, root)
	shard := filepath.Join(step, ckpt.ModelFile(0, 1))
	before, err := os.ReadFile(shard)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(step, filepath.Join(root, "link")); err != nil {
		t.Fatal(err)
	}
	t.Chdir(run)
	realStep, _ := filepath.EvalSymlinks(step)
	for _, tc := range []struct{ arg, out string }{
		{run, shard},
		{step, filepath.Join(step, ckpt.StateFile)},
		{step, filepath.Join("ckpt", ckpt.StepDir(4), ckpt.ModelFile(0, 1))},
		{run, filepath.Join(step, "..", ckpt.StepDir(4), "merged.safetensors")},
		{run, filepath.Join(root, "link", "merged.safetensors")},
		{run, filepath.Join(root, "link", ckpt.ModelFile(0, 1))},
		{run, step},
	} {
		_, err := runApp(t, "ckpt", "merge", tc.arg, "-o", tc.out, "--force")
		if err == nil || !strings.Contains(err.Error(), "-o "+tc.out) || !strings.Contains(err.Error(), "inside the checkpoint being merged, "+realStep) {
			t.Errorf("merge %s -o %s: %v; want refused naming both", tc.arg, tc.out, err)
		}
	}
	if after, _ := os.ReadFile(shard); !bytes.Equal(after, before) {
		t.Fatalf("a refused merge changed %s", shard)
	}
	if names, _ := os.ReadDir(step); len(names) != 2 {
		t.Errorf("the step dir holds %d files after refused merges, want 2", len(names))
	}

	if _, err := runApp(t, "ckpt", "merge", run, "-o", "model.safetensors"); err != nil {
		t.Errorf("merge beside the checkpoint: %v", err)
	}
	outLink := filepath.Join(root, "out.safetensors")
	if err := os.Symlink(shard, outLink); err != nil {
		t.Fatal(err)
	}
	if _, err := runApp(t, "ckpt", "merge", run, "-o", outLink, "--force"); err != nil {
		t.Errorf("merge over a symlink into the checkpoint: %v", err)
	}
	if after, _ := os.ReadFile(shard); !bytes.Equal(after, before) {
		t.Errorf("merge over a symlink changed its target %s", shard)
	}
}

// ckpt merge --json says what it wrote (export's, in TestPretrainedWorkflow).
func TestCkptMergeExportJSON(t *testing.T) {
	root := t.TempDir()
	run, _ := tinyCkpt(t, root)
	out := filepath.Join(root, "m.safetensors")
	msg, err := runApp(t, "ckpt", "merge", "--json", run, "-o", out)
	var got struct {
		Step   int
		Output string
		Bytes  int64
	}
	if err != nil || json.Unmarshal([]byte(msg), &got) != nil || got.Output != out || got.Bytes == 0 || got.Step == 0 {
		t.Errorf("ckpt merge --json: %q, %v", msg, err)
	}
}
