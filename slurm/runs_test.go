package slurm

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestNewRunUniqueSortable(t *testing.T) {
	dir := t.TempDir()
	now := time.Date(2026, 11, 21, 14, 30, 5, 0, time.UTC)
	seen := map[string]bool{}
	for range 200 {
		id, d, err := NewRun(dir, now)
		if err != nil {
			t.Fatal(err)
		}
		if !IsExecID(id) || !strings.HasPrefix(id, "20261121-143005-") || filepath.Base(d) != id || seen[id] {
			t.Fatalf("bad or repeated execid %q (%s)", id, d)
		}
		seen[id] = true
	}
	later, _, _ := NewRun(dir, now.Add(time.Second))
	for id := range seen {
		if id >= later {
			t.Fatalf("execid %s sorts after the later %s", id, later)
		}
	}
}

func TestMetaRoundTripAndFind(t *testing.T) {
	runs := t.TempDir()
	var ids []string
	for i, job := range []string{"101", "102", "101"} {
		id, dir, err := NewRun(runs, time.Date(2026, 1, 1, 0, 0, i, 0, time.UTC))
		if err != nil {
			t.Fatal(err)
		}
		m := &Meta{ExecID: id, JobID: job, Executor: "slurm", Spec: validSpec(), SubmitTime: time.Unix(1e9, 0).UTC(), Version: "dev"}
		if err := WriteMeta(dir, m); err != nil {
			t.Fatal(err)
		}
		back, err := ReadMeta(dir)
		if err != nil || back.JobID != job || back.Spec.Name != "bert-tp2" || len(back.Spec.Args) != 3 || !back.SubmitTime.Equal(m.SubmitTime) {
			t.Fatalf("meta round trip: %+v, %v", back, err)
		}
		ids = append(ids, id)
	}
	os.Mkdir(filepath.Join(runs, "20990101-000000-ffff"), 0o755) // no meta: skipped
	list, err := ListRuns(runs)
	if err != nil || len(list) != 3 || list[0].Meta.ExecID != ids[0] {
		t.Fatalf("ListRuns = %d runs, %v", len(list), err)
	}
	if r, err := FindRun(runs, ids[1]); err != nil || r.Meta.JobID != "102" {
		t.Errorf("FindRun(execid) = %+v, %v", r, err)
	}
	if r, err := FindRun(runs, "101"); err != nil || r.Meta.ExecID != ids[2] {
		t.Errorf("FindRun(reused jobid) = %s, %v; want the newest %s", r.Meta.ExecID, err, ids[2])
	}
	for _, ref := range []string{"20300101-000000-abcd", "999", "nonsense"} {
		if _, err := FindRun(runs, ref); err == nil || !strings.Contains(err.Error(), "queue --all") {
			t.Errorf("FindRun(%q) error = %v", ref, err)
		}
	}
	if leftovers, _ := filepath.Glob(filepath.Join(runs, "*", ".meta.json.tmp*")); len(leftovers) > 0 {
		t.Errorf("temp files left: %v", leftovers)
	}
}
