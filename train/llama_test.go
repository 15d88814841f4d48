package train

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"testing"

	"github.com/hpcrun/hpcrun/internal/rundir"
	"github.com/hpcrun/hpcrun/nccl"
	"github.com/hpcrun/hpcrun/parallel"
	"github.com/hpcrun/hpcrun/tensor"
	"github.com/hpcrun/hpcrun/train/config"
	"github.com/hpcrun/hpcrun/train/data"
	"github.com/hpcrun/hpcrun/train/interop"
	"github.com/hpcrun/hpcrun/train/tokenizer"
)

// llamaConfig is a small Llama with grouped heads (4 query, 2 key/value)
// on the text of textFile.
func llamaConfig(t *testing.T) config.Config {
	cfg := smallConfig("llama")
	cfg.KVHeads, cfg.FFN, cfg.RopeTheta = 2, 48, 500
	cfg.Data, cfg.CkptEvery = textFile(t), -1
	return cfg
}

// TestLlamaLossCurves trains the Llama from the same seed on the same
// global batch at every layout the engine has: tp, dp, sequence
// parallelism, ZeRO-1, the pipeline, with and without recomputation, tied
// and untied: each curve equals tp1's within 1e-6 relative, and the
// recomputations and ZeRO-1 change no bit.
func TestLlamaLossCurves(t *testing.T) {
	for _, untied := range []bool{false, true} {
		base := llamaConfig(t)
		base.UntiedHead = untied
		base.Layers = 4
		layouts := []struct {
			name                            string
			ntasks, tp, pp, b, micro, accum int
			sp                              bool
			zero                            int
			recompute                       string
		}{
			{"tp1", 1, 1, 0, 16, 0, 1, false, 0, ""},
			{"tp2", 2, 2, 0, 16, 0, 1, false, 0, ""},
			{"tp2+sp", 2, 2, 0, 16, 0, 1, true, 0, ""},
			{"dp2", 2, 1, 0, 8, 0, 1, false, 0, ""},
			{"dp2+zero1", 2, 1, 0, 8, 0, 1, false, 1, ""},
			{"tp2xdp2+sp+zero1", 4, 2, 0, 8, 0, 1, true, 1, ""},
			{"pp2", 2, 1, 2, 4, 4, 1, false, 0, ""},
			{"pp2tp2sp", 4, 2, 2, 4, 4, 1, true, 0, ""},
			{"tp2 selective", 2, 2, 0, 16, 0, 1, false, 0, "selective"},
			{"tp2 full", 2, 2, 0, 16, 0, 1, false, 0, "full"},
		}
		curves := map[string][]float64{}
		exact := map[string]string{"dp2+zero1": "dp2", "tp2 selective": "tp2", "tp2 full": "tp2"}
		for _, l := range layouts {
			if testing.Short() && l.ntasks > 2 {
				continue
			}
			cfg := base
			cfg.NTasks, cfg.TP, cfg.PP, cfg.BatchSize, cfg.MicroBatches, cfg.GradAccum = l.ntasks, l.tp, l.pp, l.b, l.micro, l.accum
			cfg.SP, cfg.Zero, cfg.Recompute = l.sp, l.zero, l.recompute
			res := runInProcess(t, cfg, "")
			name := l.name
			if untied {
				name += " untied"
			}
			if len(res.Losses) != 20 {
				t.Fatalf("%s: %d steps", name, len(res.Losses))
			}
			curves[l.name] = res.Losses
			ref := curves["tp1"]
			if l.name == "tp1" {
				if !(ref[19] < ref[0]-0.5) {
					t.Errorf("%s: the loss does not fall: %v", name, ref)
				}
				continue
			}
			if same := exact[l.name]; same != "" {
				bitIdentical(t, name, res.Losses, same, curves[same])
			}
			sameCurve(t, name, res.Losses, ref)
		}
	}
}

// makeTinyLlama writes a tiny random LlamaForCausalLM directory with
// scripts/tiny_llama.py make and the extra options args.
func makeTinyLlama(t *testing.T, py string, args ...string) string {
	t.Helper()
	dir := t.TempDir()
	script := filepath.Join("..", "scripts", "tiny_llama.py")
	cmd := exec.Command(py, append([]string{script, "make", dir, "--layers", "2", "--dim", "64", "--heads", "4", "--kv-heads", "2",
		"--ffn", "160", "--vocab", "320"}, args...)...)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("tiny_llama.py make: %v: %s", err, out)
	}
	return dir
}

