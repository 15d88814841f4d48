package progress

import (
	"bytes"
	"os"
	"path/filepath"
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
