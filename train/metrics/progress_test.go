package metrics

import (
	"encoding/json"
	"math"
	"testing"
)

// TestProgressOf reads a tp 2 x dp 2 run from its ranks' last lines: the
// step is the slowest rank's, the loss the replicas' mean (tp rank 0 of
// each), the rate their samples over the slowest step; done once every
// rank ended, and the job over when meta.json has a final state first.
func TestProgressOf(t *testing.T) {
	rank := func(r, tpRank, step int, loss float64, ended bool) *RankLog {
		l := &RankLog{Rank: r, Info: &RunInfo{World: 4, TPRank: tpRank, TotalSteps: 10},
			Steps: []Step{{Step: step, Loss: loss, Samples: 8, StepS: 0.5}}}
		if ended {
			l.End = &End{Status: StatusCompleted}
		}
		return l
	}
	run := &Run{ExecID: "e", TrainConfig: json.RawMessage(`{"steps":0,"ntasks":4,"tp":2}`), Ranks: []*RankLog{
		rank(0, 0, 5, 2, true), rank(1, 1, 5, 9, true), rank(2, 0, 4, 4, false), rank(3, 1, 5, 9, true),
	}}
	p := ProgressOf(run)
	if p.Step != 4 || p.Total != 10 || p.World != 4 || p.Ended != 3 || p.Loss != 3 || p.Rate != 32 || p.Done || p.JobOver != "" {
		t.Errorf("progress %+v; want step 4 of 10, 3 of 4 ended, loss 3, 32 samples/s", p)
	}
	if d := p.Describe("e"); d != "e  loss 3.0000  32.0 samples/s" {
		t.Errorf("Describe = %q", d)
	}
	run.Meta.Raw = map[string]any{"final": map[string]any{"state": "CANCELLED"}}
	if p := ProgressOf(run); p.JobOver != "CANCELLED" {
		t.Errorf("job over: %q", p.JobOver)
	}
	run.Ranks[2].End = &End{Status: StatusCompleted}
	if p := ProgressOf(run); !p.Done || p.JobOver != "" {
		t.Errorf("every rank ended: %+v", p)
	}
	empty := ProgressOf(&Run{ExecID: "e", TrainConfig: json.RawMessage(`{"steps":7,"ntasks":2}`)})
	if empty.Total != 7 || empty.World != 2 || empty.Step != 0 || !math.IsNaN(empty.Loss) || empty.Describe("e") != "e  waiting for the first step" {
		t.Errorf("no rank yet: %+v, %q", empty, empty.Describe("e"))
	}
	if Float(math.NaN()).Text("%.1f") != "-" || Float(1.25).Text("%.1f s") != "1.2 s" {
		t.Error("Float.Text")
	}
}
