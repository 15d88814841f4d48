package progress

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestSubmitWaitBarKnowsEpochRuns: the --wait bar takes its total from the
// run's own run lines, so a run sized in epochs (steps = 0) gets a bar, not
// a spinner.
func TestSubmitWaitBarKnowsEpochRuns(t *testing.T) {
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "train.toml"), []byte("epochs = 2\nsteps = 0\nntasks = 1\ntp = 1\n"), 0o644)
	os.MkdirAll(filepath.Join(dir, "metrics"), 0o755)
	os.WriteFile(filepath.Join(dir, "metrics", "rank-00000.jsonl"), []byte(
		`{"type":"run","v":1,"rank":0,"world":1,"tp":1,"dp":1,"total_steps":40,"config":{"epochs":2,"steps":0}}`+"\n"+
			`{"type":"step","step":7,"loss":1.5,"samples":16,"step_s":0.1}`+"\n"), 0o644)
	var w bytes.Buffer
	p := New(&w, dir, false)
	if _, st, err := p.Update("RUNNING "); err != nil || p.Total() != 40 || st.Step != 7 {
		t.Fatalf("bar total %d at step %d (%v), want 40 at step 7", p.Total(), st.Step, err)
	}
	p.Close()
}

// TestEnd: a run that ended before its last step ends with the bar at
// that step, not full, and one line saying how far it got.
func TestEnd(t *testing.T) {
	dir := t.TempDir()
	os.MkdirAll(filepath.Join(dir, "metrics"), 0o755)
	os.WriteFile(filepath.Join(dir, "metrics", "rank-00000.jsonl"), []byte(
		`{"type":"run","v":1,"rank":0,"world":1,"tp":1,"dp":1,"total_steps":10,"config":{"steps":10}}`+"\n"+
			`{"type":"step","step":4,"loss":1.5,"samples":16,"step_s":0.1}`+"\n"+
			`{"type":"end","status":"interrupted","wall_s":2.5}`+"\n"), 0o644)
	var w bytes.Buffer
	p := New(&w, dir, true)
	run, st, err := p.Update("")
	if err != nil || !st.Done {
		t.Fatalf("update: %+v, %v", st, err)
	}
	s := p.End(run, st.Total)
	out := w.String()
	if s.Status != "interrupted" || !strings.Contains(out, "| (4/10)\n") || !strings.HasSuffix(out, " interrupted at step 4 of 10: loss 1.5000, 160.0 samples/s, wall 2.5 s\n") {
		t.Errorf("status %q, output:\n%q", s.Status, out)
	}
}