// referenceLogits are scripts/tiny_llama.py forward's logits of ids (a
// JSON array of rows), one row a position.
func referenceLogits(t *testing.T, py, dir string, ids []int32) [][]float64 {
	t.Helper()
	args := []string{filepath.Join("..", "scripts", "tiny_llama.py"), "forward", dir}
	for _, id := range ids {
		args = append(args, strconv.Itoa(int(id)))
	}
	out, err := exec.Command(py, args...).Output()
	if err != nil {
		t.Fatalf("tiny_llama.py forward: %v", err)
	}
	var rows [][]float64
	if err := json.Unmarshal(out, &rows); err != nil || len(rows) != len(ids) {
		t.Fatalf("tiny_llama.py forward: %d rows for %d ids: %v: %.200s", len(rows), len(ids), err, out)
	}
	return rows
}

// engineLogits runs the Llama of --init-from dir on ids at tensor-parallel
// degree tp (in-process ranks) and returns the logits of the real
// vocabulary, one row a position, gathered from the vocab-parallel head.
func engineLogits(t *testing.T, dir string, ids []int32, tp int) [][]float32 {
	t.Helper()
	cfg := config.DefaultConfig()
	cfg.Preset, cfg.InitFrom = "", dir
	if err := ApplyInitFrom(&cfg, nil); err != nil {
		t.Fatal(err)
	}
	T := len(ids)
	cfg.Seq, cfg.BatchSize, cfg.TP, cfg.NTasks = T, 1, tp, tp
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var vocab int
	cols := map[int][]float32{}
	local := 0
	err := nccl.RunInProcess(tp, func(c nccl.Comm) error {
		dev := tensor.NewCPU()
		mesh, err := parallel.NewMesh(c, tp)
		if err != nil {
			return err
		}
		defer mesh.Close()
		tok, err := tokenizer.New(cfg, nil)
		if err != nil {
			return err
		}
		v, err := data.ModelVocab(cfg, tok)
		if err != nil {
			return err
		}
		m, err := newModel(cfg, &data.Data{Vocab: v}, mesh, dev)
		if err != nil {
			return err
		}
		defer m.Close()
		if err := loadWeights(m.ParamSet(), cfg, v); err != nil {
			return err
		}
		tr := m.(*transformer)
		b := &data.Batch{B: 1, T: T, Tokens: ids, Targets: make([]int32, T), Lengths: []int32{int32(T)}}
		h, err := tr.trunk(b)
		if err != nil {
			return err
		}
		logits, err := tr.head.Forward(h)
		if err != nil {
			return err
		}
		host := make([]float32, logits.Len())
		dev.CopyToHost(host, logits)
		mu.Lock()
		cols[c.Rank()], vocab, local = host, v, tr.head.LocalOut()
		mu.Unlock()
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	rows := make([][]float32, T)
	for i := range rows {
		for r := 0; r < tp; r++ {
			rows[i] = append(rows[i], cols[r][i*local:(i+1)*local]...)
		}
		rows[i] = rows[i][:vocab]
	}
	return rows
}

// TestLlamaMatchesReference is the Llama's check against an independent
// reading of the architecture: --init-from tiny random LlamaForCausalLM
// directories (grouped heads, Llama 3's rope scaling or none, tied and
// untied heads, f32, bf16 and f16 weights) and the logits of every
// position at tp 1, tp 2 and tp 4 (each key/value head replicated over
// two ranks, read from the same offsets) equal scripts/tiny_llama.py
// forward's (NumPy, float64, from the same file's values) within 1e-5.
func TestLlamaMatchesReference(t *testing.T) {
	py := numpyPython(t)
	ids := []int32{5, 77, 260, 3, 299, 42, 42, 318, 0, 128, 7, 64}
	for _, tc := range []struct {
		name string
		args []string
	}{
		{"f32 llama3-rope untied", []string{"--dtype", "float32", "--llama3-rope", "--positions", "32"}},
		{"f32 tied theta500", []string{"--dtype", "float32", "--tie", "--rope-theta", "500", "--seed", "3"}},
		{"bf16 untied", []string{"--dtype", "bfloat16", "--seed", "4"}},
		{"f16 tied llama3-rope", []string{"--dtype", "float16", "--tie", "--llama3-rope", "--seed", "5"}},
	} {
		dir := makeTinyLlama(t, py, tc.args...)
		want := referenceLogits(t, py, dir, ids)
		for _, tp := range []int{1, 2, 4} {
			got := engineLogits(t, dir, ids, tp)
			worst := 0.0
			for i, row := range want {
				if len(got[i]) != len(row) {
					t.Fatalf("%s tp %d: position %d: %d logits, the reference %d", tc.name, tp, i, len(got[i]), len(row))
				}
				for j, w := range row {
					worst = math.Max(worst, math.Abs(float64(got[i][j])-w))
				}
			}
			if worst > 1e-5 {
				t.Errorf("%s tp %d: logits differ from the reference by up to %.3g", tc.name, tp, worst)
			}
			t.Logf("%s tp %d: max |logit - reference| %.2g", tc.name, tp, worst)
		}
	}
}

// TestLlamaInitFromLossCurves fine-tunes a tiny LlamaForCausalLM directory
// (bf16 weights, its tokenizer.json) on text at tp 1, tp 2, tp 2 with
// sequence parallelism and dp 2 with ZeRO-1: the curves equal tp1's
// within 1e-6 relative, and the first loss is the reference forward's
// (the pretrained weights are the ones used).
func TestLlamaInitFromLossCurves(t *testing.T) {
	py := numpyPython(t)
	dir := makeTinyLlama(t, py, "--dtype", "bfloat16", "--llama3-rope", "--seed", "9")
	base := config.DefaultConfig()
	base.Preset, base.InitFrom = "", dir
	if err := ApplyInitFrom(&base, nil); err != nil {
		t.Fatal(err)
	}
	if base.Model != "llama" || base.Tokenizer != "hf" || base.KVHeads != 2 || base.FFN != 160 || !base.UntiedHead || base.RopeFactor != 8 {
		t.Fatalf("init_from %s gives %+v", dir, base)
	}
	base.Data, base.Seq, base.Steps, base.EvalEvery, base.EvalSamples, base.Samples, base.CkptEvery = textFile(t), 16, 10, 0, 16, 512, -1
	base.Warmup, base.LR, base.Shuffle = 2, 1e-3, false
	// The first step's loss, from the reference forward of the first
	// batch (samples 0-7 in order).
	ds, err := data.Prepare(base)
	if err != nil {
		t.Fatal(err)
	}
	var sum float64
	n := 0
	for i := 0; i < 8; i++ {
		rows := referenceLogits(t, py, dir, ds.Train.Tokens[i*16:(i+1)*16])
		for j, row := range rows {
			target := int(ds.Train.Targets[i*16+j])
			if target < 0 {
				continue
			}
			m := row[0]
			for _, v := range row {
				m = math.Max(m, v)
			}
			var z float64
			for _, v := range row {
				z += math.Exp(v - m)
			}
			sum += math.Log(z) + m - row[target]
			n++
		}
	}
	want := sum / float64(n)
	var ref []float64
	for _, l := range []struct {
		name          string
		ntasks, tp, b int
		sp            bool
		zero          int
	}{{"tp1", 1, 1, 8, false, 0}, {"tp2", 2, 2, 8, false, 0}, {"tp2+sp", 2, 2, 8, true, 0}, {"dp2+zero1", 2, 1, 4, false, 1}, {"dp2+zero2", 2, 1, 4, false, 2}, {"dp2+zero3", 2, 1, 4, false, 3}} {
		cfg := base
		cfg.NTasks, cfg.TP, cfg.BatchSize, cfg.SP, cfg.Zero = l.ntasks, l.tp, l.b, l.sp, l.zero
		res := runInProcess(t, cfg, "")
		if len(res.Losses) != 10 {
			t.Fatalf("%s: %d steps", l.name, len(res.Losses))
		}
		if ref == nil {
			ref = res.Losses
			if d := math.Abs(ref[0] - want); d > 1e-5 {
				t.Errorf("%s: first loss %.7f, the reference forward's %.7f", l.name, ref[0], want)
			}
			t.Logf("%s: first loss %.7f, the reference forward's %.7f", l.name, ref[0], want)
			if !(ref[9] < ref[0]) {
				t.Errorf("%s: the loss does not fall: %v", l.name, ref)
			}
			continue
		}
		sameCurve(t, l.name, res.Losses, ref)
	}
}

// TestLlamaResumeAtOtherLayout saves an untied Llama at tp 2 x dp 2 with
// ZeRO-1 and resumes it: at the same layout bit for bit, at tp 1, at tp 4
// (8 query heads in 4 groups) with sp, and at pp 2 within 1e-6 of the
// uninterrupted run (the checkpoint reshards the fused Q,K,V groups and
// gate/up blocks at any tp).
func TestLlamaResumeAtOtherLayout(t *testing.T) {
	cfg := llamaConfig(t)
	cfg.Heads, cfg.KVHeads, cfg.UntiedHead = 8, 4, true
	cfg.NTasks, cfg.TP, cfg.BatchSize, cfg.Zero = 4, 2, 8, 1
	cfg.Steps, cfg.EvalEvery, cfg.CkptEvery = 10, 0, 5
	ds, err := data.Prepare(cfg)
	if err != nil {
		t.Fatal(err)
	}
	full := t.TempDir()
	res, err := runRanks(t, cfg, ds, func(int) Options { return Options{RunDir: full} })
	if err != nil {
		t.Fatal(err)
	}
	from := filepath.Join(rundir.Dir(full).Ckpt(), "step-000005")
	resume := func(name string, ntasks, tp, pp, b int, sp bool, zero int) []float64 {
		t.Helper()
		c := cfg
		c.NTasks, c.TP, c.PP, c.BatchSize, c.SP, c.Zero = ntasks, tp, pp, b, sp, zero
		if pp > 1 {
			c.MicroBatches = 4
		}
		dir := t.TempDir()
		r, err := runRanks(t, c, ds, func(int) Options { return Options{RunDir: dir, Resume: from} })
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if r[0].Start != 5 || len(r[0].Losses) != 5 {
			t.Fatalf("%s: resumed at %d with %d losses, want 5 and 5", name, r[0].Start, len(r[0].Losses))
		}
		return r[0].Losses
	}
	want := res[0].Losses[5:]
	bitIdentical(t, "tp2xdp2+zero1 resumed", resume("same", 4, 2, 0, 8, false, 1), "uninterrupted", want)
	sameCurve(t, "tp1 resumed", resume("tp1", 1, 1, 0, 16, false, 0), want)
	sameCurve(t, "tp4+sp resumed", resume("tp4+sp", 4, 4, 0, 16, true, 0), want)
	// A pipeline runs micro-batches of 4: the same 16 samples a step.
	sameCurve(t, "pp2 resumed", resume("pp2", 2, 1, 2, 4, false, 0), want)
}

// The GPU step (the loss kept on the device, one read a step) trains a
// Llama as the host step does.
func TestLlamaDeviceStep(t *testing.T) {
	cfg := llamaConfig(t)
	cfg.Steps, cfg.BatchSize, cfg.GradAccum, cfg.GradClip = 6, 4, 2, 0.5
	ds, err := data.Prepare(cfg)
	if err != nil {
		t.Fatal(err)
	}
	run := func(dev tensor.Device) *Result {
		world := nccl.NewInProcess(1)[0]
		defer world.Close()
		res, err := Run(context.Background(), cfg, world, Options{Data: ds, Device: dev})
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	want := run(tensor.NewCPU())
	gpu := &hostScalars{CPUDevice: tensor.NewCPU()}
	got := run(gpu)
	for i := range want.Losses {
		if math.Abs(got.Losses[i]-want.Losses[i]) > 1e-5*math.Abs(want.Losses[i]) {
			t.Errorf("step %d: loss %.7f on the GPU step, %.7f on the host step", i+1, got.Losses[i], want.Losses[i])
		}
	}
	if gpu.syncs != int64(cfg.Steps) {
		t.Errorf("%d host synchronisations in %d steps, want one a step", gpu.syncs, cfg.Steps)
	}
}

// TestLlamaReplicatedKVHeads trains Llamas whose key/value heads are fewer
// than tp (Megatron-LM's replication: each held by tp/kv ranks, their
// gradients summed over those ranks): the curves equal tp1's within 1e-6
// relative over 20 steps (with gradient clipping, so that the norm counts
// each replicated head once), with sequence parallelism and ZeRO-1, and
// a checkpoint saved at tp 4 at step 10 resumes at tp 1 on the same
// curve. Without the sum the replicas drift apart and the curve leaves
// tp1's.
func TestLlamaReplicatedKVHeads(t *testing.T) {
	for _, kv := range []int{1, 2} {
		base := llamaConfig(t)
		base.KVHeads, base.GradClip = kv, 0.5
		var ref []float64
		for _, l := range []struct {
			name       string
			ntasks, tp int
			b          int
			sp         bool
			zero       int
		}{
			{"tp1", 1, 1, 16, false, 0},
			{"tp4", 4, 4, 16, false, 0},
			{"tp2+sp", 2, 2, 16, true, 0},
			{"tp2xdp2+zero1", 4, 2, 8, false, 1},
			{"tp4xdp2+zero2", 8, 4, 8, false, 2},
			{"tp4xdp2+zero3", 8, 4, 8, false, 3},
		} {
			if l.tp > 1 && kv%l.tp == 0 {
				continue // whole heads a rank: TestLlamaLossCurves
			}
			cfg := base
			cfg.NTasks, cfg.TP, cfg.BatchSize, cfg.SP, cfg.Zero = l.ntasks, l.tp, l.b, l.sp, l.zero
			name := fmt.Sprintf("kv %d %s", kv, l.name)
			res := runInProcess(t, cfg, "")
			if len(res.Losses) != 20 {
				t.Fatalf("%s: %d steps", name, len(res.Losses))
			}
			if ref == nil {
				ref = res.Losses
				continue
			}
			sameCurve(t, name, res.Losses, ref)
		}
		// Saved at tp 4 (the replicas merged), resumed at tp 1.
		cfg := base
		cfg.NTasks, cfg.TP, cfg.BatchSize, cfg.CkptEvery = 4, 4, 16, 10
		dir := t.TempDir()
		runInProcess(t, cfg, dir)
		cfg.NTasks, cfg.TP, cfg.CkptEvery = 1, 1, -1
		ds, err := data.Prepare(cfg)
		if err != nil {
			t.Fatal(err)
		}
		from := filepath.Join(rundir.Dir(dir).Ckpt(), "step-000010")
		res, err := runRanks(t, cfg, ds, func(int) Options { return Options{RunDir: t.TempDir(), Resume: from} })
		if err != nil {
			t.Fatal(err)
		}
		sameCurve(t, fmt.Sprintf("kv %d tp4 resumed at tp1", kv), res[0].Losses, ref[10:])
	}
}

// TestInitFromPipeline fine-tunes tiny pretrained decoders at pp 2 (each
// stage reads its own blocks; the first the embedding, the last the final
// norm and the head, the tied one from the embedding's rows), alone and
// with tp 2: the curves equal pp 1's within 1e-6 relative. Llamas tied and
// untied (a tiny random LlamaForCausalLM), and a GPT-2.
func TestInitFromPipeline(t *testing.T) {
	py := numpyPython(t)
	text := textFile(t)
	type source struct {
		name string
		dir  string
	}
	sources := []source{
		{"llama untied", makeTinyLlama(t, py, "--dtype", "bfloat16", "--seed", "11")},
		{"llama tied", makeTinyLlama(t, py, "--dtype", "float32", "--tie", "--seed", "12")},
		{"gpt2", tinyGPT2(t, tinyGPT2Spec, interop.HFOptions{})},
	}
	for _, src := range sources {
		base := config.DefaultConfig()
		base.Preset, base.InitFrom = "", src.dir
		if err := ApplyInitFrom(&base, nil); err != nil {
			t.Fatal(err)
		}
		base.Data, base.Seq, base.Steps, base.EvalEvery, base.EvalSamples, base.Samples, base.CkptEvery = text, 16, 8, 0, 16, 512, -1
		base.Warmup, base.LR = 2, 1e-3
		var ref []float64
		for _, l := range []struct {
			name                   string
			ntasks, tp, pp, b, mic int
		}{{"pp1", 1, 1, 0, 8, 0}, {"pp2", 2, 1, 2, 2, 4}, {"pp2xtp2", 4, 2, 2, 2, 4}} {
			cfg := base
			cfg.NTasks, cfg.TP, cfg.PP, cfg.BatchSize, cfg.MicroBatches = l.ntasks, l.tp, l.pp, l.b, l.mic
			res := runInProcess(t, cfg, "")
			if len(res.Losses) != 8 {
				t.Fatalf("%s %s: %d steps", src.name, l.name, len(res.Losses))
			}
			if ref == nil {
				ref = res.Losses
				continue
			}
			sameCurve(t, src.name+" "+l.name, res.Losses, ref)
		}
	}
}
