package plan

import (
	"bytes"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/hpcrun/hpcrun/train/config"
)

// autoConfig is a GPT of the given shape on ntasks tasks, global batch
// bsz (one replica).
func autoConfig(t *testing.T, layers, dim, heads, seq, bsz, ntasks int) config.Config {
	t.Helper()
	cfg := config.DefaultConfig()
	cfg.Model, cfg.Layers, cfg.Dim, cfg.Heads, cfg.Seq = "gpt", layers, dim, heads, seq
	cfg.BatchSize, cfg.NTasks, cfg.TP, cfg.Device = bsz, ntasks, ntasks, "cpu"
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	return cfg
}

// gpu is a GPU of mem bytes with the H100's rates.
func gpu(t *testing.T, mem int64) Device {
	t.Helper()
	d, err := LookupDevice("h100-80")
	if err != nil {
		t.Fatal(err)
	}
	d.MemBytes = mem
	return d
}

// TestAutoTinyModelPicksDP: a small model on one host whose micro-batch
// activations dwarf its weights (dim 64, 8 x 256 tokens a replica) moves
// far fewer bytes with dp (one all-reduce of the weights) than with tp
// (four all-reduces of the activations a block), splits all the work
// where tp leaves the residuals whole, and has no bubble: dp 4 with the
// whole batch in one micro-batch wins, and the list is sorted.
func TestAutoTinyModelPicksDP(t *testing.T) {
	cfg := autoConfig(t, 4, 64, 4, 256, 8, 4)
	cfg.TP = 1 // global batch 8 x dp 4 = 32
	res, err := Auto(AutoRequest{Request: Request{Config: cfg, Vocab: 256, Nodes: 1, Device: gpu(t, 80*gib)}})
	if err != nil {
		t.Fatal(err)
	}
	if res.GlobalBatch != 32 {
		t.Errorf("global batch %d, want 32 (bsz 8 x dp 4)", res.GlobalBatch)
	}
	if l := res.Ranked[0].Layout; l.TP != 1 || l.PP != 1 || l.DP != 4 || l.Micro != 1 || l.BatchSize != 8 {
		t.Errorf("first: %s (%s); want tp1 pp1 dp4 micro1 bsz8", l, res.Ranked[0].Why)
	}
	if len(res.Unfit) != 0 || len(res.Invalid) != 0 {
		t.Errorf("unfit %v, invalid %v: everything fits and validates", res.Unfit, res.Invalid)
	}
	checkSorted(t, res)
	// Every factorisation of 4 (tp, pp) in (1,1) (1,2) (1,4) (2,1) (2,2)
	// (4,1) is there.
	seen := map[[2]int]bool{}
	for _, r := range res.Ranked {
		seen[[2]int{r.Layout.TP, r.Layout.PP}] = true
		if r.Layout.TP*r.Layout.PP*r.Layout.DP != 4 || r.Layout.DP*r.Layout.Micro*r.Layout.BatchSize != 32 {
			t.Errorf("%s: not 4 tasks or not the global batch of 32", r.Layout)
		}
	}
	if len(seen) != 6 {
		t.Errorf("grids searched: %v; want the 6 of 4 tasks", seen)
	}
}

