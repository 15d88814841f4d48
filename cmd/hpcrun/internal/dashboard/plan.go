package dashboard

import (
	"encoding/json"
	"fmt"
	"os"

	"github.com/hpcrun/hpcrun/internal/rundir"
	"github.com/hpcrun/hpcrun/train/metrics"
	"github.com/hpcrun/hpcrun/train/plan"
)

// planRow is one line of the run page's plan against measured table.
type planRow struct {
	Key                string
	Name               string
	Planned, Measured  string
	PlannedV, MeasureV string // exact values, for the tests
	Error              string // plan.ErrorPct, as hpcrun metrics says it; "" when unknown
}

// planOf compares what hpcrun plan predicted for the run (the "plan" of
// its meta.json, when it was submitted with one) with what it measured;
// nil without a plan.
func planOf(d rundir.Dir, s metrics.Summary) []planRow {
	b, err := os.ReadFile(d.Meta())
	if err != nil {
		return nil
	}
	var m struct {
		Plan *plan.Plan `json:"plan"`
	}
	if json.Unmarshal(b, &m) != nil || m.Plan == nil {
		return nil
	}
	bytesF := func(f metrics.Float) string {
		if !f.Known() {
			return "–"
		}
		return size(int64(f))
	}
	figs := map[string]plan.Figure{}
	for _, f := range plan.Compare(m.Plan, s) {
		figs[f.Key] = f
	}
	var rows []planRow
	for _, n := range []struct {
		key, name string
		format    func(metrics.Float) string
	}{
		{"step_s", "step time (p50)", dur},
		{"comm_share", "comm share", pct},
		{"tokens_per_s", "tokens/s", num},
		{"mfu", "MFU", pct},
		{"engine_peak", "engine peak per rank", bytesF},
		{"device_total", "device memory per rank", bytesF},
	} {
		f, ok := figs[n.key]
		if !ok {
			continue // device_total: no NVML samples
		}
		r := planRow{Key: n.key, Name: n.name, Planned: n.format(f.Predicted), Measured: n.format(f.Measured),
			PlannedV: exact(f.Predicted), MeasureV: exact(f.Measured)}
		if f.ErrorPct.Known() {
			r.Error = fmt.Sprintf("%+.1f%%", float64(f.ErrorPct))
		}
		rows = append(rows, r)
	}
	return rows
}
