package dashboard

import (
	"math"
	"os"
	"path/filepath"
	"testing"

	"github.com/hpcrun/hpcrun/internal/rundir"
	"github.com/hpcrun/hpcrun/train/metrics"
)

// The sampler's loss curve is metrics' own (a mean over the data-parallel
// replicas at each step every rank finished), resumes included: steps
// written again replace the old ones.
func TestSamplerMatchesMetricsAcrossAResume(t *testing.T) {
	runs := t.TempDir()
	const id = "20261123-150000-abcd"
	writeRun(t, runs, id, 4, 1, 10, false)
	// The job requeues and resumes from step 6: the ranks write 6..8 again (steps 9 and 10 of the first attempt are gone)
	// with other losses.
	dir := filepath.Join(runs, id)
	for r := range 4 {
		w, err := metrics.Create(dir, r)
		if err != nil {
			t.Fatal(err)
		}
		for s := 6; s <= 8; s++ {
			if err := w.Step(metrics.Step{Step: s, Loss: 1 + float64(s*10+r), Tokens: 256, Samples: 8, StepS: 0.1, TS: 2e9 + float64(s)}); err != nil {
				t.Fatal(err)
			}
		}
		w.Close()
	}
	run, err := metrics.ReadRun(dir)
	if err != nil {
		t.Fatal(err)
	}
	sum, want := metrics.Summarize(run)
	smp := newSampler(rundir.Dir(dir))
	if err := smp.read(); err != nil {
		t.Fatal(err)
	}
	got, _ := smp.series(sum)
	if len(got.X) != len(want.Steps) {
		t.Fatalf("sampler has %d steps, metrics %d", len(got.X), len(want.Steps))
	}
	for i := range got.X {
		if got.X[i] != float64(want.Steps[i]) || got.Y[i] != float64(want.Loss[i]) {
			t.Errorf("point %d: step %g loss %g, metrics says step %g loss %g", i, got.X[i], got.Y[i], want.Steps[i], want.Loss[i])
		}
	}
}

// A torn last line is not read until its newline comes; a long run keeps
// at most maxPoints sampled steps and its newest.
func TestSamplerTornLineAndStride(t *testing.T) {
	runs := t.TempDir()
	const id = "20261123-150000-abcd"
	writeRun(t, runs, id, 2, 1, 2000, false)
	d := rundir.Dir(filepath.Join(runs, id))
	smp := newSampler(d)
	if err := smp.read(); err != nil {
		t.Fatal(err)
	}
	sum := metrics.Summary{Config: metrics.RunConfig{TP: 2, NTasks: 2}, TokensPerS: metrics.Float(math.NaN())}
	loss, _ := smp.series(sum)
	if n := len(loss.X); n > maxPoints+1 || n < maxPoints/2 || loss.X[n-1] != 2000 || loss.X[0] != 1 {
		t.Fatalf("%d points from step %g to %g, want at most %d from 1 to 2000", n, loss.X[0], loss.X[n-1], maxPoints+1)
	}
	line := `{"type":"step","step":2001,"loss":0.5,"tokens":256,"samples":8,"step_s":0.1,"comm_s":0,"ts":3e9}`
	for r := range 2 {
		f, err := os.OpenFile(d.RankMetrics(r), os.O_APPEND|os.O_WRONLY, 0)
		if err != nil {
			t.Fatal(err)
		}
		f.WriteString(line[:40]) // torn: no newline yet
		f.Close()
	}
	smp.read()
	if l, _ := smp.series(sum); l.X[len(l.X)-1] != 2000 {
		t.Fatalf("a torn line was read: the curve ends at %g", l.X[len(l.X)-1])
	}
	for r := range 2 {
		f, _ := os.OpenFile(d.RankMetrics(r), os.O_APPEND|os.O_WRONLY, 0)
		f.WriteString(line[40:] + "\n")
		f.Close()
	}
	smp.read()
	if l, _ := smp.series(sum); l.X[len(l.X)-1] != 2001 || l.Y[len(l.Y)-1] != 0.5 {
		t.Fatalf("the completed line: curve ends at step %g loss %g, want 2001 and 0.5", l.X[len(l.X)-1], l.Y[len(l.Y)-1])
	}
}

// A pipeline's stages all see the same tokens: the throughput chart
// counts each data-parallel replica once (tp_rank 0 of the first stage),
// as metrics does, and the runs page labels the layout with its pp.
func TestSamplerPipelineThroughput(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "20261123-150000-abcd")
	for r := range 4 { // pp 2 x tp 2 x dp 1
		w, err := metrics.Create(dir, r)
		if err != nil {
			t.Fatal(err)
		}
		cfg := `{"model":"gpt","layers":2,"dim":64,"heads":4,"seq":32,"bsz":8,"steps":10,"ntasks":4,"tp":2,"pp":2,"sp":true}`
		if err := w.Run(metrics.RunInfo{Config: []byte(cfg), Rank: r, World: 4, TP: 2, DP: 1, PP: 2, TPRank: r % 2, PPRank: r / 2, Host: "n1", Device: "cpu", Start: 1e9}); err != nil {
			t.Fatal(err)
		}
		for s := 1; s <= 10; s++ {
			if err := w.Step(metrics.Step{Step: s, Loss: 3, Tokens: 256, Samples: 8, StepS: 0.1, TS: 1e9 + float64(s)}); err != nil {
				t.Fatal(err)
			}
		}
		w.Close()
	}
	run, err := metrics.ReadRun(dir)
	if err != nil {
		t.Fatal(err)
	}
	sum, _ := metrics.Summarize(run)
	smp := newSampler(rundir.Dir(dir))
	if err := smp.read(); err != nil {
		t.Fatal(err)
	}
	_, rc := smp.series(sum)
	if got, want := rc.Tokens.Series[0].Y[9], float64(sum.TokensPerS); math.Abs(got-want) > 1e-6*want {
		t.Errorf("tokens/s at the last step %g, metrics says %g", got, want)
	}
	if got := (runRow{Sum: sum}).Layout(); got != "pp 2 x tp 2 x dp 1 + sp" {
		t.Errorf("layout %q, want pp 2 x tp 2 x dp 1 + sp", got)
	}
}
