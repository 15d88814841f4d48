package metrics

import (
	"bytes"
	"encoding/json"
	"errors"
	"math"
	"os"
	"strings"
	"testing"
	"time"
)

func TestWriterRoundTrip(t *testing.T) {
	dir := t.TempDir()
	w, err := Create(dir, 3)
	if err != nil {
		t.Fatal(err)
	}
	cfg, _ := json.Marshal(map[string]any{"model": "bert", "tp": 2, "ntasks": 4, "steps": 10})
	mustOK(t, w.Run(RunInfo{Config: cfg, Rank: 3, World: 4, TPRank: 1, DPRank: 1, TP: 2, DP: 2, Host: "n1", Device: "cpu", FlopsPerToken: math.NaN()}))
	mustOK(t, w.Step(Step{Step: 1, Loss: 0.69, LR: 1e-3, GradNorm: 1.5, Tokens: 512, Samples: 16, StepS: 0.25, CommS: 0.05, MemBytes: 1 << 20, MemPeakBytes: 2 << 20}))
	mustOK(t, w.Step(Step{Step: 2, Loss: math.NaN(), LR: math.Inf(1), StepS: 0.2}))
	mustOK(t, w.Eval(Eval{Step: 2, Loss: 0.6, Accuracy: math.NaN()}))
	mustOK(t, w.GPU(GPUSample{Index: 1, MemUsedBytes: 5 << 30, MemTotalBytes: 80 << 30, UtilPct: 97}))
	mustOK(t, w.End("", errors.New("boom \"quoted\"\nnext"), 1500*time.Millisecond))
	mustOK(t, w.Close())
	if err := w.Step(Step{Step: 3}); err == nil {
		t.Error("Step after Close: no error")
	}

	l, err := ReadRank(RankFile(dir, 3))
	if err != nil {
		t.Fatal(err)
	}
	if l.Rank != 3 || len(l.Problems) != 0 || l.Torn {
		t.Fatalf("rank %d problems %v torn %v", l.Rank, l.Problems, l.Torn)
	}
	if l.Info == nil || l.Info.V != Version || l.Info.TPRank != 1 || l.Info.Host != "n1" || l.Info.Start == 0 {
		t.Fatalf("run line: %+v", l.Info)
	}
	if !strings.Contains(string(l.Info.Config), `"model":"bert"`) {
		t.Errorf("config: %s", l.Info.Config)
	}
	if len(l.Steps) != 2 || l.Steps[0].Tokens != 512 || l.Steps[0].MemPeakBytes != 2<<20 || l.Steps[0].TS == 0 {
		t.Fatalf("steps: %+v", l.Steps)
	}
	if !math.IsNaN(l.Steps[1].Loss) || !math.IsNaN(l.Steps[1].LR) {
		t.Errorf("NaN/Inf loss, lr read as %v, %v; want NaN", l.Steps[1].Loss, l.Steps[1].LR)
	}
	if len(l.Evals) != 1 || !math.IsNaN(l.Evals[0].Accuracy) || l.Evals[0].Loss != 0.6 {
		t.Errorf("evals: %+v", l.Evals)
	}
	if len(l.GPU) != 1 || l.GPU[0].MemUsedBytes != 5<<30 || l.GPU[0].UtilPct != 97 {
		t.Errorf("gpu: %+v", l.GPU)
	}
	if l.End == nil || l.End.Status != StatusFailed || l.End.Error != "boom \"quoted\"\nnext" || l.End.WallS != 1.5 {
		t.Errorf("end: %+v", l.End)
	}
}

func TestWriterAppendsAndRejectsBadConfig(t *testing.T) {
	dir := t.TempDir()
	for range 2 {
		w, err := Create(dir, 0)
		if err != nil {
			t.Fatal(err)
		}
		mustOK(t, w.Step(Step{Step: 1}))
		mustOK(t, w.Close())
	}
	b, _ := os.ReadFile(RankFile(dir, 0))
	if n := bytes.Count(b, []byte("\n")); n != 2 {
		t.Errorf("after two writers: %d lines, want 2 (append)", n)
	}
	var buf bytes.Buffer
	w := NewWriter(&buf)
	if err := w.Run(RunInfo{Config: json.RawMessage(`[1,2]`)}); err == nil {
		t.Error("config that is not an object: no error")
	}
	if _, err := Create(dir, -1); err == nil {
		t.Error("negative rank: no error")
	}
}

func mustOK(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
