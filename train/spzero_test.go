package train

import (
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/hpcrun/hpcrun/internal/rundir"
	"github.com/hpcrun/hpcrun/nccl"
	"github.com/hpcrun/hpcrun/parallel"
	"github.com/hpcrun/hpcrun/tensor"
	"github.com/hpcrun/hpcrun/train/ckpt"
	"github.com/hpcrun/hpcrun/train/config"
)

// TestSPZeroLossCurves trains the same model from the same seed on the
// same global batch with sequence parallelism and ZeRO-1 (alone and
// together with tp x dp): every loss curve must equal tp1's to 1e-6
// relative over 20 steps, for the classifier and the language model.
func TestSPZeroLossCurves(t *testing.T) {
	for _, model := range []string{"bert", "gpt"} {
		t.Run(model, func(t *testing.T) {
			base := smallConfig(model)
			if model == "gpt" {
				base.Data = textFile(t)
			}
			layouts := []struct {
				name                 string
				ntasks, tp, b, accum int
				sp                   bool
				zero                 int
			}{
				{"tp1", 1, 1, 16, 1, false, 0},
				{"tp2+sp", 2, 2, 16, 1, true, 0},
				{"dp2+zero1", 2, 1, 8, 1, false, 1},
				{"tp2xdp2+sp+zero1", 4, 2, 8, 1, true, 1},
				{"tp2+sp accum2", 2, 2, 8, 2, true, 0},
			}
			var ref []float64
			for _, l := range layouts {
				if testing.Short() && l.ntasks > 2 {
					continue
				}
				cfg := base
				cfg.NTasks, cfg.TP, cfg.BatchSize, cfg.GradAccum, cfg.SP, cfg.Zero = l.ntasks, l.tp, l.b, l.accum, l.sp, l.zero
				res := runInProcess(t, cfg, "")
				if len(res.Losses) != 20 {
					t.Fatalf("%s: %d steps", l.name, len(res.Losses))
				}
				if ref == nil {
					ref = res.Losses
					continue
				}
				sameCurve(t, l.name, res.Losses, ref)
			}
		})
	}
}

// sameCurve checks that losses equal the tp1 curve ref to 1e-6 relative,
// step by step, and logs the largest difference.
func sameCurve(t *testing.T, name string, losses, ref []float64) {
	t.Helper()
	sameCurveWithin(t, name, losses, ref, 1e-6)
}

// sameCurveWithin is sameCurve within tol relative.
func sameCurveWithin(t *testing.T, name string, losses, ref []float64, tol float64) {
	t.Helper()
	worst := 0.0
	for i, v := range losses {
		d := math.Abs(v-ref[i]) / math.Abs(ref[i])
		worst = math.Max(worst, d)
		if d > tol {
			t.Errorf("%s step %d: loss %.8f, tp1 %.8f (relative difference %.2g)", name, i+1, v, ref[i], d)
		}
	}
	t.Logf("%s: losses %.4f -> %.4f, largest relative difference from tp1 %.2g", name, losses[0], losses[len(losses)-1], worst)
}

// TestZeroChangesNoBit trains each layout with a replicated optimizer and
// with ZeRO-1, -2 and -3 (also under full recomputation, which runs a
// ZeRO-3 block's forward again on its gathered values): the loss curves
// are the same to the bit (the update is elementwise, each rank's ranges
// run the kernel a replicated optimizer runs, and the norm adds the same
// squares in the same order), for the classifier and the language model.
func TestZeroChangesNoBit(t *testing.T) {
	for _, model := range []string{"bert", "gpt"} {
		base := smallConfig(model)
		base.CkptEvery = -1
		if model == "gpt" {
			base.Data = textFile(t)
		}
		for _, l := range []struct {
			name          string
			ntasks, tp, b int
			sp            bool
			recompute     string
		}{{"dp2", 2, 1, 4, false, ""}, {"dp4", 4, 1, 2, false, ""}, {"tp2xdp2+sp", 4, 2, 4, true, ""}, {"dp2+recompute full", 2, 1, 4, false, "full"}} {
			if testing.Short() && l.ntasks > 2 {
				continue
			}
			cfg := base
			cfg.NTasks, cfg.TP, cfg.BatchSize, cfg.SP, cfg.Recompute = l.ntasks, l.tp, l.b, l.sp, l.recompute
			plain := runInProcess(t, cfg, "").Losses
			for _, zero := range []int{1, 2, 3} {
				cfg.Zero = zero
				bitIdentical(t, fmt.Sprintf("%s %s+zero%d", model, l.name, zero), runInProcess(t, cfg, "").Losses, l.name, plain)
			}
		}
	}
}

