package main

import (
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
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
