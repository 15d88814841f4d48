package sweep

import (
	"cmp"
	"fmt"
	"io"
	"math"
	"path/filepath"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/hpcrun/hpcrun/internal/rundir"
	"github.com/hpcrun/hpcrun/internal/units"
	"github.com/hpcrun/hpcrun/train/metrics"
	"github.com/hpcrun/hpcrun/train/plan"
)

// Row is one line of hpcrun sweep show: a point's prediction beside what
// its run measured.
type Row struct {
	Point          string        `json:"point"`
	ExecID         string        `json:"execid,omitempty"`
	Fits           *bool         `json:"fits,omitempty"`
	PredMemBytes   int64         `json:"predicted_mem_bytes"` // the plan's engine peak a rank
	MeasMemBytes   int64         `json:"measured_mem_bytes"`  // the largest engine peak of a rank
	PredTokensPerS metrics.Float `json:"predicted_tokens_per_s"`
	MeasTokensPerS metrics.Float `json:"measured_tokens_per_s"`
	// PredRank and MeasRank are the point's place among the points that
	// run by predicted tokens/s (plan --auto's for sweep --auto) and by
	// measured tokens/s (0: unknown).
	PredRank  int           `json:"predicted_rank"`
	MeasRank  int           `json:"measured_rank"`
	MFU       metrics.Float `json:"mfu"` // measured, against the plan's device peak
	FinalLoss metrics.Float `json:"final_loss"`
	State     string        `json:"state"` // done, running, pending, OOM, time limit, failed (class), skipped (why)
}

// Rows reads every point's run back (Point.Row) and ranks them: by
// predicted tokens/s (a sweep --auto point keeps plan --auto's rank) and
// by measured tokens/s, among the points that run.
func (st *State) Rows(runs string, state StateFunc) []Row {
	rows := make([]Row, len(st.Points))
	pred, meas := make([]metrics.Float, len(rows)), make([]metrics.Float, len(rows))
	for i, p := range st.Points {
		rows[i] = p.Row(runs, state)
		pred[i], meas[i] = rows[i].PredTokensPerS, rows[i].MeasTokensPerS
		if p.Skipped != "" {
			pred[i] = metrics.Float(math.NaN())
		}
	}
	predRank, measRank := plan.Ranks(pred), plan.Ranks(meas)
	for i, p := range st.Points {
		rows[i].PredRank, rows[i].MeasRank = cmp.Or(p.PredRank, predRank[i]), measRank[i]
	}
	return rows
}

// StateFunc says in a word or two where the run of point p, in dir, with
// summary s, stands: done, running, pending, or how it failed.
type StateFunc func(dir rundir.Dir, p Point, s metrics.Summary) string

// Row reads the point's run back from the runs folder runs; state names
// its state.
func (p Point) Row(runs string, state StateFunc) Row {
	unknown := metrics.Float(math.NaN())
	row := Row{Point: p.Label, ExecID: p.ExecID, Fits: p.Fits, PredTokensPerS: unknown, MeasTokensPerS: unknown, MFU: unknown, FinalLoss: unknown}
	if p.Plan != nil {
		row.PredMemBytes, row.PredTokensPerS = p.Plan.Memory.EnginePeak, metrics.Float(p.Plan.Time.TokensPerS)
	}
	if p.Skipped != "" {
		row.State = "skipped (" + p.Skipped + ")"
		return row
	}
	dir := rundir.Dir(filepath.Join(runs, p.ExecID))
	s, _, err := metrics.ReadSummary(dir.Path(), metrics.NoCurves)
	if err != nil {
		row.State = "unreadable: " + OneLine(err)
		return row
	}
	for _, m := range s.Memory {
		row.MeasMemBytes = max(row.MeasMemBytes, m.EnginePeakBytes)
	}
	// The measured figures are metrics' own, MFU included (over the peak
	// of the point's plan, which its meta.json keeps).
	row.MeasTokensPerS, row.FinalLoss, row.MFU = s.TokensPerS, s.LastLoss, s.MFU
	row.State = state(dir, p, s)
	return row
}

// WriteRows prints sweep show's table of st's rows, then its notes.
func (st *State) WriteRows(w io.Writer, rows []Row) error {
	job := st.JobID
	if job == "" {
		job = "-"
	}
	fmt.Fprintf(w, "sweep %s: %s job %s, %d points\n", st.ID, st.Executor, job, len(st.Points))
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "POINT\tFITS\tMEM PRED\tMEM MEAS\tTOK/S PRED\tTOK/S MEAS\tERROR\tRANK PRED\tRANK MEAS\tMFU\tLOSS\tSTATE\tEXECID")
	num := func(v metrics.Float, format string) string {
		if !v.Known() {
			return "-"
		}
		return fmt.Sprintf(format, float64(v))
	}
	mem := func(n int64) string {
		if n <= 0 {
			return "-"
		}
		return units.Bytes(n, 2)
	}
	rank := func(n int) string {
		if n == 0 {
			return "-"
		}
		return strconv.Itoa(n)
	}
	for _, r := range rows {
		fits := "-"
		if r.Fits != nil {
			fits = yesNo(*r.Fits)
		}
		execID := r.ExecID
		if execID == "" {
			execID = "-"
		}
		tokErr := num(plan.ErrorPct(r.PredTokensPerS, r.MeasTokensPerS), "%+.1f%%")
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", r.Point, fits, mem(r.PredMemBytes), mem(r.MeasMemBytes),
			num(r.PredTokensPerS, "%.0f"), num(r.MeasTokensPerS, "%.0f"), tokErr, rank(r.PredRank), rank(r.MeasRank),
			num(100*r.MFU, "%.1f%%"), num(r.FinalLoss, "%.4f"), r.State, execID)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	st.WriteNotes(w)
	return nil
}

// OneLine is err's message on one line, as a table cell.
func OneLine(err error) string {
	return strings.Join(strings.Fields(err.Error()), " ")
}
