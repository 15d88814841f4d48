// Package sweep is a grid of training runs submitted as one Slurm job
// array: its record, sweep.json in rundir's sweep directory (State, one
// Point a grid point, with its plan and, once it runs, its execid and
// array task), the grid read from comma-separated lists (ParseAxis), the
// array's job (ArraySpec) and its submission (SubmitArray; RunLocal runs
// the points one after another instead), and the two tables: the plan of
// every point before it runs (State.WritePlan) and what each predicted
// beside what it measured (Row, WriteRows).
package sweep

import (
	"cmp"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/hpcrun/hpcrun/internal/grid"
	"github.com/hpcrun/hpcrun/internal/rundir"
	"github.com/hpcrun/hpcrun/internal/units"
	"github.com/hpcrun/hpcrun/slurm"
	"github.com/hpcrun/hpcrun/train/config"
	"github.com/hpcrun/hpcrun/train/plan"
)

// Axes are the grid's axes, in the order the points run through them:
// the training flags a sweep takes as comma-separated lists.
var Axes = []string{"preset", "tp", "bsz"}

// State is sweep.json.
type State struct {
	ID        string              `json:"sweepid"`
	Executor  string              `json:"executor"`
	JobID     string              `json:"jobid,omitempty"` // the array's job id (Slurm)
	Submitted time.Time           `json:"submit_time"`
	Grid      map[string][]string `json:"grid"`
	Auto      bool                `json:"auto,omitempty"` // plan --auto's layouts, not a grid
	Points    []Point             `json:"points"`
}

// Point is one point of the grid.
type Point struct {
	Label string `json:"point"` // e.g. "preset=tiny tp=2 bsz=8"
	// Skipped says why the point does not run ("" when it does).
	Skipped string `json:"skipped,omitempty"`
	Fits    *bool  `json:"fits,omitempty"` // nil when there is no plan
	// Task is the array task id of the point (-1 when skipped); ExecID
	// and JobID its run and job (slurm.ArrayTaskID).
	Task   int        `json:"task"`
	ExecID string     `json:"execid,omitempty"`
	JobID  string     `json:"jobid,omitempty"`
	Plan   *plan.Plan `json:"plan,omitempty"`
	// PredRank is the point's place in plan --auto's ranking (sweep --auto).
	PredRank int `json:"predicted_rank,omitempty"`
}

// Write writes sweep.json in the sweep directory d.
func Write(d rundir.Dir, st *State) error {
	return rundir.WriteJSON(d.Sweep(), st)
}

// Read reads sweep.json from the sweep directory d.
func Read(d rundir.Dir) (*State, error) {
	b, err := os.ReadFile(d.Sweep())
	if err != nil {
		return nil, err
	}
	var st State
	if err := json.Unmarshal(b, &st); err != nil {
		return nil, fmt.Errorf("%s: %w", d.Sweep(), err)
	}
	return &st, nil
}

// OfJob is the sweep under runs whose job array has the job id ref.
func OfJob(runs, ref string) (*State, bool) {
	if ref == "" {
		return nil, false
	}
	all, _ := rundir.List(rundir.Sweeps(runs))
	for _, r := range all {
		if st, err := Read(r.Dir); err == nil && st.JobID == ref {
			return st, true
		}
	}
	return nil, false
}

// Task is the point that array task id runs.
func (st *State) Task(id int) (Point, bool) {
	for _, p := range st.Points {
		if p.Task == id && p.ExecID != "" {
			return p, true
		}
	}
	return Point{}, false
}

// RunDirs are the run dirs of the points that ran, under the runs folder
// runs, those that exist.
func (st *State) RunDirs(runs string) []rundir.Dir {
	var dirs []rundir.Dir
	for _, p := range st.Points {
		if p.ExecID == "" {
			continue
		}
		if _, err := os.Stat(filepath.Join(runs, p.ExecID)); err == nil {
			dirs = append(dirs, rundir.Dir(filepath.Join(runs, p.ExecID)))
		}
	}
	return dirs
}