// bitIdentical checks that the losses of the run named name equal those
// of the run named other to the bit.
func bitIdentical(t *testing.T, name string, losses []float64, other string, want []float64) {
	t.Helper()
	if len(losses) != len(want) {
		t.Fatalf("%s: %d losses, %s %d", name, len(losses), other, len(want))
	}
	for i, v := range losses {
		if math.Float64bits(v) != math.Float64bits(want[i]) {
			t.Errorf("%s step %d: loss %.17g, %s %.17g: want them bit-identical", name, i+1, v, other, want[i])
			return
		}
	}
}

// TestSPZeroRefused checks the combinations the config refuses, each with
// a one-line error that names the fix.
func TestSPZeroRefused(t *testing.T) {
	for _, tc := range []struct {
		name string
		edit func(*config.Config)
		want string
	}{
		{"sp at tp 1", func(c *config.Config) { c.SP = true }, "sp needs tp > 1"},
		{"sp with seq % tp", func(c *config.Config) { c.NTasks, c.TP, c.Heads, c.Seq, c.SP = 4, 4, 4, 18, true }, "seq 18 is not a multiple of tp 4"},
		{"zero 4", func(c *config.Config) { c.NTasks, c.Zero = 2, 4 }, "zero = 4"},
		{"zero group without zero", func(c *config.Config) { c.NTasks, c.ZeroGroup = 4, "2" }, "needs zero 1, 2 or 3"},
		{"zero group not dividing dp", func(c *config.Config) { c.NTasks, c.Zero, c.ZeroGroup = 4, 3, "3" }, "does not divide the data-parallel degree 4"},
		{"zero group of one", func(c *config.Config) { c.NTasks, c.Zero, c.ZeroGroup = 4, 3, "1" }, "at least 2"},
		{"zero group nonsense", func(c *config.Config) { c.NTasks, c.Zero, c.ZeroGroup = 4, 3, "rack" }, "use node, or a number"},
		{"zero 2 of arch hf", func(c *config.Config) { c.Model, c.Arch, c.NTasks, c.Zero = "bert", "hf", 2, 2 }, "arch hf"},
		{"zero at dp 1", func(c *config.Config) { c.NTasks, c.TP, c.Zero = 2, 2, 1 }, "data-parallel degree > 1"},
	} {
		cfg := smallConfig("gpt")
		tc.edit(&cfg)
		err := cfg.Validate()
		if err == nil || !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), "\n") {
			t.Errorf("%s: err = %v, want one line with %q", tc.name, err, tc.want)
		}
	}
}

