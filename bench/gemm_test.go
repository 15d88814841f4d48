package bench

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/hpcrun/hpcrun/tensor"
	trainconfig "github.com/hpcrun/hpcrun/train/config"
	"github.com/hpcrun/hpcrun/train/data"
	"github.com/hpcrun/hpcrun/train/plan"
)

// TestParseGemmShape reads each form, and back from the shape's String.
func TestParseGemmShape(t *testing.T) {
	for _, c := range []struct {
		in     string
		want   tensor.GemmShape
		errHas string
	}{
		{in: "256x3072x768", want: tensor.GemmShape{M: 256, N: 3072, K: 768}},
		{in: "8x4x2:tA", want: tensor.GemmShape{M: 8, N: 4, K: 2, TransA: true}},
		{in: "8x4x2:tB", want: tensor.GemmShape{M: 8, N: 4, K: 2, TransB: true}},
		{in: "8x4x2:tAtB", want: tensor.GemmShape{M: 8, N: 4, K: 2, TransA: true, TransB: true}},
		{in: "8x4", errHas: "want MxNxK"},
		{in: "8x0x2", errHas: `"0" is not a size`},
		{in: "8x4x70000", errHas: `"70000" is not a size`},
		{in: "8x4x2:t", errHas: `suffix "t"`},
	} {
		got, err := ParseGemmShape(c.in)
		if c.errHas != "" {
			if err == nil || !strings.Contains(err.Error(), c.errHas) {
				t.Errorf("ParseGemmShape(%q) = %v, want an error with %q", c.in, err, c.errHas)
			}
			continue
		}
		if err != nil || got != c.want || got.String() != c.in {
			t.Errorf("ParseGemmShape(%q) = %+v (%s), %v; want %+v", c.in, got, got, err, c.want)
		}
	}
}

// TestGemmWithoutPeer times two small shapes once each: a row a shape,
// the peer absent, and hpcrun's median rate returned.
func TestGemmWithoutPeer(t *testing.T) {
	var b bytes.Buffer
	shapes := []tensor.GemmShape{{M: 16, N: 8, K: 4}, {M: 8, N: 16, K: 4, TransA: true, TransB: true}}
	rate, err := Gemm(&b, shapes, nil, 1, 1, time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	if !(rate > 0) {
		t.Errorf("rate %v", rate)
	}
	out := b.String()
	for _, want := range []string{"peer: OpenBLAS absent", "median of 1 alternating rounds", "\n16x8x4   ", "\n8x16x4:tAtB   ", "absent      -\n"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
}

// TestStepTiny times two steps of the tiny preset on the CPU: the model's
// FLOPs are 6 x params + 12 x layers x seq x dim a token, the count hpcrun
// plan's MFU is over, and the replayed GEMMs have a rate.
func TestStepTiny(t *testing.T) {
	cfg := trainconfig.DefaultConfig()
	if err := cfg.ApplyPreset("tiny"); err != nil {
		t.Fatal(err)
	}
	cfg.BatchSize, cfg.Seq = 2, 16
	res, err := Step(cfg, 1, 0, 2)
	if err != nil {
		t.Fatal(err)
	}
	// Two steps: the median is their mean, as bench gemm's is (it was the
	// slower of the two).
	if res.StepsMeasured != 2 || res.StepS != (res.StepSMin+res.StepSMax)/2 {
		t.Errorf("steps %d, min %v median %v max %v", res.StepsMeasured, res.StepSMin, res.StepS, res.StepSMax)
	}
	if want := (6*float64(res.Params) + 12*float64(cfg.Layers*16*cfg.Dim)) * 2 * 16; res.ModelFLOPsStep != want {
		t.Errorf("model FLOP a step %v, want %v", res.ModelFLOPsStep, want)
	}
	vocab, _, err := data.PlanVocab(cfg)
	if err != nil {
		t.Fatal(err)
	}
	p, err := plan.New(plan.Request{Config: cfg, Vocab: vocab, Device: plan.CPU(0, 8<<30, 1, "")})
	if err != nil {
		t.Fatal(err)
	}
	if got := res.ModelFLOPsStep / (2 * 16); got != p.Time.FlopsPerToken {
		t.Errorf("bench step counts %v FLOPs a token, hpcrun plan %v", got, p.Time.FlopsPerToken)
	}
	if res.GemmCalls == 0 || !(res.EngineGFLOPS > 0) {
		t.Errorf("GEMMs: %d calls at %v GFLOP/s", res.GemmCalls, res.EngineGFLOPS)
	}
	var b bytes.Buffer
	res.WriteText(&b)
	if !strings.HasPrefix(b.String(), "bench step: tiny (") || !strings.Contains(b.String(), "1 threads, cpu") {
		t.Errorf("text:\n%s", b.String())
	}
}
