package sweep

import (
	"bytes"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/hpcrun/hpcrun/internal/rundir"
	"github.com/hpcrun/hpcrun/slurm"
	"github.com/hpcrun/hpcrun/train/config"
	"github.com/hpcrun/hpcrun/train/metrics"
	"github.com/hpcrun/hpcrun/train/plan"
)

func TestParseAxis(t *testing.T) {
	for _, c := range []struct {
		name, list string
		want       []string
		errHas     string
	}{
		{name: "tp", list: "1, 2,4,2", want: []string{"1", "2", "4"}},
		{name: "preset", list: "tiny,bert-base", want: []string{"tiny", "bert-base"}},
		{name: "bsz", list: "8,,16", errHas: `--bsz "8,,16": an empty value`},
		{name: "tp", list: "1,x", errHas: `"x" is not a positive integer`},
		{name: "tp", list: "0", errHas: `"0" is not a positive integer`},
	} {
		got, err := ParseAxis(c.name, c.list)
		if c.errHas != "" {
			if err == nil || !strings.Contains(err.Error(), c.errHas) {
				t.Errorf("ParseAxis(%s, %q) = %v, want an error with %q", c.name, c.list, err, c.errHas)
			}
			continue
		}
		if err != nil || strings.Join(got, " ") != strings.Join(c.want, " ") {
			t.Errorf("ParseAxis(%s, %q) = %q, %v; want %q", c.name, c.list, got, err, c.want)
		}
	}
	if n, ok := MostTP(map[string][]string{"tp": {"2", "8", "4"}}); n != 8 || !ok {
		t.Errorf("MostTP = %d, %v", n, ok)
	}
	if _, ok := MostTP(map[string][]string{"bsz": {"8"}}); ok {
		t.Error("a grid without tp has a tp")
	}
}

func TestArraySpec(t *testing.T) {
	job := slurm.JobSpec{Name: "mine", NTasks: 4, RunDir: "/runs/x", Args: []string{"train"}}
	s := ArraySpec(job, 3, 2, "/runs/sweeps/s", true, "bert")
	if s.Name != "mine" || s.Array != "0-2%2" || s.RunDir != "/runs/sweeps/s" || strings.Join(s.Args, " ") != "sweep task --sweep-dir /runs/sweeps/s" || s.NTasks != 4 {
		t.Errorf("named: %+v", s)
	}
	if s := ArraySpec(job, 1, 0, "d", false, "bert"); s.Name != "sweep-bert" || s.Array != "0-0" {
		t.Errorf("unnamed: %+v", s)
	}
	if job.Args[0] != "train" {
		t.Error("ArraySpec changed the job it was given")
	}
}