// TestZeroResumeAtOtherLayout trains dp2 with ZeRO-1 for 10 steps,
// checkpointing at 5, then resumes from step 5 at other layouts. The
// resume is exact: the dp2 pieces of the moments, assembled and cut for
// dp4, continue bit for bit as the same run's state saved by a replicated
// optimizer or by ZeRO-2 or -3 (ZeRO changes no bit, TestZeroChangesNoBit)
// and resumed at dp4 with or without ZeRO-1, -2 or -3, and at dp2 with
// ZeRO-2 or -3. Against the uninterrupted dp2 run the
// continuations at dp4, tp2 x dp2 (+sp) and dp1 agree to 1e-6: the global
// batch is the same, but the gradients are summed over other groups.
func TestZeroResumeAtOtherLayout(t *testing.T) {
	cfg, ds := gptConfig(t, 2, 1)
	cfg.Steps, cfg.EvalEvery, cfg.CkptEvery, cfg.BatchSize, cfg.Zero = 10, 0, 5, 8, 1
	full := t.TempDir()
	res, err := runRanks(t, cfg, ds, func(int) Options { return Options{RunDir: full} })
	if err != nil {
		t.Fatal(err)
	}
	from := filepath.Join(rundir.Dir(full).Ckpt(), "step-000005")
	for _, f := range []string{"optim-tp0-dp0.safetensors", "optim-tp0-dp1.safetensors"} {
		if _, err := os.Stat(filepath.Join(from, f)); err != nil {
			t.Fatalf("ZeRO-1 checkpoint lacks a DP rank's optimizer file: %v", err)
		}
	}
	// The step-5 checkpoint of the same run at another ZeRO stage.
	savedAt := func(zero int) string {
		c := cfg
		c.Zero, c.Steps = zero, 5
		dir := t.TempDir()
		if _, err := runRanks(t, c, ds, func(int) Options { return Options{RunDir: dir} }); err != nil {
			t.Fatal(err)
		}
		return filepath.Join(rundir.Dir(dir).Ckpt(), "step-000005")
	}
	fromPlain := savedAt(0) // a replicated optimizer's
	resume := func(name, from string, ntasks, tp, b, zero int, sp bool) []float64 {
		t.Helper()
		c := cfg
		c.NTasks, c.TP, c.BatchSize, c.Zero, c.SP = ntasks, tp, b, zero, sp
		dir := t.TempDir()
		resumed, err := runRanks(t, c, ds, func(int) Options { return Options{RunDir: dir, Resume: from} })
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if resumed[0].Start != 5 || len(resumed[0].Losses) != 5 {
			t.Fatalf("%s: resumed at %d with %d losses, want 5 and 5", name, resumed[0].Start, len(resumed[0].Losses))
		}
		return resumed[0].Losses
	}
	dp4 := resume("dp4+zero1", from, 4, 1, 4, 1, false)
	// ZeRO-2's checkpoint is ZeRO-1's: the same pieces of the moments.
	fromTwo := savedAt(2)
	bitIdentical(t, "dp4+zero1 from the ZeRO-2 checkpoint", resume("dp4+zero1 from zero2", fromTwo, 4, 1, 4, 1, false), "from the ZeRO-1 one", dp4)
	bitIdentical(t, "dp4 replicated from the ZeRO-2 checkpoint", resume("dp4 from zero2", fromTwo, 4, 1, 4, 0, false), "dp4+zero1", dp4)
	bitIdentical(t, "dp2+zero2 from the ZeRO-1 checkpoint", resume("dp2+zero2 from zero1", from, 2, 1, 8, 2, false), "uninterrupted", res[0].Losses[5:])
	bitIdentical(t, "dp4+zero2 from the ZeRO-2 checkpoint", resume("dp4+zero2 from zero2", fromTwo, 4, 1, 4, 2, false), "dp4+zero1", dp4)
	// ZeRO-3's checkpoint holds the whole parameters, gathered.
	fromThree := savedAt(3)
	bitIdentical(t, "dp4 replicated from the ZeRO-3 checkpoint", resume("dp4 from zero3", fromThree, 4, 1, 4, 0, false), "dp4+zero1", dp4)
	bitIdentical(t, "dp4+zero3 from the ZeRO-1 checkpoint", resume("dp4+zero3 from zero1", from, 4, 1, 4, 3, false), "dp4+zero1", dp4)
	bitIdentical(t, "dp2+zero3 from the ZeRO-3 checkpoint", resume("dp2+zero3 from zero3", fromThree, 2, 1, 8, 3, false), "uninterrupted", res[0].Losses[5:])
	bitIdentical(t, "dp4+zero1 from the replicated checkpoint", resume("dp4+zero1 from replicated", fromPlain, 4, 1, 4, 1, false), "from the ZeRO-1 one", dp4)
	bitIdentical(t, "dp4 replicated from the ZeRO-1 checkpoint", resume("dp4 from zero1", from, 4, 1, 4, 0, false), "dp4+zero1", dp4)
	bitIdentical(t, "dp2+zero1 from the replicated checkpoint", resume("dp2+zero1 from replicated", fromPlain, 2, 1, 8, 1, false), "uninterrupted", res[0].Losses[5:])
	for name, got := range map[string][]float64{
		"dp4+zero1":        dp4,
		"tp2xdp2+sp+zero1": resume("tp2xdp2+sp+zero1", from, 4, 2, 8, 1, true),
		"dp1":              resume("dp1", from, 1, 1, 16, 0, false),
	} {
		for i, want := range res[0].Losses[5:] {
			if d := math.Abs(got[i]-want) / want; d > 1e-6 {
				t.Errorf("%s step %d: resumed loss %.8f, uninterrupted %.8f (relative %.2g)", name, 6+i, got[i], want, d)
			}
		}
	}
}

