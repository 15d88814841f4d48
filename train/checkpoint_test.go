package train

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/hpcrun/hpcrun/internal/rundir"
	"github.com/hpcrun/hpcrun/nccl"
	"github.com/hpcrun/hpcrun/train/ckpt"
	"github.com/hpcrun/hpcrun/train/config"
	"github.com/hpcrun/hpcrun/train/data"
)

// runRanks trains cfg on in-process ranks with per-rank options and returns
// every rank's result and the joined error.
func runRanks(t *testing.T, cfg config.Config, ds *data.Data, opt func(rank int) Options) ([]*Result, error) {
	t.Helper()
	res := make([]*Result, cfg.NTasks)
	var mu sync.Mutex
	err := nccl.RunInProcess(cfg.NTasks, func(c nccl.Comm) error {
		o := opt(c.Rank())
		o.Data = ds
		r, err := Run(context.Background(), cfg, c, o)
		mu.Lock()
		res[c.Rank()] = r
		mu.Unlock()
		return err
	})
	return res, err
}

func gptConfig(t *testing.T, ntasks, tp int) (config.Config, *data.Data) {
	cfg := smallConfig("gpt")
	cfg.Data = textFile(t)
	cfg.NTasks, cfg.TP = ntasks, tp
	cfg.Steps, cfg.EvalEvery = 12, 4
	ds, err := data.Prepare(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return cfg, ds
}

// TestResumeBitIdentical trains 12 steps with a checkpoint every 5, then
// resumes a fresh run from step 5: its losses for steps 6..12 must equal
// the uninterrupted run's bit for bit (tp=2 x dp=2, so the shards, the
// optimizer state and the sampler position of every rank matter); at
// fp32, and at bf16, whose bfloat16 weight copies come back from the
// checkpoint's fp32 masters; and at bf16 under ZeRO-3 (dp 4), whose
// blocks' shared copy is filled as each block is gathered.
func TestResumeBitIdentical(t *testing.T) {
	for _, c := range []struct {
		precision string
		tp, zero  int
	}{{"fp32", 2, 0}, {"bf16", 2, 0}, {"bf16", 1, 3}} {
		t.Run(fmt.Sprintf("%s tp%d zero%d", c.precision, c.tp, c.zero), func(t *testing.T) {
			cfg, ds := gptConfig(t, 4, c.tp)
			cfg.Precision, cfg.Zero = c.precision, c.zero
			resumeBitIdentical(t, cfg, ds)
		})
	}
}

// resumeBitIdentical is TestResumeBitIdentical at cfg.
func resumeBitIdentical(t *testing.T, cfg config.Config, ds *data.Data) {
	cfg.CkptEvery = 5
	full := t.TempDir()
	res, err := runRanks(t, cfg, ds, func(int) Options { return Options{RunDir: full} })
	if err != nil {
		t.Fatal(err)
	}
	steps, _ := ckpt.List(rundir.Dir(full).Ckpt())
	if want := []string{"step-000005", "step-000010", "step-000012"}; strings.Join(steps, ",") != strings.Join(want, ",") {
		t.Fatalf("checkpoints %v, want %v", steps, want)
	}
	from := filepath.Join(rundir.Dir(full).Ckpt(), "step-000005")
	again := t.TempDir()
	resumed, err := runRanks(t, cfg, ds, func(int) Options { return Options{RunDir: again, Resume: from} })
	if err != nil {
		t.Fatal(err)
	}
	for r := range res {
		got, want := resumed[r].Losses, res[r].Losses[5:]
		if resumed[r].Start != 5 || len(got) != len(want) {
			t.Fatalf("rank %d: resumed at %d with %d losses, want 5 and %d", r, resumed[r].Start, len(got), len(want))
		}
		for i := range got {
			if math.Float64bits(got[i]) != math.Float64bits(want[i]) {
				t.Errorf("rank %d step %d: resumed loss %v, uninterrupted %v", r, 6+i, got[i], want[i])
			}
		}
	}
}

// TestStopSaveResume asks one rank (of four) to stop: all stop after the
// same step with ErrStopped and a checkpoint of it; running again in the
// same run dir resumes there and the whole loss curve equals an
// uninterrupted run's.
func TestStopSaveResume(t *testing.T) {
	cfg, ds := gptConfig(t, 4, 2)
	cfg.Steps = 8
	ref, err := runRanks(t, cfg, ds, func(int) Options { return Options{} })
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	stop := make(chan struct{})
	close(stop)
	res, err := runRanks(t, cfg, ds, func(rank int) Options {
		if rank == 3 {
			return Options{RunDir: dir, Stop: stop}
		}
		return Options{RunDir: dir, Stop: make(chan struct{})}
	})
	if !errors.Is(err, ErrStopped) {
		t.Fatalf("err = %v, want ErrStopped", err)
	}
	for r, x := range res {
		if x.Steps != 1 {
			t.Fatalf("rank %d made %d steps before stopping, want 1", r, x.Steps)
		}
	}
	latest, err := ckpt.Latest(rundir.Dir(dir).Ckpt())
	if err != nil || filepath.Base(latest) != "step-000001" {
		t.Fatalf("latest = %q, %v; want step-000001", latest, err)
	}
	res2, err := runRanks(t, cfg, ds, func(int) Options { return Options{RunDir: dir} })
	if err != nil {
		t.Fatal(err)
	}
	got := append(res[0].Losses, res2[0].Losses...)
	for i := range ref[0].Losses {
		if i >= len(got) || math.Float64bits(got[i]) != math.Float64bits(ref[0].Losses[i]) {
			t.Fatalf("losses after stop and resume %v, uninterrupted %v", got, ref[0].Losses)
		}
	}
}

// forwardLoss builds cfg's model on in-process ranks, loads the checkpoint
// from, and returns the forward loss of the first validation batch.
func forwardLoss(t *testing.T, cfg config.Config, ds *data.Data, from string) float64 {
	t.Helper()
	losses := make([]float64, cfg.NTasks)
	err := nccl.RunInProcess(cfg.NTasks, func(c nccl.Comm) error {
		tr, err := newTrainer(cfg, c, Options{Data: ds}, nil)
		if err != nil {
			return err
		}
		defer tr.close()
		if err := tr.resume(from); err != nil {
			return err
		}
		idx := make([]int, cfg.BatchSize)
		for i := range idx {
			idx[i] = i
		}
		var b data.Batch
		ds.Val.Gather(&b, idx)
		losses[c.Rank()], err = tr.model.Forward(&b, false)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return losses[0]
}

// TestReshardOnLoad saves a trained model at tp=2 and loads it at tp=1,
// tp=2 and tp=4 (vocabulary padded differently each time): the forward
// loss must agree to float32 tolerance.
func TestReshardOnLoad(t *testing.T) {
	cfg, ds := gptConfig(t, 2, 2)
	cfg.Steps = 4
	dir := t.TempDir()
	if _, err := runRanks(t, cfg, ds, func(int) Options { return Options{RunDir: dir} }); err != nil {
		t.Fatal(err)
	}
	from := filepath.Join(rundir.Dir(dir).Ckpt(), "step-000004")
	ref := forwardLoss(t, cfg, ds, from)
	for _, tp := range []int{1, 4} {
		c := cfg
		c.NTasks, c.TP = tp, tp
		got := forwardLoss(t, c, ds, from)
		if math.Abs(got-ref) > 1e-5*math.Abs(ref) {
			t.Errorf("tp=%d: loss %v, tp=2 gives %v", tp, got, ref)
		}
	}
	// resume_from starts a new run (here at tp=1) from the checkpoint.
	one := cfg
	one.NTasks, one.TP, one.ResumeFrom, one.Steps = 1, 1, dir, 6
	res, err := runRanks(t, one, ds, func(int) Options { return Options{RunDir: t.TempDir()} })
	if err != nil || res[0].Start != 4 || res[0].Steps != 2 {
		t.Errorf("resume_from: %v, started at %d and made %d steps, want 4 and 2", err, res[0].Start, res[0].Steps)
	}
	// A fresh model's loss differs: the load is not a no-op.
	fresh := cfg
	fresh.Seed++
	if l := forwardLossFresh(t, fresh, ds); math.Abs(l-ref) < 1e-4 {
		t.Errorf("an untrained model gives the trained loss %v", l)
	}
}

func forwardLossFresh(t *testing.T, cfg config.Config, ds *data.Data) float64 {
	t.Helper()
	var loss float64
	err := nccl.RunInProcess(cfg.NTasks, func(c nccl.Comm) error {
		tr, err := newTrainer(cfg, c, Options{Data: ds}, nil)
		if err != nil {
			return err
		}
		defer tr.close()
		idx := make([]int, cfg.BatchSize)
		for i := range idx {
			idx[i] = i
		}
		var b data.Batch
		ds.Val.Gather(&b, idx)
		l, err := tr.model.Forward(&b, false)
		if c.Rank() == 0 {
			loss = l
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return loss
}

// TestResumeRefusesMismatch: a checkpoint of another model shape, a
// truncated shard or a missing shard fails the run with an error naming
// the file, and leaves the checkpoint as it was.
func TestResumeRefusesMismatch(t *testing.T) {
	cfg, ds := gptConfig(t, 2, 2)
	cfg.Steps = 2
	dir := t.TempDir()
	if _, err := runRanks(t, cfg, ds, func(int) Options { return Options{RunDir: dir} }); err != nil {
		t.Fatal(err)
	}
	step := filepath.Join(rundir.Dir(dir).Ckpt(), "step-000002")
	other := cfg
	other.Dim, other.Heads = 64, 4
	otherData, _ := data.Prepare(other)
	_, err := runRanks(t, other, otherData, func(int) Options { return Options{Resume: step} })
	if err == nil || !strings.Contains(err.Error(), "dim 32, this run has dim 64") {
		t.Errorf("other dims: %v", err)
	}
	heads := cfg
	heads.Heads = 8
	_, err = runRanks(t, heads, ds, func(int) Options { return Options{Resume: step} })
	if err == nil || !strings.Contains(err.Error(), "heads 4") {
		t.Errorf("other heads: %v", err)
	}

	shard := filepath.Join(step, ckpt.ModelFile(1, 2))
	st, _ := os.Stat(shard)
	if err := os.Truncate(shard, st.Size()-7); err != nil {
		t.Fatal(err)
	}
	_, err = runRanks(t, cfg, ds, func(int) Options { return Options{RunDir: dir} })
	if err == nil || !strings.Contains(err.Error(), shard) || !strings.Contains(err.Error(), "truncated") {
		t.Errorf("truncated shard: %v", err)
	}
	if st2, _ := os.Stat(shard); st2.Size() != st.Size()-7 {
		t.Errorf("the refused checkpoint was rewritten")
	}
	os.Remove(shard)
	_, err = runRanks(t, cfg, ds, func(int) Options { return Options{RunDir: dir} })
	if err == nil || !strings.Contains(err.Error(), shard) || !strings.Contains(err.Error(), "missing") {
		t.Errorf("missing shard: %v", err)
	}
}

// TestMergeHF merges a tp=2 GPT checkpoint into one file with Hugging Face
// GPT-2 names and layouts, and checks every tensor against the same
// checkpoint loaded into a tp=1 model: Conv1D weights transposed to (in,
// out) (c_attn (C, 3C) with Q, K, V side by side), the vocabulary unpadded.
func TestMergeHF(t *testing.T) {
	cfg, _ := gptConfig(t, 2, 2)
	cfg.Steps = 2
	cfg.Vocab = 300 // padded to 512 at tp=2
	ds, err := data.Prepare(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if ds.Vocab != 300 {
		t.Fatalf("vocab %d, want 300", ds.Vocab)
	}
	dir := t.TempDir()
	if _, err := runRanks(t, cfg, ds, func(int) Options { return Options{RunDir: dir} }); err != nil {
		t.Fatal(err)
	}
	step := filepath.Join(rundir.Dir(dir).Ckpt(), "step-000002")
	c, err := ckpt.Open(step, false)
	if err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(t.TempDir(), "model.safetensors")
	if err := c.WriteMerged(out); err != nil {
		t.Fatal(err)
	}
	f, err := ckpt.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	C, V := cfg.Dim, ds.Vocab
	shapes := map[string][]int{
		"wte.weight": {V, C}, "wpe.weight": {cfg.Seq, C}, "h.0.ln_1.weight": {C},
		"h.0.attn.c_attn.weight": {C, 3 * C}, "h.0.attn.c_attn.bias": {3 * C},
		"h.0.attn.c_proj.weight": {C, C}, "h.1.mlp.c_fc.weight": {C, 4 * C},
		"h.1.mlp.c_proj.weight": {4 * C, C}, "ln_f.bias": {C},
	}
	for name, want := range shapes {
		e, ok := f.Find(name)
		if !ok || !equalInts(e.Shape, want) {
			t.Errorf("%s: %v (found %v), want %v", name, e.Shape, ok, want)
		}
	}
	if len(f.Tensors) != 2+12*cfg.Layers+2 {
		t.Errorf("%d tensors, want %d", len(f.Tensors), 2+12*cfg.Layers+2)
	}
	// The tp=1 model after loading holds the full (out, in) tensors.
	one := cfg
	one.NTasks, one.TP = 1, 1
	err = nccl.RunInProcess(1, func(comm nccl.Comm) error {
		tr, err := newTrainer(one, comm, Options{Data: ds}, nil)
		if err != nil {
			return err
		}
		defer tr.close()
		if err := tr.resume(step); err != nil {
			return err
		}
		for _, p := range tr.model.Params() {
			got := hostTensor(tr.dev, p.Name, p.Data)
			hf, err := f.Tensor(p.Name)
			if err != nil {
				return err
			}
			want := hf.Data
			if strings.HasSuffix(p.Name, "c_attn.weight") || strings.HasSuffix(p.Name, "c_proj.weight") || strings.HasSuffix(p.Name, "c_fc.weight") {
				want = transposeHost(hf.Data, hf.Shape[0], hf.Shape[1])
			}
			if p.Name == "wte.weight" {
				got.Data = got.Data[:V*C]
			}
			if len(got.Data) != len(want) {
				t.Errorf("%s: %d values, merged %d", p.Name, len(got.Data), len(want))
				continue
			}
			for i := range want {
				if got.Data[i] != want[i] {
					t.Errorf("%s[%d] = %v, merged %v", p.Name, i, got.Data[i], want[i])
					break
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

func equalInts(a, b []int) bool {
	return len(a) == len(b) && (len(a) == 0 || fmt.Sprint(a) == fmt.Sprint(b))
}

func transposeHost(a []float32, rows, cols int) []float32 {
	out := make([]float32, len(a))
	for i := 0; i < rows; i++ {
		for j := 0; j < cols; j++ {
			out[j*rows+i] = a[i*cols+j]
		}
	}
	return out
}
