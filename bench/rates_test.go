package bench

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hpcrun/hpcrun/tensor"
	"github.com/hpcrun/hpcrun/train/plan"
)

// TestRateShapes: the table holds GPT small's step at bsz 8, seq 128, tp
// 1 and 2, shape for shape, each once, smallest first.
func TestRateShapes(t *testing.T) {
	shapes, err := RateShapes()
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range plan.AccuracyCases {
		cfg, err := c.Config()
		if err != nil {
			t.Fatal(err)
		}
		gs, err := plan.StepGemms(cfg, 256)
		if err != nil {
			t.Fatal(err)
		}
		for _, g := range gs {
			g.Batch = max(g.Batch, 1)
			if !slices.Contains(shapes, g.GemmShape) {
				t.Errorf("%s: %v is not measured", c.Name, g.GemmShape)
			}
		}
	}
	for i := 1; i < len(shapes); i++ {
		if shapes[i-1].Flops() > shapes[i].Flops() || slices.Contains(shapes[:i], shapes[i]) {
			t.Fatalf("shapes %v: not sorted by FLOPs, each once", shapes)
		}
	}
	if got := RateThreads(6); !slices.Equal(got, []int{1, 2, 4, 6}) {
		t.Errorf("RateThreads(6) = %v", got)
	}
}

// TestRates measures two small shapes and the bandwidth at 1 and 2
// threads, and keeps them where hpcrun plan reads them.
func TestRates(t *testing.T) {
	t.Setenv("XDG_CACHE_HOME", t.TempDir())
	shapes := []tensor.GemmShape{{M: 32, N: 48, K: 16, TransB: true}, {M: 16, N: 16, K: 8, Batch: 4}}
	var out strings.Builder
	r, err := Rates(&out, shapes, []int{1, 2}, 1, time.Millisecond, false)
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Gemms) != 4 || len(r.Stream) != 2 || r.Stream[1].Threads != 2 || r.Measured.IsZero() {
		t.Errorf("rates %+v", r)
	}
	if err := SaveRates(&out, r); err != nil {
		t.Fatal(err)
	}
	if got, err := plan.LoadCPURates(); err != nil || len(got.Gemms) != 4 {
		t.Errorf("kept %+v, %v", got, err)
	}
	if !strings.Contains(out.String(), " 2 threads: 2 shapes") || !strings.Contains(out.String(), "cpu-gemm.json") {
		t.Errorf("output %q", out.String())
	}
}