// TestZeroPiecesRoundTrip cuts known moments into ZeRO-1 pieces at dp 2,
// writes them as a checkpoint, reads them back whole (bit for bit) and
// cuts them again at dp 3: every element lands in exactly one rank.
func TestZeroPiecesRoundTrip(t *testing.T) {
	dev := tensor.NewCPU()
	shapes := [][]int{{7, 5}, {3}, {11, 2}, {1}}
	mkParams := func() []*parallel.Param {
		var ps []*parallel.Param
		for i, sh := range shapes {
			d, _ := dev.Alloc(sh...)
			g, _ := dev.Alloc(sh...)
			ps = append(ps, &parallel.Param{Name: fmt.Sprintf("p%d", i), Data: d, Grad: g, Full: sh, Shard: parallel.Shard{Parts: 1}})
		}
		return ps
	}
	want := map[string][2][]float32{}
	for i, sh := range shapes {
		n := 1
		for _, d := range sh {
			n *= d
		}
		m, v := make([]float32, n), make([]float32, n)
		for j := range m {
			m[j], v[j] = float32(i*100+j)+0.25, -float32(i*100+j)
		}
		want[fmt.Sprintf("p%d", i)] = [2][]float32{m, v}
	}
	dir := t.TempDir()
	st := &ckpt.State{Format: ckpt.Format, Step: 3, Model: "gpt", Vocab: 1, Config: []byte(`{}`), Mesh: ckpt.Mesh{TP: 1, DP: 2, World: 2}, Zero: 1}
	for i, sh := range shapes {
		st.Tensors = append(st.Tensors, ckpt.TensorInfo{Name: fmt.Sprintf("p%d", i), Full: sh})
	}
	// A bucket of 24 elements: the pieces cut parameters across ranks.
	err := nccl.RunInProcess(2, func(c nccl.Comm) error {
		ps := mkParams()
		z, err := NewZeRO1(dev, ps, c, nil, 0, 0, 24)
		if err != nil {
			return err
		}
		for i, p := range ps {
			if err := z.LoadMoments(i, want[p.Name][0], want[p.Name][1]); err != nil {
				return err
			}
		}
		var model []ckpt.Tensor
		for _, p := range ps {
			model = append(model, ckpt.Tensor{Name: p.Name, Shape: p.Full, Data: make([]float32, p.Data.Len())})
		}
		if c.Rank() == 0 {
			if err := ckpt.WriteModel(dir, 0, 1, 3, model); err != nil {
				return err
			}
		}
		return ckpt.WriteOptimZero(dir, 0, c.Rank(), 3, 3, z.Pieces())
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := ckpt.WriteState(dir, st); err != nil {
		t.Fatal(err)
	}
	c, err := ckpt.Open(dir, true)
	if err != nil {
		t.Fatal(err)
	}
	for name, mv := range want {
		for k, kind := range []string{"m", "v"} {
			got, err := c.Full(kind, name)
			if err != nil {
				t.Fatal(err)
			}
			for j := range got {
				if math.Float32bits(got[j]) != math.Float32bits(mv[k][j]) {
					t.Fatalf("%s.%s[%d] = %v after the round trip, want %v", kind, name, j, got[j], mv[k][j])
				}
			}
		}
	}
	// Cut again at dp 3: the pieces of the three ranks tile every moment.
	count := map[string][]int{}
	var mu sync.Mutex
	err = nccl.RunInProcess(3, func(cm nccl.Comm) error {
		ps := mkParams()
		z, err := NewZeRO1(dev, ps, cm, nil, 0, 0, 24)
		if err != nil {
			return err
		}
		for i, p := range ps {
			m, _ := c.Full("m", p.Name)
			v, _ := c.Full("v", p.Name)
			if err := z.LoadMoments(i, m, v); err != nil {
				return err
			}
		}
		mu.Lock()
		defer mu.Unlock()
		for _, pc := range z.Pieces() {
			if count[pc.Name] == nil {
				count[pc.Name] = make([]int, len(want[pc.Name][0]))
			}
			for j, x := range pc.M {
				count[pc.Name][pc.Offset+j]++
				if x != want[pc.Name][0][pc.Offset+j] {
					return fmt.Errorf("dp3 rank %d: m.%s[%d] = %v, want %v", cm.Rank(), pc.Name, pc.Offset+j, x, want[pc.Name][0][pc.Offset+j])
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for name, cs := range count {
		for j, n := range cs {
			if n != 1 {
				t.Errorf("dp3: m.%s[%d] held by %d ranks", name, j, n)
			}
		}
	}
	if len(count) != len(shapes) {
		t.Errorf("dp3 pieces cover %d parameters, want %d", len(count), len(shapes))
	}
}

// TestZeroStep compares one ZeRO-1 step at dp 2 with GradSync and a
// replicated AdamW on the same gradients (different on each rank), counts
// its messages (per bucket one reduce-scatter and one all-gather, then
// the norm's all-gather, nothing else) and checks that each rank holds
// moments for half the elements.
func TestZeroStep(t *testing.T) {
	shapes := [][]int{{8, 6}, {6}, {10, 3}, {5}}
	err := nccl.RunInProcess(2, func(c nccl.Comm) error {
		dev := tensor.NewCPU()
		mk := func() []*parallel.Param {
			var ps []*parallel.Param
			for i, sh := range shapes {
				d, _ := dev.Alloc(sh...)
				g, _ := dev.Alloc(sh...)
				n := d.Len()
				vals, grads := make([]float32, n), make([]float32, n)
				for j := range vals {
					vals[j] = float32((i*7+j)%13)/13 - 0.5
					grads[j] = float32((i*5+j*(c.Rank()+2))%11)/11 - 0.4
				}
				dev.CopyFromHost(d, vals)
				dev.CopyFromHost(g, grads)
				ps = append(ps, &parallel.Param{Name: fmt.Sprintf("p%d", i), Data: d, Grad: g, Full: sh, Shard: parallel.Shard{Parts: 1}, Decay: i%2 == 0})
			}
			return ps
		}
		ref, got := mk(), mk()
		adam, err := NewAdamW(dev, ref, 0.1, 0.5)
		if err != nil {
			return err
		}
		if err := NewGradSync(dev, c, ref, 40, false).Sync(); err != nil {
			return err
		}
		gn, err := newGradNorm(dev, len(ref), 0.5, nil)
		if err != nil {
			return err
		}
		if err := gn.compute(normViews(ref, nil, 0, func(i int) (*tensor.Tensor, int) { return ref[i].Grad, 0 })); err != nil {
			return err
		}
		adam.StepScaled(1e-2, gn.scale())
		norm, err := gn.read()
		if err != nil {
			return err
		}
		z, err := NewZeRO1(dev, got, c, nil, 0.1, 0.5, 40)
		if err != nil {
			return err
		}
		s0 := c.Stats()
		zn, err := z.step(1e-2)
		if err != nil {
			return err
		}
		d := c.Stats().Sub(s0)
		nb := int64(len(z.buckets))
		if nb < 2 || d.ReduceScatter.Calls != nb || d.AllGather.Calls != nb+1 || d.AllReduce.Calls != 0 || d.Total().Calls != 2*nb+1 {
			return fmt.Errorf("a step over %d buckets made %d reduce-scatters, %d all-gathers, %d all-reduces (%d calls); want %d, %d (one for the norm), 0",
				nb, d.ReduceScatter.Calls, d.AllGather.Calls, d.AllReduce.Calls, d.Total().Calls, nb, nb+1)
		}
		if math.Abs(zn-norm) > 1e-6*norm {
			return fmt.Errorf("zero-1 norm %v, replicated %v", zn, norm)
		}
		held, want, total := 0, 0, 0
		for _, b := range z.buckets {
			held += b.m.Len()
			want += (b.n + 1) / 2
			total += b.n
		}
		if held != want {
			return fmt.Errorf("rank %d holds moments for %d of %d elements", c.Rank(), held, total)
		}
		for i := range ref {
			a, b := make([]float32, ref[i].Data.Len()), make([]float32, ref[i].Data.Len())
			dev.CopyToHost(a, ref[i].Data)
			dev.CopyToHost(b, got[i].Data)
			for j := range a {
				if math.Abs(float64(a[j]-b[j])) > 1e-6 {
					return fmt.Errorf("rank %d %s[%d]: zero-1 %v, replicated %v", c.Rank(), ref[i].Name, j, b[j], a[j])
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// step is one optimizer step of z alone, for the tests: it averages the gradients over the DP group (reduce-scatter), clips
// them to the global norm, updates this rank's ranges at learning rate lr
// and all-gathers the parameters. It returns the gradient norm before
// clipping.
func (z *ZeRO) step(lr float64) (float64, error) {
	if err := z.reduce(); err != nil {
		return 0, err
	}
	if err := z.update(lr); err != nil {
		return 0, err
	}
	return z.norm.read()
}

// TestHybridSharding trains dp 4 with ZeRO-1, -2 and -3 sharded over groups
// of 2 data-parallel ranks and replicated across the two groups (hybrid
// sharding, --zero-group 2; also with tp 2 and a pipeline): the curves are
// the replicated optimizer's to 1e-6 (averaging over a group and then over
// the replicas rounds differently from one average over dp). Its
// checkpoints hold the pieces of the first group only, and resume at zero
// 0 and at zero 3 over all four ranks, and as saved bit for bit.
func TestHybridSharding(t *testing.T) {
	cfg, ds := gptConfig(t, 4, 1)
	cfg.Steps, cfg.EvalEvery, cfg.CkptEvery, cfg.BatchSize = 10, 0, -1, 4
	run := func(c config.Config, opt func(int) Options) []float64 {
		t.Helper()
		res, err := runRanks(t, c, ds, opt)
		if err != nil {
			t.Fatal(err)
		}
		return res[0].Losses
	}
	none := func(int) Options { return Options{} }
	ref := run(cfg, none)
	for _, l := range []struct {
		name           string
		ntasks, tp, pp int
		zero           int
		group          string
	}{
		{"dp4 zero1 group2", 4, 1, 1, 1, "2"}, {"dp4 zero2 group2", 4, 1, 1, 2, "2"}, {"dp4 zero3 group2", 4, 1, 1, 3, "2"},
		{"tp2xdp4 zero3 group2", 8, 2, 1, 3, "2"}, {"pp2xdp4 zero3 group2", 8, 1, 2, 3, "2"},
	} {
		if testing.Short() && l.ntasks > 4 {
			continue
		}
		c := cfg
		c.NTasks, c.TP, c.PP, c.Zero, c.ZeroGroup = l.ntasks, l.tp, l.pp, l.zero, l.group
		if l.pp > 1 {
			c.MicroBatches, c.BatchSize = 2, 2 // the same global batch
		}
		sameCurve(t, l.name, run(c, none), ref)
	}
	c := cfg
	c.Zero, c.ZeroGroup, c.CkptEvery = 3, "2", 5
	full := t.TempDir()
	hybrid := run(c, func(int) Options { return Options{RunDir: full} })
	from := filepath.Join(rundir.Dir(full).Ckpt(), "step-000005")
	for _, f := range []string{"optim-tp0-dp2.safetensors", "optim-tp0-dp3.safetensors"} {
		if _, err := os.Stat(filepath.Join(from, f)); err == nil {
			t.Errorf("%s: the second group's pieces are the first's; want them saved once", f)
		}
	}
	resume := func(zero int, group string) []float64 {
		t.Helper()
		r := cfg
		r.Zero, r.ZeroGroup = zero, group
		dir := t.TempDir()
		return run(r, func(int) Options { return Options{RunDir: dir, Resume: from} })
	}
	bitIdentical(t, "resumed as saved (zero 3, groups of 2)", resume(3, "2"), "uninterrupted", hybrid[5:])
	sameCurve(t, "resumed at zero 0", resume(0, ""), ref[5:])
	sameCurve(t, "resumed at zero 3 over dp 4", resume(3, ""), ref[5:])
}
