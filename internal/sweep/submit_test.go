package sweep

import (
	"bytes"
	"context"
	"errors"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hpcrun/hpcrun/internal/rundir"
	"github.com/hpcrun/hpcrun/slurm"
)

// fakeExec records its submissions and answers with job ids 100, 101, ...;
// fail, when set, fails the submission of that script.
type fakeExec struct {
	subs []slurm.Submission
	fail string
}

func (*fakeExec) Name() string { return "fake" }
func (f *fakeExec) Submit(_ context.Context, s slurm.Submission) (string, string, error) {
	if s.Script == f.fail {
		return "", "", errors.New("sbatch: no")
	}
	f.subs = append(f.subs, s)
	return strconv.Itoa(100 * len(f.subs)), "", nil
}
func (*fakeExec) Queue(context.Context, bool) ([]slurm.JobInfo, error) { return nil, nil }
func (*fakeExec) Status(context.Context, slurm.JobRef) (slurm.JobInfo, error) {
	return slurm.JobInfo{}, nil
}
func (*fakeExec) Cancel(context.Context, slurm.JobRef) error { return nil }

// testSweep makes a sweep dir and two member runs (points 0 and 2 of three).
func testSweep(t *testing.T) (rundir.Dir, *State, []Member) {
	t.Helper()
	runs := t.TempDir()
	d, err := rundir.NewSweep(runs, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	st := &State{ID: d.ExecID(), Points: []Point{{Label: "tp=1", Task: 0}, {Label: "tp=3", Task: -1, Skipped: "invalid"}, {Label: "tp=2", Task: 1}}}
	var members []Member
	for _, i := range []int{0, 2} {
		dir, err := rundir.New(runs, time.Now())
		if err != nil {
			t.Fatal(err)
		}
		st.Points[i].ExecID = dir.ExecID()
		m := &slurm.Meta{ExecID: dir.ExecID()}
		if err := slurm.WriteMeta(dir, m); err != nil {
			t.Fatal(err)
		}
		members = append(members, Member{Index: i, Run: slurm.Run{Dir: dir, Meta: m}, Spec: slurm.JobSpec{Name: st.Points[i].Label, RunDir: dir.Path()}})
	}
	return d, st, members
}

// TestSubmitArray: the script is written, sweep.json exists before the
// submission, and each member gets its array task id in sweep.json and
// its meta.json, and links to the array's logs.
func TestSubmitArray(t *testing.T) {
	d, st, members := testSweep(t)
	ex := &fakeExec{}
	spec := ArraySpec(slurm.JobSpec{Name: "x"}, 2, 0, d.Path(), true, "gpt")
	jobID, err := SubmitArray(context.Background(), ex, d, st, spec, []byte("#!/bin/sh\n"), members)
	if err != nil || jobID != "100" || len(ex.subs) != 1 || ex.subs[0].Script != d.Script() || ex.subs[0].Spec.Array != "0-1" {
		t.Fatalf("SubmitArray = %q, %v; submissions %+v", jobID, err, ex.subs)
	}
	back, err := Read(d)
	if err != nil || back.JobID != "100" || back.Points[0].JobID != "100_0" || back.Points[2].JobID != "100_1" || back.Points[1].JobID != "" {
		t.Fatalf("sweep.json: %+v, %v", back, err)
	}
	m, err := slurm.ReadMeta(members[1].Run.Dir)
	if err != nil || m.JobID != "100_1" {
		t.Errorf("meta.json of the second member: %+v, %v", m, err)
	}
	if target, err := os.Readlink(members[1].Run.Dir.Log("100_1", false)); err != nil || target != d.Log("100_1", false) {
		t.Errorf("log link %q, %v", target, err)
	}
	ex.fail = d.Script()
	if _, err := SubmitArray(context.Background(), ex, d, st, spec, []byte("#!/bin/sh\n"), members); err == nil || !strings.Contains(err.Error(), "submit sweep "+st.ID+": sbatch: no") {
		t.Errorf("a failed submission: %v", err)
	}
}

// TestRunLocal runs the members one after another, each its own job, and
// stops at a submission that fails, recording why in its meta.json.
func TestRunLocal(t *testing.T) {
	d, st, members := testSweep(t)
	ex := &fakeExec{}
	var waited []string
	wait := func(_ context.Context, r slurm.Run) (slurm.JobInfo, error) {
		waited = append(waited, r.Meta.JobID)
		return slurm.JobInfo{State: slurm.Completed, Elapsed: 3 * time.Second}, nil
	}
	var w bytes.Buffer
	if err := RunLocal(context.Background(), &w, ex, d, st, members, wait); err != nil {
		t.Fatal(err)
	}
	if len(ex.subs) != 2 || ex.subs[1].Spec.Name != "tp=2" || ex.subs[1].Script != members[1].Run.Dir.Script() || strings.Join(waited, " ") != "100 200" {
		t.Errorf("submissions %+v, waited for %v", ex.subs, waited)
	}
	for _, want := range []string{"2 points one after another", "  tp=1: run " + st.Points[0].ExecID + " COMPLETED after 0:03\n", "done: hpcrun sweep show " + st.ID} {
		if !strings.Contains(w.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, w.String())
		}
	}
	if back, _ := Read(d); back.Points[2].JobID != "200" {
		t.Errorf("sweep.json: %+v", back.Points)
	}
	ex.fail = members[0].Run.Dir.Script()
	err := RunLocal(context.Background(), &w, ex, d, st, members, wait)
	if err == nil || !strings.Contains(err.Error(), "submit tp=1: sbatch: no") {
		t.Errorf("a failed submission: %v", err)
	}
	if m, _ := slurm.ReadMeta(members[0].Run.Dir); m.SubmitError != "sbatch: no" {
		t.Errorf("meta.json after a failed submission: %+v", m)
	}
}
