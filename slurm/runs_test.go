package slurm

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hpcrun/hpcrun/internal/rundir"
)

func TestMetaRoundTripAndOpenRun(t *testing.T) {
	runs := t.TempDir()
	var ids []string
	for i, job := range []string{"101", "102", "101"} {
		dir, err := rundir.New(runs, time.Date(2026, 1, 1, 0, 0, i, 0, time.UTC))
		if err != nil {
			t.Fatal(err)
		}
		id := dir.ExecID()
		m := &Meta{ExecID: id, JobID: job, Executor: "slurm", Spec: validSpec(), SubmitTime: time.Unix(1e9, 0).UTC(), Version: "dev"}
		if err := WriteMeta(dir, m); err != nil {
			t.Fatal(err)
		}
		back, err := ReadMeta(dir)
		if err != nil || back.JobID != job || back.Spec.Name != "bert-tp2" || len(back.Spec.Args) != 3 || !back.SubmitTime.Equal(m.SubmitTime) ||
			back.Spec.CPUsPerTask != m.Spec.CPUsPerTask || back.Spec.Time != m.Spec.Time {
			t.Fatalf("meta round trip: %+v, %v", back, err)
		}
		ids = append(ids, id)
	}
	os.Mkdir(filepath.Join(runs, "20990101-000000-ffff"), 0o755) // no meta: skipped
	list, err := ListRuns(runs)
	if err != nil || len(list) != 3 || list[0].Meta.ExecID != ids[0] {
		t.Fatalf("ListRuns = %d runs, %v", len(list), err)
	}
	broken := filepath.Join(runs, "20990101-000001-eeee")
	os.Mkdir(broken, 0o755)
	os.WriteFile(filepath.Join(broken, "meta.json"), []byte("{not json"), 0o644) // listed, flagged
	list, err = ListRuns(runs)
	if err != nil || len(list) != 4 || list[3].Err == nil || list[3].Meta.ExecID != "20990101-000001-eeee" {
		t.Fatalf("ListRuns with a broken meta.json = %d runs, %v", len(list), err)
	}
	os.RemoveAll(broken)
	if r, err := OpenRun(runs, ids[1]); err != nil || r.Meta.JobID != "102" {
		t.Errorf("OpenRun(execid) = %+v, %v", r, err)
	}
	if r, err := OpenRun(runs, ids[1][:17]); err != nil || r.Meta.JobID != "102" {
		t.Errorf("OpenRun(prefix) = %+v, %v", r, err)
	}
	if r, err := OpenRun(runs, "101"); err != nil || r.Meta.ExecID != ids[2] {
		t.Errorf("OpenRun(reused jobid) = %s, %v; want the newest %s", r.Meta.ExecID, err, ids[2])
	}
	for _, ref := range []string{"20300101-000000-abcd", "999", "nonsense"} {
		if _, err := OpenRun(runs, ref); err == nil || !strings.Contains(err.Error(), "queue --all") {
			t.Errorf("OpenRun(%q) error = %v", ref, err)
		}
	}
	if leftovers, _ := filepath.Glob(filepath.Join(runs, "*", ".meta.json.tmp*")); len(leftovers) > 0 {
		t.Errorf("temp files left: %v", leftovers)
	}
}

// TestBinarySHA256 hashes a file once, then answers from the cache until
// the file changes.
func TestBinarySHA256(t *testing.T) {
	t.Setenv("XDG_CACHE_HOME", t.TempDir())
	bin := filepath.Join(t.TempDir(), "prog")
	os.WriteFile(bin, []byte("one"), 0o755)
	want, _ := FileSHA256(bin)
	if got, err := BinarySHA256(bin); err != nil || got != want {
		t.Fatalf("first: %q, %v; want %q", got, err, want)
	}
	cache := filepath.Join(os.Getenv("XDG_CACHE_HOME"), "hpcrun", "binary-sha256")
	b, err := os.ReadFile(cache)
	if err != nil || !strings.HasSuffix(string(b), "\n"+want) {
		t.Fatalf("cache %q, %v", b, err)
	}
	// A cached sum is believed for the same path, size, time and inode.
	k, _, _ := strings.Cut(string(b), "\n")
	os.WriteFile(cache, []byte(k+"\n"+strings.Repeat("a", 64)), 0o644)
	if got, _ := BinarySHA256(bin); got != strings.Repeat("a", 64) {
		t.Errorf("cached: %q", got)
	}
	os.WriteFile(bin, []byte("two!"), 0o755)
	want, _ = FileSHA256(bin)
	if got, _ := BinarySHA256(bin); got != want {
		t.Errorf("after a change: %q, want %q", got, want)
	}
	if _, err := BinarySHA256(filepath.Join(t.TempDir(), "none")); err == nil {
		t.Error("a missing file has a sum")
	}
}

// FuzzReadMeta: no meta.json panics its reader, nor Find's reading of the
// job ids in it.
func FuzzReadMeta(f *testing.F) {
	f.Add([]byte(`{"execid":"20261121-143005-a3f9","jobid":"7","past_jobs":["3","5"],"executor":"slurm","final":{"jobid":"7","state":"FAILED","submit_time":"2026-11-21T14:30:05Z"}}`))
	f.Add([]byte(`{"jobid":7}`))
	f.Add([]byte(`{"past_jobs":"x","plan":{"a":1}}`))
	f.Add([]byte(`{`))
	runs := f.TempDir()
	d := rundir.Dir(filepath.Join(runs, "20261121-143005-a3f9"))
	if err := os.MkdirAll(d.Path(), 0o755); err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		if err := os.WriteFile(d.Meta(), b, 0o644); err != nil {
			t.Fatal(err)
		}
		if m, err := ReadMeta(d); err == nil && m == nil {
			t.Fatal("no meta and no error")
		}
		rundir.Find(runs, "7")
		ListRuns(runs)
	})
}
