package rundir

import (
	"os"
	"path/filepath"
	"testing"
	"time"
)

func TestSweepLayout(t *testing.T) {
	runs := t.TempDir()
	s, err := NewSweep(runs, time.Date(2026, 11, 25, 14, 30, 5, 0, time.UTC))
	if err != nil {
		t.Fatal(err)
	}
	if got, want := filepath.Dir(s.Path()), filepath.Join(runs, "sweeps"); got != want || Sweeps(runs) != want {
		t.Errorf("sweep dir in %s (Sweeps %s), want %s", got, Sweeps(runs), want)
	}
	if !IsExecID(s.ExecID()) {
		t.Errorf("sweep id %q is not shaped like an execid", s.ExecID())
	}
	if got, want := s.Sweep(), filepath.Join(s.Path(), "sweep.json"); got != want {
		t.Errorf("Sweep() = %s, want %s", got, want)
	}
	const execID = "20261125-143006-beef"
	if got, want := s.Point(execID), Dir(filepath.Join(runs, execID)); got != want {
		t.Errorf("Point(%s) = %s, want %s", execID, got, want)
	}
	// Find sees the sweep in the sweeps folder, and not among the runs.
	if r, err := Find(Sweeps(runs), s.ExecID()[:15]); err != nil || r.Dir != s {
		t.Errorf("Find(sweeps, prefix) = %v, %v", r.Dir, err)
	}
	if all, _ := List(runs); len(all) != 0 {
		t.Errorf("the sweeps folder lists as runs: %v", all)
	}
}

func TestLinkLogs(t *testing.T) {
	runs := t.TempDir()
	s, err := NewSweep(runs, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	run := s.Point("20261125-143006-beef")
	if err := os.MkdirAll(run.Path(), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, errStream := range []bool{false, true} {
		if err := os.WriteFile(s.Log("77_1", errStream), []byte("task 1\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	// Under the task's id, then under the job's own id; again is a no-op.
	for _, id := range []string{"77_1", "78", "78"} {
		if err := LinkLogs(s, run, id, "77_1"); err != nil {
			t.Fatalf("LinkLogs(%s): %v", id, err)
		}
		for _, errStream := range []bool{false, true} {
			if b, err := os.ReadFile(run.Log(id, errStream)); err != nil || string(b) != "task 1\n" {
				t.Errorf("run's log of %s (err %v): %q, %v", id, errStream, b, err)
			}
		}
	}
	if err := LinkLogs(s, Dir(filepath.Join(runs, "gone")), "77_1", "77_1"); err == nil {
		t.Error("linking into a missing run dir says nothing")
	}
}
