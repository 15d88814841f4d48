package plan

import (
	"bytes"
	"encoding/json"
	"math"
	"strings"
	"testing"

	"github.com/hpcrun/hpcrun/train/config"
	"github.com/hpcrun/hpcrun/train/metrics"
)

// TestCheckRun checks the rows hpcrun metrics prints: the plan kept in
// meta.json beside the summary's figures, with the error in percent of the
// measured.
func TestCheckRun(t *testing.T) {
	pl := Plan{Memory: Memory{EnginePeak: 1100, Total: 1500}, Time: Time{StepS: 0.5, CommS: 0.1, CommShare: 0.2, TokensPerS: 800}}
	b, _ := json.Marshal(pl)
	s := metrics.Summary{
		Memory:     []metrics.RankMemory{{Rank: 0, EnginePeakBytes: 900}, {Rank: 1, EnginePeakBytes: 1000}},
		StepP50S:   0.4,
		CommShare:  metrics.Float(math.NaN()),
		TokensPerS: 1000,
	}
	pc := CheckRun(b, s)
	if pc == nil {
		t.Fatal("no comparison for a meta with a plan")
	}
	want := map[string]float64{"engine peak B/rank": 10, "step s": 25, "tokens/s": -20}
	for _, r := range pc.Rows {
		w, ok := want[r.What]
		switch {
		case r.What == "comm share":
			if r.ErrorPct.Known() {
				t.Errorf("comm share unknown in the run, error %v", r.ErrorPct)
			}
		case !ok:
			t.Errorf("unexpected row %+v", r)
		case math.Abs(float64(r.ErrorPct)-w) > 1e-9:
			t.Errorf("%s: error %v%%, want %v%%", r.What, r.ErrorPct, w)
		}
	}
	if CheckRun(nil, s) != nil || CheckRun([]byte("{"), s) != nil {
		t.Error("a run without a readable plan has a comparison")
	}
	var out bytes.Buffer
	pc.WriteText(&out)
	for _, line := range []string{"engine peak B/rank             1100           1000   +10.0%", "comm share                      0.2              -        -", "tokens/s                        800           1000   -20.0%"} {
		if !strings.Contains(out.String(), line) {
			t.Errorf("table lacks %q:\n%s", line, out.String())
		}
	}
	s.Config.Device = "cuda:0"
	if pc := CheckRun(b, s); !strings.Contains(pc.Note, "the run had cuda:0") {
		t.Errorf("a CPU plan beside a GPU run: note %q", pc.Note)
	}
	var none *Check
	none.WriteText(&out) // prints nothing, does not panic
}

func planOf(t *testing.T, preset, gpu string, edit func(*config.Config)) (*Plan, Request) {
	t.Helper()
	cfg := config.DefaultConfig()
	if err := cfg.ApplyPreset(preset); err != nil {
		t.Fatal(err)
	}
	edit(&cfg)
	dev := CPU(0, 0, 0, "")
	if gpu != "" {
		var err error
		if dev, err = LookupDevice(gpu); err != nil {
			t.Fatal(err)
		}
	}
	r := Request{Config: cfg, Vocab: 30522, Device: dev, Nodes: 1}
	p, err := New(r)
	if err != nil {
		t.Fatal(err)
	}
	return p, r
}

// TestWriteText checks the plan's table: the job line names the layout,
// the memory rows their modes, a pipeline its stages and bubble, and a plan
// that does not fit says so and what would.
func TestWriteText(t *testing.T) {
	for _, c := range []struct {
		name string
		edit func(*config.Config)
		want []string
	}{
		{"sp zero", func(c *config.Config) { c.NTasks, c.TP, c.SP, c.Zero = 4, 2, true, 1 },
			[]string{"job:  4 tasks = tp 2 x dp 2 + sequence parallel + ZeRO-1 on 1 node", "sequence-parallel bufs", "ZeRO-1: this rank's 1/2", "along the sequence", "= engine peak", "fits cpu"}},
		{"pp", func(c *config.Config) { c.NTasks, c.PP, c.MicroBatches = 2, 2, 4 },
			[]string{"micro_batches 4", "pp 2 x tp 1 x dp 1", "of the stage that needs the most", "stage 0's", "2 micro-batches in flight", "pipeline stages", "point-to-point (4 transfers)", "bubble", "= 0.20", "with the bubble's waits (the comm share hpcrun metrics measures)"}},
	} {
		p, _ := planOf(t, "tiny", "", c.edit)
		var b bytes.Buffer
		if err := p.WriteText(&b, nil); err != nil {
			t.Fatal(err)
		}
		for _, w := range c.want {
			if !strings.Contains(b.String(), w) {
				t.Errorf("%s: plan lacks %q:\n%s", c.name, w, b.String())
			}
		}
	}
	p, r := planOf(t, "bert-large", "v100-16", func(c *config.Config) { c.NTasks, c.TP, c.BatchSize = 4, 1, 10 })
	sug := Suggest(r)
	var b bytes.Buffer
	p.WriteText(&b, sug)
	if !strings.Contains(b.String(), "DOES NOT FIT v100-16") || !strings.Contains(b.String(), "what would fit: --") {
		t.Errorf("a plan that does not fit:\n%s", b.String())
	}
	msg := p.Refusal(sug, "submit --force to submit it anyway")
	for _, w := range []string{"the run needs ", " over the 15.78 GiB of v100-16 (what would fit: --zero 1 (", ", --recompute selective (", ", --tp 2 (", "; submit --force to submit it anyway"} {
		if !strings.Contains(msg, w) {
			t.Errorf("refusal %q lacks %q", msg, w)
		}
	}
	if !strings.HasPrefix(WhatFits(nil), "what would fit: nothing") {
		t.Errorf("WhatFits(nil) = %q", WhatFits(nil))
	}
}

// TestPredict: a plan that fits has no suggestions, one that does not has
// Suggest's, and an unknown vocabulary is noted.
func TestPredict(t *testing.T) {
	_, r := planOf(t, "tiny", "", func(c *config.Config) {})
	p, sug, err := Predict(r, false)
	if err != nil || !p.Fits || sug != nil || !strings.Contains(strings.Join(p.Notes, " "), "vocab: at most 30522, the WordPiece vocabulary") {
		t.Errorf("tiny: %v, fits %v, %v, notes %q", err, p.Fits, sug, p.Notes)
	}
	_, r = planOf(t, "bert-large", "v100-16", func(c *config.Config) { c.NTasks, c.TP, c.BatchSize = 4, 1, 10 })
	p, sug, err = Predict(r, true)
	if err != nil || p.Fits || len(sug) == 0 || len(sug) != len(Suggest(r)) {
		t.Errorf("bert-large on a V100: %v, fits %v, %d suggestions", err, p.Fits, len(sug))
	}
	if _, _, err := Predict(Request{Config: config.Config{}}, true); err == nil {
		t.Error("an empty config plans")
	}
}
