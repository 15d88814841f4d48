package rundir

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
)

// Run is one run directory as List and Find see it.
type Run struct {
	ExecID string
	Dir    Dir
	JobID  string // from meta.json; "" before submission, or for a run without meta
	// PastJobs are the run's earlier jobs (before it was resumed), from
	// meta.json: Find accepts them too.
	PastJobs []string
}

// ErrNotFound means no run answers to a reference.
var ErrNotFound = errors.New("no such run")

// List returns every run under runsDir, oldest first (execids sort by
// time). A missing runsDir holds no runs; folders whose names are not
// execids are not runs.
func List(runsDir string) ([]Run, error) {
	ents, err := os.ReadDir(runsDir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("runs dir: %w", err)
	}
	var runs []Run
	for _, e := range ents {
		if !e.IsDir() || !IsExecID(e.Name()) {
			continue
		}
		d := Dir(filepath.Join(runsDir, e.Name()))
		job, past := jobIDsOf(d)
		runs = append(runs, Run{ExecID: e.Name(), Dir: d, JobID: job, PastJobs: past})
	}
	sort.Slice(runs, func(i, j int) bool { return runs[i].ExecID < runs[j].ExecID })
	return runs, nil
}

// jobIDsOf reads the job id and the past job ids from a run's meta.json
// (none when it has none).
func jobIDsOf(d Dir) (string, []string) {
	b, err := os.ReadFile(d.Meta())
	if err != nil {
		return "", nil
	}
	var m struct {
		JobID    string   `json:"jobid"`
		PastJobs []string `json:"past_jobs"`
	}
	if json.Unmarshal(b, &m) != nil {
		return "", nil
	}
	return m.JobID, m.PastJobs
}

// jobIDRE is the shape of a job id: Slurm's (an array task is A_a) and the
// Local executor's and hpcrun run's (a process id).
var jobIDRE = regexp.MustCompile(`^\d+(_\d+)?$`)

// execPrefixRE is the shape of an execid prefix that Find accepts: its date
// and dash at least, so that no job id (all digits) reads as one.
var execPrefixRE = regexp.MustCompile(`^\d{8}-[0-9a-f-]*$`)

// IsJobID reports whether ref has the shape of a job id (digits, or an
// array task's A_a): Find reads such a reference as a job id only.
func IsJobID(ref string) bool { return jobIDRE.MatchString(ref) }

// Find resolves what a user typed to name a run: its execid, the job id of
// its job or of an earlier job of it (the newest run wins when a job id was
// reused), or a prefix of
// exactly one execid that includes its date (20261121-). A reference of
// digits is a job id, never a prefix: job ids start at 1 and execids with
// the year, so 2 or 2026113 would otherwise name someone else's run. Every
// command that takes a run uses it, so they all accept the same forms.
func Find(runsDir, ref string) (Run, error) {
	if ref == "" || ref == "." || ref == ".." || strings.ContainsAny(ref, `/\`) {
		return Run{}, fmt.Errorf("run %q: give an execid (like 20261121-143005-a3f9), a prefix of one with its date (20261121-1430), or a job id", ref)
	}
	runs, err := List(runsDir)
	if err != nil {
		return Run{}, err
	}
	if IsJobID(ref) {
		for i := len(runs) - 1; i >= 0; i-- {
			if runs[i].JobID == ref || slices.Contains(runs[i].PastJobs, ref) {
				return runs[i], nil
			}
		}
		hint := "hpcrun queue --all lists the runs and their job ids; --runs-dir names another folder"
		if len(ref) == 8 {
			hint = "a job id; for an execid prefix add the dash: " + ref + "-"
		}
		return Run{}, fmt.Errorf("no run in %s has job id %s (%s): %w", runsDir, ref, hint, ErrNotFound)
	}
	if !execPrefixRE.MatchString(ref) {
		return Run{}, fmt.Errorf("%q is neither an execid (like 20261121-143005-a3f9), a prefix of one with its date (20261121-1430) nor a job id (hpcrun queue --all lists the runs): %w", ref, ErrNotFound)
	}
	var prefixed []Run
	for _, r := range runs {
		if r.ExecID == ref {
			return r, nil
		}
		if strings.HasPrefix(r.ExecID, ref) {
			prefixed = append(prefixed, r)
		}
	}
	switch len(prefixed) {
	case 0:
		return Run{}, fmt.Errorf("%q is not the execid or an execid prefix of a run in %s (hpcrun queue --all lists them; --runs-dir names another folder): %w", ref, runsDir, ErrNotFound)
	case 1:
		return prefixed[0], nil
	}
	names := make([]string, 0, 4)
	for _, r := range prefixed[:min(4, len(prefixed))] {
		names = append(names, r.ExecID)
	}
	if len(prefixed) > 4 {
		names = append(names, "...")
	}
	return Run{}, fmt.Errorf("execid prefix %s matches %d runs (%s): give more characters", ref, len(prefixed), strings.Join(names, ", "))
}