// ParseAxis reads the comma-separated values of axis name (flag --name):
// each once, in order; tp and bsz positive integers.
func ParseAxis(name, list string) ([]string, error) {
	var vals []string
	for _, v := range strings.Split(list, ",") {
		v = strings.TrimSpace(v)
		if v == "" {
			return nil, fmt.Errorf("--%s %q: an empty value; give a comma-separated list such as 1,2,4", name, list)
		}
		if name != "preset" {
			if n, err := strconv.Atoi(v); err != nil || n < 1 {
				return nil, fmt.Errorf("--%s %q: %q is not a positive integer", name, list, v)
			}
		}
		if !slices.Contains(vals, v) {
			vals = append(vals, v)
		}
	}
	return vals, nil
}

// MostTP is the largest tp of the grid, and whether it has a tp axis: a
// sweep's default task count.
func MostTP(grid map[string][]string) (int, bool) {
	most := 1
	for _, v := range grid["tp"] {
		n, _ := strconv.Atoi(v)
		most = max(most, n)
	}
	_, ok := grid["tp"]
	return most, ok
}

// ArraySpec is the job array of tasks points that share job: one task a
// point (at most parallel at once; 0, as Slurm allows), each running
// `hpcrun sweep task` in the sweep directory dir. A job whose name was not
// given (named false) is called sweep-<model>.
func ArraySpec(job slurm.JobSpec, tasks, parallel int, dir string, named bool, model string) slurm.JobSpec {
	job.RunDir = dir
	job.Args = []string{"sweep", "task", "--sweep-dir", dir}
	job.Array = slurm.ArrayRange(tasks, parallel)
	if !named {
		job.Name = "sweep-" + model
	}
	return job
}

// WritePlan lists the grid's points with their plan and what happens to
// each, then the notes (WriteNotes).
func (st *State) WritePlan(w io.Writer) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "POINT\tFITS\tMEM PRED\tSTEP S\tTOK/S PRED\tMFU\tRUN")
	for _, p := range st.Points {
		fits, mem, step, tok, mfu := "-", "-", "-", "-", "-"
		if p.Plan != nil {
			fits = yesNo(p.Plan.Fits)
			mem = units.Bytes(p.Plan.Memory.EnginePeak, 2) // what sweep show and metrics set beside the measured
			step = fmt.Sprintf("%.3f", p.Plan.Time.StepS)
			tok = fmt.Sprintf("%.0f", p.Plan.Time.TokensPerS)
			mfu = fmt.Sprintf("%.1f%%", 100*p.Plan.Time.MFU)
		}
		run := p.ExecID
		if p.Skipped != "" {
			run = "skipped: " + p.Skipped
		} else if run == "" {
			run = fmt.Sprintf("task %d", p.Task)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", p.Label, fits, mem, step, tok, mfu, run)
	}
	tw.Flush()
	st.WriteNotes(w)
}

// WriteNotes says what the predictions rest on: the device and rate each
// plan assumed (a default CPU rate is far from a measured one).
func (st *State) WriteNotes(w io.Writer) {
	seen := map[string]bool{}
	for _, p := range st.Points {
		if p.Plan == nil || seen[p.Plan.Device.Source] {
			continue
		}
		seen[p.Plan.Device.Source] = true
		note := "predictions for " + p.Plan.Device.Name
		if src := p.Plan.Device.Source; src != "" {
			note += " at " + src
		}
		fmt.Fprintln(w, "note: "+note)
	}
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

// LayoutPoint is the point that sets cfg's layout, every axis of it
// (sweep --auto's points): tp, pp, pp_split, micro-batches, grad-accum,
// bsz, sp, zero and recompute, so that nothing of a profile's layout leaks
// into it.
func LayoutPoint(cfg config.Config) grid.Point {
	return grid.Point{{Name: "tp", Value: strconv.Itoa(cfg.TP)}, {Name: "pp", Value: strconv.Itoa(cfg.PP)}, {Name: "pp-split", Value: cfg.PPSplit},
		{Name: "micro-batches", Value: strconv.Itoa(cfg.MicroBatches)}, {Name: "grad-accum", Value: strconv.Itoa(cfg.GradAccum)},
		{Name: "bsz", Value: strconv.Itoa(cfg.BatchSize)}, {Name: "sp", Value: strconv.FormatBool(cfg.SP)}, {Name: "zero", Value: strconv.Itoa(cfg.Zero)},
		{Name: "recompute", Value: cmp.Or(cfg.Recompute, "none")}}
}
