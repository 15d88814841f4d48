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
	Error              string // (planned - measured) / measured in percent, as hpcrun metrics says it; "" when either is unknown
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
	p := m.Plan
	var enginePeak, gpuPeak int64
	for _, r := range s.Memory {
		enginePeak, gpuPeak = max(enginePeak, r.EnginePeakBytes), max(gpuPeak, r.GPUPeakBytes)
	}
	row := func(key, name string, planned, measured float64, format func(metrics.Float) string) planRow {
		r := planRow{Key: key, Name: name, Planned: format(metrics.Float(planned)), Measured: format(metrics.Float(measured)),
			PlannedV: exact(metrics.Float(planned)), MeasureV: exact(metrics.Float(measured))}
		if pf, mf := metrics.Float(planned), metrics.Float(measured); pf.Known() && mf.Known() && planned != 0 && measured != 0 {
			r.Error = fmt.Sprintf("%+.1f%%", 100*(planned-measured)/measured)
		}
		return r
	}
	bytesF := func(f metrics.Float) string { return mib(int64(f)) }
	rows := []planRow{
		row("step_s", "step time (p50)", p.Time.StepS, float64(s.StepP50S), dur),
		row("comm_share", "comm share", p.Time.CommShare, float64(s.CommShare), pct),
		row("tokens_per_s", "tokens/s", p.Time.TokensPerS, float64(s.TokensPerS), num),
		row("mfu", "MFU", p.Time.MFU, float64(s.MFU), pct),
		row("engine_peak", "engine peak per rank", float64(p.Memory.EnginePeak), float64(enginePeak), bytesF),
	}
	if gpuPeak > 0 {
		rows = append(rows, row("device_total", "device memory per rank", float64(p.Memory.Total), float64(gpuPeak), bytesF))
	}
	return rows
}
