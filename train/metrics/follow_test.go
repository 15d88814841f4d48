package metrics

import (
	"os"
	"path/filepath"
	"testing"
	"time"
)

func TestFollower(t *testing.T) {
	dir := t.TempDir()
	f := NewFollower(dir)
	run, err := f.Poll()
	mustOK(t, err)
	if len(run.Ranks) != 0 {
		t.Fatalf("ranks before any file: %d", len(run.Ranks))
	}
	w, err := Create(dir, 1)
	mustOK(t, err)
	mustOK(t, w.Run(RunInfo{Rank: 1, World: 1, TP: 1, DP: 1}))
	mustOK(t, w.Step(Step{Step: 1, Loss: 1}))
	run, err = f.Poll()
	mustOK(t, err)
	if len(run.Ranks) != 1 || len(run.Ranks[0].Steps) != 1 || run.Ranks[0].Rank != 1 {
		t.Fatalf("after one step: %+v", run.Ranks)
	}
	// Half a line: not a problem, kept for the next poll.
	file, err := os.OpenFile(RankFile(dir, 1), os.O_APPEND|os.O_WRONLY, 0)
	mustOK(t, err)
	_, err = file.WriteString(`{"type":"step","step":2,"lo`)
	mustOK(t, err)
	run, err = f.Poll()
	mustOK(t, err)
	if r := run.Ranks[0]; len(r.Steps) != 1 || !r.Torn || len(r.Problems) != 0 {
		t.Fatalf("torn line: steps %d torn %v problems %v", len(r.Steps), r.Torn, r.Problems)
	}
	_, err = file.WriteString("ss\":0.5}\nnot json\n")
	mustOK(t, err)
	mustOK(t, file.Close())
	mustOK(t, w.End("", nil, time.Second))
	run, err = f.Poll()
	mustOK(t, err)
	r := run.Ranks[0]
	if len(r.Steps) != 2 || r.Steps[1].Loss != 0.5 || r.Torn || r.End == nil || len(run.Problems) != 1 || run.Problems[0].Line != 4 {
		t.Fatalf("after the rest: steps %+v torn %v end %v problems %v", r.Steps, r.Torn, r.End, run.Problems)
	}
	if _, err := NewFollower(filepath.Join(dir, "nope")).Poll(); err == nil {
		t.Error("missing run: no error")
	}
}