// TestReadWriteFind writes a sweep.json, reads it back, finds the sweep by
// its array's job id and a point by its array task.
func TestReadWriteFind(t *testing.T) {
	runs := t.TempDir()
	d, err := rundir.NewSweep(runs, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	fits := true
	st := &State{ID: d.ExecID(), Executor: "slurm", JobID: "42", Grid: map[string][]string{"tp": {"1", "3"}}, Points: []Point{
		{Label: "tp=1", Task: 0, ExecID: "20260101-000000-aaaa", JobID: "42_0", Fits: &fits},
		{Label: "tp=3", Task: -1, Skipped: "invalid: heads"},
	}}
	if err := Write(d, st); err != nil {
		t.Fatal(err)
	}
	back, err := Read(d)
	if err != nil || back.ID != st.ID || len(back.Points) != 2 || *back.Points[0].Fits != true || back.Points[1].Skipped != "invalid: heads" {
		t.Fatalf("Read = %+v, %v", back, err)
	}
	if got, ok := OfJob(runs, "42"); !ok || got.ID != st.ID {
		t.Errorf("OfJob(42) = %v, %v", got, ok)
	}
	if _, ok := OfJob(runs, "43"); ok {
		t.Error("OfJob(43) found a sweep")
	}
	if p, ok := back.Task(0); !ok || p.Label != "tp=1" {
		t.Errorf("Task(0) = %+v, %v", p, ok)
	}
	if _, ok := back.Task(1); ok {
		t.Error("Task(1) found a point")
	}
	if dirs := back.RunDirs(runs); len(dirs) != 0 {
		t.Errorf("RunDirs before the run dir exists: %v", dirs)
	}
	os.Mkdir(filepath.Join(runs, "20260101-000000-aaaa"), 0o755)
	if dirs := back.RunDirs(runs); len(dirs) != 1 || dirs[0].ExecID() != "20260101-000000-aaaa" {
		t.Errorf("RunDirs: %v", dirs)
	}
	os.WriteFile(d.Sweep(), []byte("{"), 0o644)
	if _, err := Read(d); err == nil || !strings.Contains(err.Error(), "sweep.json") {
		t.Errorf("a bad sweep.json: %v", err)
	}
}

func testPlan(fits bool) *plan.Plan {
	p := &plan.Plan{Fits: fits, Memory: plan.Memory{EnginePeak: 3 << 20}, Time: plan.Time{StepS: 0.25, TokensPerS: 1024, MFU: 0.125}}
	p.Device.Name, p.Device.Source = "cpu", "default rate"
	return p
}

func TestWritePlan(t *testing.T) {
	st := &State{Points: []Point{
		{Label: "tp=1", Task: 0, Plan: testPlan(true)},
		{Label: "tp=2", Task: 1, ExecID: "e2", Plan: testPlan(true)},
		{Label: "tp=3", Task: -1, Skipped: "invalid: heads"},
	}}
	var b bytes.Buffer
	st.WritePlan(&b)
	want := "POINT  FITS  MEM PRED  STEP S  TOK/S PRED  MFU    RUN\n" +
		"tp=1   yes   3.00 MiB  0.250   1024        12.5%  task 0\n" +
		"tp=2   yes   3.00 MiB  0.250   1024        12.5%  e2\n" +
		"tp=3   -     -         -       -           -      skipped: invalid: heads\n" +
		"note: predictions for cpu at default rate\n"
	if b.String() != want {
		t.Errorf("plan table:\n%s\nwant:\n%s", b.String(), want)
	}
}

// TestRows reads a skipped point and a point whose run is not there, and
// prints sweep show's table.
func TestRows(t *testing.T) {
	runs := t.TempDir()
	fits := true
	st := &State{ID: "s1", Executor: "local", Points: []Point{
		{Label: "tp=1", Task: 0, ExecID: "20260101-000000-aaaa", Plan: testPlan(true), Fits: &fits},
		{Label: "tp=3", Task: -1, Skipped: "invalid: heads"},
	}}
	called := 0
	state := func(dir rundir.Dir, p Point, s metrics.Summary) string { called++; return "done" }
	skipped := st.Points[1].Row(runs, state)
	if skipped.State != "skipped (invalid: heads)" || skipped.MeasTokensPerS.Known() {
		t.Errorf("skipped: %+v", skipped)
	}
	missing := st.Points[0].Row(runs, state)
	if !strings.HasPrefix(missing.State, "unreadable: ") || called != 0 || missing.PredMemBytes != 3<<20 {
		t.Errorf("a point whose run dir is not there: %+v (state asked %d times)", missing, called)
	}
	var b bytes.Buffer
	if err := st.WriteRows(&b, []Row{missing, skipped}); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"sweep s1: local job -, 2 points\n", "POINT  FITS", "tp=1   yes   3.00 MiB  -", "note: predictions for cpu at default rate"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("show table lacks %q:\n%s", want, b.String())
		}
	}
	if !regexp.MustCompile(`(?m)^tp=3 .*skipped \(invalid: heads\) +-$`).MatchString(b.String()) {
		t.Errorf("the skipped point's line:\n%s", b.String())
	}
}

// LayoutPoint sets every axis of a layout, defaults included.
func TestLayoutPoint(t *testing.T) {
	cfg := config.DefaultConfig()
	cfg.TP, cfg.BatchSize, cfg.GradAccum = 2, 8, 2
	got := LayoutPoint(cfg).Label()
	for _, want := range []string{"tp=2", "pp=0", "micro-batches=0", "grad-accum=2", "bsz=8", "sp=false", "zero=0", "recompute=none"} {
		if !strings.Contains(got, want) {
			t.Errorf("%q lacks %q", got, want)
		}
	}
}
