package plan

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/hpcrun/hpcrun/nccl"
	"github.com/hpcrun/hpcrun/parallel"
	"github.com/hpcrun/hpcrun/tensor"
	"github.com/hpcrun/hpcrun/train"
	"github.com/hpcrun/hpcrun/train/ckpt"
	"github.com/hpcrun/hpcrun/train/spec"
)

// The edits TestSpecIsTheOnlyEdit makes to train/spec's source, and the
// names they add: a row-parallel weight in every GPT block, and a buffer of
// the model's own; and the one line of the model that takes the buffer
// (parallel.Allocate refuses a buffer no code uses: the drift of a size
// table that lists a buffer the model dropped).
const (
	specEditAnchor  = `	b.bias(p+".mlp.c_proj.bias", []int{C}, replicated)` + "\n"
	specEditParam   = `	b.weight(p+".attn.gate.weight", []int{C, C}, row, proj, 0, false)` + "\n"
	specAddedParam  = ".attn.gate.weight"
	bufferAnchor    = `	stream = parallel.Buffers{{Name: "dx", Shape: []int{B, Tl, C}, DType: res}}` + "\n"
	bufferEdit      = `	stream = append(stream, parallel.Buffer{Name: "spec_edit", Shape: []int{B, Tl, 3}})` + "\n"
	specAddedBuffer = "spec_edit"
	bufferUseAnchor = `		t.h1g, t.dh1g, t.dh1 = get("h1g"), get("dh1g"), get("dh1")` + "\n"
	bufferUse       = `		_ = get("spec_edit")` + "\n"
	specEditEnv     = "HPCRUN_SPEC_EDIT"
)

// TestSpecIsTheOnlyEdit adds a parameter to the model's spec (train/spec's
// source, and nothing else: go test -overlay), and a buffer (in the spec,
// and the line of the model that uses it), and runs TestAddedToSpecAgrees
// on the result, which checks that the model, the plan, the parameter
// count, the gradient buckets and the checkpoint all take them in.
func TestSpecIsTheOnlyEdit(t *testing.T) {
	if os.Getenv(specEditEnv) != "" {
		t.Skip("the child process")
	}
	if testing.Short() {
		t.Skip("builds the package again")
	}
	tmp := t.TempDir()
	replace := map[string]string{}
	for _, e := range []struct{ file, anchor, add string }{
		{"spec/spec.go", specEditAnchor, specEditParam},
		{"spec/buffers.go", bufferAnchor, bufferEdit},
		{"model.go", bufferUseAnchor, bufferUse},
	} {
		path, err := filepath.Abs(filepath.Join("..", e.file))
		if err != nil {
			t.Fatal(err)
		}
		src, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		if n := strings.Count(string(src), e.anchor); n != 1 {
			t.Fatalf("train/%s holds the line the test edits after %d times, want once: %q", e.file, n, e.anchor)
		}
		edited := filepath.Join(tmp, filepath.Base(e.file))
		if err := os.WriteFile(edited, []byte(strings.Replace(string(src), e.anchor, e.anchor+e.add, 1)), 0o644); err != nil {
			t.Fatal(err)
		}
		replace[path] = edited
	}
	js, _ := json.Marshal(map[string]map[string]string{"Replace": replace})
	overlay := filepath.Join(tmp, "overlay.json")
	if err := os.WriteFile(overlay, js, 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(filepath.Join(runtime.GOROOT(), "bin", "go"), "test", "-count=1", "-overlay", overlay, "-run", "^TestAddedToSpecAgrees$", "-v", ".")
	cmd.Env = append(os.Environ(), specEditEnv+"=1")
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "--- PASS: TestAddedToSpecAgrees") {
		t.Fatalf("with a parameter and a buffer added to train/spec: %v\n%s", err, out)
	}
}

