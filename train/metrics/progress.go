package metrics

import (
	"encoding/json"
	"fmt"
	"math"
)

// Progress is how far a run got, from its ranks' last lines only: what
// hpcrun watch's bar shows.
type Progress struct {
	Step, Total  int     // the slowest rank's last step, of the steps the run takes (0: not known)
	World, Ended int     // ranks, and those that wrote their end line
	Loss, Rate   float64 // the replicas' mean last loss; samples/s of the job at the last step (NaN: none yet)
	Done         bool    // every rank ended
	JobOver      string  // the scheduler's final state when meta.json has one and not every rank ended
}

// ProgressOf reads run's progress.
func ProgressOf(run *Run) Progress {
	st := Progress{Loss: math.NaN(), Rate: math.NaN()}
	var cfg struct {
		Steps  int `json:"steps"`
		NTasks int `json:"ntasks"`
	}
	if len(run.TrainConfig) > 0 {
		_ = json.Unmarshal(run.TrainConfig, &cfg)
	}
	st.Total, st.World = cfg.Steps, cfg.NTasks
	grid := runConfig(run, firstInfo(run))
	step := -1
	var lossSum, samples float64
	var lossN int
	var slowest float64
	for _, r := range run.Ranks {
		if r.Info != nil {
			if st.Total <= 0 {
				st.Total = r.Info.TotalSteps
			}
			if r.Info.World > 0 {
				st.World = r.Info.World
			}
		}
		if r.End != nil {
			st.Ended++
		}
		if len(r.Steps) == 0 {
			step = 0
			continue
		}
		last := r.Steps[len(r.Steps)-1]
		if step < 0 || last.Step < step {
			step = last.Step
		}
		slowest = max(slowest, last.StepS)
		if CountsReplica(r.Rank, r.Info, grid) {
			lossSum += last.Loss
			lossN++
			samples += float64(last.Samples)
		}
	}
	st.Step = max(step, 0)
	if lossN > 0 {
		st.Loss = lossSum / float64(lossN)
	}
	if slowest > 0 {
		st.Rate = samples / slowest
	}
	if st.World <= 0 {
		st.World = len(run.Ranks)
	}
	st.Done = st.World > 0 && st.Ended >= st.World
	if final, ok := run.Meta.Raw["final"].(map[string]any); ok && !st.Done {
		if state, _ := final["state"].(string); state != "" {
			st.JobOver = state
		} else {
			st.JobOver = "ended"
		}
	}
	return st
}

// Describe is the bar's words: the run, its loss and rate, or that it
// waits for its first step.
func (st Progress) Describe(execid string) string {
	if st.Step == 0 && math.IsNaN(st.Loss) {
		return execid + "  waiting for the first step"
	}
	return fmt.Sprintf("%s  loss %s  %s samples/s", execid, Float(st.Loss).Text("%.4f"), Float(st.Rate).Text("%.1f"))
}

// Text writes f with format, "-" when it is unknown.
func (f Float) Text(format string) string {
	if !f.Known() {
		return "-"
	}
	return fmt.Sprintf(format, float64(f))
}