// TestAutoBigModelPicksTPOrPP: a model whose weights, gradients and AdamW
// moments (16 bytes a parameter, the moments' 8 split by ZeRO-1) do not
// fit a data-parallel rank in any number of micro-batches must shard its
// weights: with the device's memory just below the least a dp-only layout
// needs, the first is tp or pp, and every dp-only layout is unfit.
func TestAutoBigModelPicksTPOrPP(t *testing.T) {
	cfg := autoConfig(t, 8, 512, 8, 64, 4, 4)
	cfg.TP = 1
	req := AutoRequest{Request: Request{Config: cfg, Vocab: 256, Nodes: 1, Device: gpu(t, 80*gib)}}
	// The dp-only layouts: dp 4, ZeRO off, 1, 2 and 3, no, selective or full
	// recomputation, 4 samples a replica in 1, 2 or 4 micro-batches.
	least := int64(-1)
	for _, zero := range []int{0, 1, 2, 3} {
		for _, rc := range []string{"", "selective", "full"} {
			for _, m := range []int{1, 2, 4} {
				c := cfg
				c.Zero, c.Recompute, c.GradAccum, c.BatchSize = zero, rc, m, 4/m
				p, err := New(Request{Config: c, Vocab: 256, Nodes: 1, Device: req.Device})
				if err != nil {
					t.Fatal(err)
				}
				if least < 0 || p.Memory.Total < least {
					least = p.Memory.Total
				}
			}
		}
	}
	req.Device = gpu(t, least-1)
	res, err := Auto(req)
	if err != nil {
		t.Fatal(err)
	}
	if l := res.Ranked[0].Layout; l.TP == 1 && l.PP == 1 {
		t.Errorf("first: %s with %d B a rank of %d", l, res.Ranked[0].Plan.Memory.Total, least-1)
	}
	for _, r := range res.Ranked {
		if r.Layout.TP == 1 && r.Layout.PP == 1 {
			t.Errorf("%s ranked, needing %d B of %d", r.Layout, r.Plan.Memory.Total, least-1)
		}
	}
	if len(res.Unfit) == 0 || res.Unfit[0].Plan.Fits {
		t.Errorf("unfit: %v", res.Unfit)
	}
	checkSorted(t, res)

	// Nothing fits a device of 1 MiB: the error says what to change.
	req.Device = gpu(t, mib)
	_, err = Auto(req)
	if !errors.Is(err, ErrNothingFits) || strings.Contains(err.Error(), "\n") {
		t.Fatalf("1 MiB: %v; want ErrNothingFits on one line", err)
	}
	for _, want := range []string{"smallest", "--ntasks", "--bsz", "--gpu"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("nothing fits: %q lacks %q", err, want)
		}
	}
}

// TestAutoExcludesInvalid: 3 layers, 6 heads and seq 9 on 6 tasks with a
// global batch of 4: pp 2 does not divide the layers, dp 3 and 6 not the
// batch, sp at tp 2 or 6 not the sequence, pp 3 at dp 2 and pp 6 have
// fewer samples a replica than stages; none of those is
// ranked, each is listed with its reason, and every ranked config
// validates.
func TestAutoExcludesInvalid(t *testing.T) {
	cfg := autoConfig(t, 3, 48, 6, 9, 4, 6) // tp 6, dp 1: global batch 4
	res, err := Auto(AutoRequest{Request: Request{Config: cfg, Vocab: 64, Nodes: 1, Device: gpu(t, 80*gib)}})
	if err != nil {
		t.Fatal(err)
	}
	if res.GlobalBatch != 4 {
		t.Fatalf("global batch %d, want 4", res.GlobalBatch)
	}
	for _, r := range res.Ranked {
		l := r.Layout
		if l.PP == 2 || l.PP == 6 || (l.PP == 3 && l.DP == 2) || l.DP == 3 || l.DP == 6 || (l.SP && 9%l.TP != 0) {
			t.Errorf("invalid layout ranked: %s", l)
		}
		if err := r.Config.Validate(); err != nil {
			t.Errorf("%s: %v", l, err)
		}
	}
	why := map[string]string{}
	sp := 0
	for _, r := range res.Invalid {
		why[r.Layout.String()] = r.Why
		if r.Layout.SP && strings.Contains(r.Why, "sp: seq 9 is not a multiple of tp") {
			sp++
		}
	}
	for lay, want := range map[string]string{
		"tp1 pp1 dp6": "dp 6 does not divide the global batch of 4 samples",
		"tp1 pp2 dp3": "dp 3 does not divide",
		"tp2 pp1 dp3": "dp 3 does not divide",
		"tp3 pp2 dp1": "layers 3 is not a multiple of pp 2",
		"tp1 pp6 dp1": "a replica's 4 samples make fewer micro-batches than pp 6",
		"tp1 pp3 dp2": "a replica's 2 samples make fewer micro-batches than pp 3",
	} {
		if !strings.Contains(why[lay], want) {
			t.Errorf("invalid %s: %q; want %q (all: %v)", lay, why[lay], want, why)
		}
	}
	if sp == 0 {
		t.Errorf("no layout with sp at tp 2 or 6 listed as invalid: %v", res.Invalid)
	}
	// tp 3 with sp (9 positions, 3 a rank) and the rest are there.
	found := false
	for _, r := range res.Ranked {
		found = found || (r.Layout.TP == 3 && r.Layout.SP)
	}
	if !found {
		t.Error("tp3 sp not ranked")
	}
	checkSorted(t, res)
}