// TestAddedToSpecAgrees runs under TestSpecIsTheOnlyEdit, on a spec with
// an added parameter in every GPT block and an added model buffer: a
// tiny GPT at tp 2 x dp 2 trains a step and saves a checkpoint, and then
// the plan's engine peak equals every rank's to the byte, the plan's
// gradient buckets are the engine's all-reduces, the checkpoint names
// exactly the spec's parameters (the added ones with their full shape),
// and the parameter count is the checkpoint's; at pp 2 the plan's peak is
// still the engine's.
func TestAddedToSpecAgrees(t *testing.T) {
	if os.Getenv(specEditEnv) == "" {
		t.Skip("runs under TestSpecIsTheOnlyEdit, on an edited spec")
	}
	const vocab = 1000
	cfg := commLayout{tp: 2, dp: 2, accum: 1}.tinyConfig(t, "gpt")
	cfg.Steps, cfg.EvalEvery, cfg.EvalSamples = 1, 0, 2
	ps, err := spec.Params(cfg, vocab, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	added := 0
	for _, p := range ps {
		if strings.HasSuffix(p.Name, specAddedParam) {
			added++
		}
	}
	if added != cfg.Layers {
		t.Fatalf("the spec lists %d parameters named *%s, want one a block (%d): not the edited spec", added, specAddedParam, cfg.Layers)
	}
	stream, _ := spec.ModelBuffers(cfg, true)
	if !slices.ContainsFunc(stream, func(b parallel.Buffer) bool { return b.Name == specAddedBuffer }) {
		t.Fatalf("the spec's model buffers have no %s: not the edited spec", specAddedBuffer)
	}

	vp, err := parallel.PadVocab(vocab, cfg.TP)
	if err != nil {
		t.Fatal(err)
	}
	sh, err := newShapes(cfg, vp, 0, cfg.Layers, cfg.NTasks, false)
	if err != nil {
		t.Fatal(err)
	}
	var wantBuckets []int
	for _, b := range sh.buckets {
		wantBuckets = append(wantBuckets, int(b.Elems))
	}
	pl, err := New(Request{Config: cfg, Vocab: vocab, Device: CPU(0, 0, 0, "")})
	if err != nil {
		t.Fatal(err)
	}

	dir := t.TempDir()
	data := randomData(cfg, vocab, cfg.BatchSize*cfg.DP())
	var mu sync.Mutex
	calls, made := map[int][]int{}, 0
	peaks := make([]int64, cfg.NTasks)
	err = nccl.RunInProcess(cfg.NTasks, func(w nccl.Comm) error {
		dev := tensor.NewCPU()
		_, err := train.Run(context.Background(), cfg, reduceSpy{w, &mu, 0, calls, &made}, train.Options{Device: dev, Data: data, RunDir: dir})
		peaks[w.Rank()] = dev.MemStats().Peak
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	for r, p := range peaks {
		if p != pl.Memory.EnginePeak {
			t.Errorf("rank %d: engine peak %d B, the plan's %d B", r, p, pl.Memory.EnginePeak)
		}
	}
	got := calls[2]
	if loss := slices.Index(got, 1); loss >= 0 {
		got = got[:loss]
	}
	if !slices.Equal(got, wantBuckets) {
		t.Errorf("the engine's data-parallel all-reduces %v, the plan's buckets %v", got, wantBuckets)
	}

	latest, err := ckpt.Latest(filepath.Join(dir, "ckpt"))
	if err != nil {
		t.Fatal(err)
	}
	c, err := ckpt.Open(latest, false)
	if err != nil {
		t.Fatal(err)
	}
	var saved []string
	var count int64
	for _, ti := range c.State.Tensors {
		saved = append(saved, ti.Name)
		n := int64(1)
		for _, d := range ti.Full {
			n *= int64(d)
		}
		count += n
		if strings.HasSuffix(ti.Name, specAddedParam) && !slices.Equal(ti.Full, []int{cfg.Dim, cfg.Dim}) {
			t.Errorf("checkpoint: %s is %v, want (%d,%d)", ti.Name, ti.Full, cfg.Dim, cfg.Dim)
		}
	}
	var names []string
	for _, p := range ps {
		names = append(names, p.Name)
	}
	if !slices.Equal(saved, names) {
		t.Errorf("the checkpoint holds %v, the spec lists %v", saved, names)
	}
	if n := spec.ParamCount(cfg, vocab); n != count {
		t.Errorf("parameter count %d, the checkpoint's %d", n, count)
	}

	pp := pipelineConfig(t, "gpt", 2, 1, 1, 2)
	ppPlan, err := New(Request{Config: pp, Vocab: vocab, Device: CPU(0, 0, 0, "")})
	if err != nil {
		t.Fatal(err)
	}
	for r, p := range measureRanks(t, pp, vocab) {
		if want := ppPlan.Stages[r].Memory.EnginePeak; p != want {
			t.Errorf("pp 2, stage %d: engine peak %d B, the plan's %d B", r, p, want)
		}
	}
}
