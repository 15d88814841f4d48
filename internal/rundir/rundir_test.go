package rundir

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func mkRun(t *testing.T, runsDir, execID, jobID string) Dir {
	t.Helper()
	d := Dir(filepath.Join(runsDir, execID))
	if err := os.MkdirAll(d.Path(), 0o755); err != nil {
		t.Fatal(err)
	}
	if jobID != "" {
		if err := WriteJSON(d.Meta(), map[string]string{"execid": execID, "jobid": jobID}); err != nil {
			t.Fatal(err)
		}
	}
	return d
}

func TestFindAcceptsExecIDPrefixAndJobID(t *testing.T) {
	runs := t.TempDir()
	mkRun(t, runs, "20261121-143005-a3f9", "101")
	mkRun(t, runs, "20261121-150000-b000", "102")
	mkRun(t, runs, "20261122-090000-c111", "")    // hpcrun run before its meta: still a run
	mkRun(t, runs, "20261123-090000-d222", "101") // a reused job id: the newest wins
	os.Mkdir(filepath.Join(runs, "not-a-run"), 0o755)

	for _, tc := range []struct{ ref, want string }{
		{"20261121-143005-a3f9", "20261121-143005-a3f9"},
		{"20261121-1430", "20261121-143005-a3f9"},
		{"20261122-", "20261122-090000-c111"},
		{"102", "20261121-150000-b000"},
		{"101", "20261123-090000-d222"},
	} {
		r, err := Find(runs, tc.ref)
		if err != nil {
			t.Errorf("Find(%q): %v", tc.ref, err)
			continue
		}
		if r.ExecID != tc.want || r.Dir.Path() != filepath.Join(runs, tc.want) {
			t.Errorf("Find(%q) = %s (%s), want %s", tc.ref, r.ExecID, r.Dir, tc.want)
		}
	}
}

func TestFindErrorsSayWhatToDo(t *testing.T) {
	runs := t.TempDir()
	mkRun(t, runs, "20261121-143005-a3f9", "101")
	mkRun(t, runs, "20261121-150000-b000", "102")
	for _, tc := range []struct{ ref, want string }{
		{"20261121-", "matches 2 runs"},
		{"20261121", "add the dash: 20261121-"},
		{"2026", "no run in"},
		{"2026112x", "neither an execid"},
		{"999", "hpcrun queue --all"},
		{"../x", "give an execid"},
		{"", "give an execid"},
	} {
		_, err := Find(runs, tc.ref)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Find(%q) err = %v, want it to say %q", tc.ref, err, tc.want)
		}
	}
	if _, err := Find(runs, "999"); !errors.Is(err, ErrNotFound) {
		t.Errorf("unknown ref: %v is not ErrNotFound", err)
	}
}

// Job ids start at 1 on a fresh cluster and execids with the year: a job
// id that is a prefix of every execid (2, 20, 202, 2026113) names the run of
// that job or none, never a run by execid prefix.
func TestFindSmallJobIDsAreNeverExecIDPrefixes(t *testing.T) {
	runs := t.TempDir()
	mkRun(t, runs, "20261130-100000-aaaa", "20")
	mkRun(t, runs, "20261130-110000-bbbb", "21")
	mkRun(t, runs, "20261130-120000-cccc", "2026113")
	for _, tc := range []struct{ ref, want string }{
		{"20", "20261130-100000-aaaa"},
		{"2026113", "20261130-120000-cccc"},
		{"20261130-11", "20261130-110000-bbbb"},
	} {
		if r, err := Find(runs, tc.ref); err != nil || r.ExecID != tc.want {
			t.Errorf("Find(%q) = %s, %v; want %s", tc.ref, r.ExecID, err, tc.want)
		}
	}
	for _, ref := range []string{"2", "202", "2026", "20261130", "7_1"} {
		if r, err := Find(runs, ref); !errors.Is(err, ErrNotFound) {
			t.Errorf("Find(%q) = %s, %v; want no run (a job id no run has)", ref, r.ExecID, err)
		}
	}
}

func TestListOldestFirstAndMissingDirIsEmpty(t *testing.T) {
	runs := t.TempDir()
	mkRun(t, runs, "20261122-000000-0000", "")
	mkRun(t, runs, "20261121-000000-0000", "7")
	got, err := List(runs)
	if err != nil || len(got) != 2 || got[0].ExecID != "20261121-000000-0000" || got[0].JobID != "7" {
		t.Fatalf("List = %+v, %v", got, err)
	}
	if got, err := List(filepath.Join(runs, "none")); err != nil || got != nil {
		t.Fatalf("List(missing) = %v, %v", got, err)
	}
}

func TestNewGivesUniqueSortableExecIDs(t *testing.T) {
	runs := t.TempDir()
	now := time.Date(2026, 11, 21, 14, 30, 5, 0, time.UTC)
	seen := map[string]bool{}
	for range 50 {
		d, err := New(runs, now)
		if err != nil {
			t.Fatal(err)
		}
		if !IsExecID(d.ExecID()) || !strings.HasPrefix(d.ExecID(), "20261121-143005-") || seen[d.ExecID()] {
			t.Fatalf("execid %q", d.ExecID())
		}
		seen[d.ExecID()] = true
	}
}

func TestTokenIsPrivateRandomAndNeverGuessed(t *testing.T) {
	d := Dir(t.TempDir())
	if _, err := d.ReadToken(); err == nil || !strings.Contains(err.Error(), "missing") {
		t.Fatalf("no token file: err = %v, want a clear error", err)
	}
	if err := d.WriteToken(); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(d.Token())
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("token mode %v, %v; want 0600", fi.Mode().Perm(), err)
	}
	tok, err := d.ReadToken()
	if err != nil || len(tok) != 32 {
		t.Fatalf("token %q, %v", tok, err)
	}
	if err := d.WriteToken(); err == nil {
		t.Error("a second WriteToken replaced the secret")
	}
	other := Dir(t.TempDir())
	other.WriteToken()
	if tok2, _ := other.ReadToken(); tok2 == tok {
		t.Error("two runs got the same token")
	}
	os.Chmod(d.Token(), 0o644)
	if _, err := d.ReadToken(); err == nil || !strings.Contains(err.Error(), "chmod 600") {
		t.Errorf("world-readable token: err = %v", err)
	}
	os.WriteFile(d.Token(), []byte("\n"), 0o600)
	os.Chmod(d.Token(), 0o600)
	if _, err := d.ReadToken(); err == nil {
		t.Error("empty token accepted")
	}
}

func TestLayout(t *testing.T) {
	d := Dir("/r/20261121-143005-a3f9")
	for got, want := range map[string]string{
		d.Meta():           "/r/20261121-143005-a3f9/meta.json",
		d.RankMetrics(3):   "/r/20261121-143005-a3f9/metrics/rank-00003.jsonl",
		d.Log("42", true):  "/r/20261121-143005-a3f9/slurm-42.err",
		d.Log("42", false): "/r/20261121-143005-a3f9/slurm-42.out",
		d.Ckpt():           "/r/20261121-143005-a3f9/ckpt",
		d.ExecID():         "20261121-143005-a3f9",
	} {
		if got != want {
			t.Errorf("got %s, want %s", got, want)
		}
	}
}