// checkSorted checks res.Ranked is by tokens/s, fastest first, ranks 1..n.
func checkSorted(t *testing.T, res *AutoResult) {
	t.Helper()
	for i, r := range res.Ranked {
		if r.Rank != i+1 || !r.Plan.Fits {
			t.Errorf("#%d: rank %d, fits %v", i, r.Rank, r.Plan.Fits)
		}
		if i > 0 && r.Plan.Time.TokensPerS > res.Ranked[i-1].Plan.Time.TokensPerS {
			t.Errorf("#%d %s (%.0f tokens/s) after %s (%.0f)", i, r.Layout, r.Plan.Time.TokensPerS, res.Ranked[i-1].Layout, res.Ranked[i-1].Plan.Time.TokensPerS)
		}
	}
}

// TestWriteAuto prints the table's columns and the command of the first.
func TestWriteAuto(t *testing.T) {
	cfg := autoConfig(t, 2, 64, 4, 32, 8, 2)
	res, err := Auto(AutoRequest{Request: Request{Config: cfg, Vocab: 256, Nodes: 1, Device: CPU(100e9, 4*gib, 1, "test rate")}})
	if err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	if err := WriteAuto(&b, res, 3); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	for _, want := range []string{"RANK", "LAYOUT", "TOK/S", "MEM/RANK", "COMM", "BUBBLE", "WHY", "fastest:", "run the first: hpcrun submit --ntasks 2 --tp", "rates: test rate", "more that fit"} {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
	}
	if n := strings.Count(out, "\n1 ") + strings.Count(out, "\n2 ") + strings.Count(out, "\n3 "); n != 3 {
		t.Errorf("%d rows; want the top 3:\n%s", n, out)
	}
}

// TestAutoMicroBatches: of the layouts that differ only in their
// micro-batches Auto keeps one, the fewest within 1% of the best; a
// pipeline's at least pp, its bubble (p-1)/(m+p-1) asking for more; and
// when the whole batch of a replica does not fit, gradient accumulation
// makes it fit.
func TestAutoMicroBatches(t *testing.T) {
	cfg := autoConfig(t, 4, 64, 4, 256, 8, 4)
	cfg.TP = 1
	req := AutoRequest{Request: Request{Config: cfg, Vocab: 256, Nodes: 1, Device: gpu(t, 80*gib)}}
	res, err := Auto(req)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[Layout]bool{}
	for _, r := range res.Ranked {
		k := r.Layout
		k.Micro, k.BatchSize = 0, 0
		if seen[k] {
			t.Errorf("%s: a second micro-batch count of the same layout", r.Layout)
		}
		seen[k] = true
		if r.Layout.PP > 1 && (r.Layout.Micro < r.Layout.PP || r.Plan.Time.Bubble > 0.5) {
			t.Errorf("%s: bubble %.2f", r.Layout, r.Plan.Time.Bubble)
		}
	}
	if res.Alternatives == 0 {
		t.Error("no alternative left out")
	}
	first := res.Ranked[0]
	req.Device = gpu(t, first.Plan.Memory.Total-1)
	res, err = Auto(req)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range res.Ranked {
		if r.Layout.TP == first.Layout.TP && r.Layout.PP == first.Layout.PP && r.Layout.Zero == first.Layout.Zero && r.Layout.SP == first.Layout.SP {
			if r.Layout.Micro <= first.Layout.Micro || r.Plan.Memory.Total >= first.Plan.Memory.Total {
				t.Errorf("%s after %s did not fit: %d B", r.Layout, first.Layout, r.Plan.Memory.Total)
			}
			return
		}
	}
	t.Errorf("%s with more micro-batches not ranked: %v", first.Layout, res.Ranked)
}

// TestDivisors: ascending, squares once.
func TestDivisors(t *testing.T) {
	for n, want := range map[int][]int{1: {1}, 12: {1, 2, 3, 4, 6, 12}, 16: {1, 2, 4, 8, 16}, 7: {1, 7}} {
		if got := divisors(n); !slices.Equal(got, want) {
			t.Errorf("divisors(%d) = %v, want %v", n, got, want)
		}
	}
}

