package spec

import (
	"testing"

	"github.com/hpcrun/hpcrun/train/config"
)

// Every parameter's pieces over the tp ranks hold the whole tensor once
// (a kv replica's shared rows counted on one rank), the stages of a
// pipeline hold every block once, and a tied GPT's last stage holds a
// second copy of the embedding only.
func TestParamsCoverTheModel(t *testing.T) {
	for _, c := range []struct {
		model        string
		tp, pp, kv   int
		untied, sp   bool
		layers, want int // parameters a stage list, summed over stages
	}{
		{"gpt", 2, 2, 0, false, true, 4, 0},
		{"bert", 4, 1, 0, false, false, 2, 0},
		{"llama", 4, 2, 2, false, true, 4, 0},
		{"llama", 2, 1, 1, true, false, 2, 0},
	} {
		cfg := config.DefaultConfig()
		cfg.Model, cfg.Layers, cfg.Dim, cfg.Heads, cfg.Seq, cfg.BatchSize = c.model, c.layers, 64, 8, 16, 2
		cfg.TP, cfg.PP, cfg.NTasks, cfg.SP, cfg.KVHeads, cfg.UntiedHead = c.tp, c.pp, c.tp*max(c.pp, 1), c.sp, c.kv, c.untied
		if err := cfg.Validate(); err != nil {
			t.Fatalf("%+v: %v", c, err)
		}
		var total int64
		for stage := range cfg.Stages() {
			byRank := make([][]Param, c.tp)
			for r := range c.tp {
				ps, err := Params(cfg, 300, r, stage)
				if err != nil {
					t.Fatal(err)
				}
				byRank[r] = ps
			}
			for i, p := range byRank[0] {
				var counted int64
				for r := range c.tp {
					q := byRank[r][i]
					if q.Name != p.Name || q.Shard.Index != r && !q.Shard.Replicated() {
						t.Fatalf("%s: rank %d lists %s (piece %d) where rank 0 lists %s", c.model, r, q.Name, q.Shard.Index, p.Name)
					}
					counted += int64(q.Shard.CountedLen(q.Full))
				}
				if p.Shard.Replicated() {
					counted /= int64(c.tp)
				}
				if counted != p.Elems() {
					t.Errorf("%s tp %d: %s's pieces hold %d of %d elements", c.model, c.tp, p.Name, counted, p.Elems())
				}
				total += p.Elems()
			}
		}
		n := ParamCount(cfg, 300)
		if tied := cfg.LM() && !c.untied && cfg.Stages() > 1; tied {
			vp := int64(((300 + 128*c.tp - 1) / (128 * c.tp)) * 128 * c.tp)
			n += vp * int64(cfg.Dim) // the last stage's copy of the table
		}
		if total != n {
			t.Errorf("%s tp %d pp %d: the stages list %d parameters, ParamCount says %d", c.model, c.tp, c.pp, total, n)
		}
	}
}