// TestAutoNodes: over 2 nodes of 2 tasks, tp 4 would straddle them: it is
// invalid, and no ranked layout has it.
func TestAutoNodes(t *testing.T) {
	cfg := autoConfig(t, 4, 64, 4, 64, 8, 4)
	res, err := Auto(AutoRequest{Request: Request{Config: cfg, Vocab: 256, Nodes: 2, Device: gpu(t, 80*gib)}, TasksPerNode: 2})
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, r := range res.Invalid {
		found = found || (r.Layout.TP == 4 && strings.Contains(r.Why, "tp 4 does not divide a node's 2 tasks"))
	}
	if !found {
		t.Errorf("tp 4 over 2 nodes of 2 tasks not invalid: %v", res.Invalid)
	}
	for _, r := range res.Ranked {
		if r.Layout.TP == 4 || r.Plan.Nodes != 2 {
			t.Errorf("%s ranked on %d nodes", r.Layout, r.Plan.Nodes)
		}
	}
}

// TestAutoRecomputes: one task whose activations do not fit without
// recomputation in any number of micro-batches, but do with full
// recomputation, is given it; with memory to spare, none (the fastest:
// recomputation is extra forward work) is first.
func TestAutoRecomputes(t *testing.T) {
	cfg := autoConfig(t, 8, 256, 8, 512, 8, 1)
	req := AutoRequest{Request: Request{Config: cfg, Vocab: 256, Nodes: 1}}
	least := map[string]int64{}
	for _, rc := range []string{"", "selective", "full"} {
		for _, m := range []int{1, 2, 4, 8} {
			c := cfg
			c.Recompute, c.GradAccum, c.BatchSize = rc, m, 8/m
			p, err := New(Request{Config: c, Vocab: 256, Nodes: 1, Device: gpu(t, 80*gib)})
			if err != nil {
				t.Fatal(err)
			}
			if v, ok := least[rc]; !ok || p.Memory.Total < v {
				least[rc] = p.Memory.Total
			}
		}
	}
	if !(least["full"] < least["selective"] && least["selective"] < least[""]) {
		t.Fatalf("least memory: %v, want full < selective < none", least)
	}
	req.Device = gpu(t, least["selective"]-1)
	res, err := Auto(req)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range res.Ranked {
		if r.Layout.Recompute != "full" {
			t.Errorf("%s ranked with %d B of %d: only full recomputation fits", r.Layout, r.Plan.Memory.Total, least["selective"]-1)
		}
	}
	if f := res.Ranked[0]; !strings.Contains(f.Layout.Flags(), "--recompute full") {
		t.Errorf("first %s: flags %q lack --recompute full", f.Layout, f.Layout.Flags())
	}
	req.Device = gpu(t, 80*gib)
	if res, err = Auto(req); err != nil || res.Ranked[0].Layout.Recompute != "" {
		t.Errorf("80 GiB: first %v (%v), want no recomputation", res.Ranked[0].Layout, err)
	}
	checkSorted(t, res)
}

// Flags sets every axis, defaults included, so that a config's or a
// profile's layout cannot leak into the run it prints.
func TestLayoutFlagsEveryAxis(t *testing.T) {
	for _, c := range []struct {
		l    Layout
		want string
	}{
		{Layout{TP: 2, PP: 1, DP: 2, Micro: 2, BatchSize: 4}, "--tp 2 --pp 1 --pp-split '' --micro-batches 0 --grad-accum 2 --bsz 4 --sp=false --zero 0 --recompute none"},
		{Layout{TP: 1, PP: 2, DP: 1, SP: false, Zero: 0, Micro: 4, BatchSize: 1, Recompute: "full", Interleave: 2}, "--tp 1 --pp 2 --pp-split '' --micro-batches 4 --grad-accum 1 --bsz 1 --sp=false --zero 0 --recompute full --interleave 2"},
		{Layout{TP: 2, PP: 1, DP: 2, SP: true, Zero: 1, Micro: 1, BatchSize: 8, Recompute: "selective"}, "--tp 2 --pp 1 --pp-split '' --micro-batches 0 --grad-accum 1 --bsz 8 --sp=true --zero 1 --recompute selective"},
	} {
		if got := c.l.Flags(); got != c.want {
			t.Errorf("%s: %q, want %q", c.l, got, c.want)
		}
	}
}
