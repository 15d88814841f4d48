package metrics

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// The recorded runs under testdata/runs are written by TestRecordRuns with
// -record, through the Writer, as a 4-task job would write them; the
// partial, corrupt and mixed-version ones are then cut and damaged the way
// a killed or running job leaves its files. They are checked in: the golden
// tests read them as files, not as generated data.
var record = flag.Bool("record", false, "rewrite the recorded runs under testdata/runs")

type recordSpec struct {
	execid     string
	ntasks, tp int
	steps      int
	model      string
	device     string
	gpu        bool    // record NVML samples
	stepS      float64 // steady step time of the job
	commShare  float64
	memPeak    int64 // engine peak bytes per rank
	evalEvery  int
	peakFlops  float64
	flopsPerTk float64
}

func TestRecordRuns(t *testing.T) {
	if !*record {
		t.Skip("run with -record to rewrite testdata/runs")
	}
	root := filepath.Join("testdata", "runs")
	if err := os.RemoveAll(root); err != nil {
		t.Fatal(err)
	}
	specs := []recordSpec{
		{execid: "20261121-143005-a3f9", ntasks: 4, tp: 2, steps: 40, model: "bert", device: "cpu",
			stepS: 0.142, commShare: 0.21, memPeak: 38 << 20, evalEvery: 10, flopsPerTk: 2.1e6, peakFlops: 0},
		{execid: "20261121-143210-b7e1", ntasks: 4, tp: 1, steps: 40, model: "bert", device: "cpu",
			stepS: 0.118, commShare: 0.09, memPeak: 66 << 20, evalEvery: 10, flopsPerTk: 2.1e6},
		{execid: "20261121-143455-c0d2", ntasks: 4, tp: 4, steps: 40, model: "bert", device: "cuda:0 NVIDIA H100 80GB HBM3", gpu: true,
			stepS: 0.031, commShare: 0.34, memPeak: 21 << 20, evalEvery: 10, flopsPerTk: 2.1e6, peakFlops: 989e12},
		{execid: "20261121-150002-d4c8", ntasks: 4, tp: 2, steps: 100, model: "gpt", device: "cpu",
			stepS: 0.35, commShare: 0.18, memPeak: 52 << 20, evalEvery: 25, flopsPerTk: 6.8e6},
		{execid: "20261121-151533-e9f0", ntasks: 4, tp: 2, steps: 30, model: "bert", device: "cpu",
			stepS: 0.15, commShare: 0.2, memPeak: 38 << 20, evalEvery: 10},
	}
	for i, sp := range specs {
		writeRecorded(t, root, sp, uint64(i+1))
	}
	// Partial: a running job, rank 2 one step behind with a torn last line.
	partial := filepath.Join(root, "20261121-150002-d4c8", "metrics")
	for r := range 4 {
		keep := 60
		if r == 2 {
			keep = 59
		}
		cutAfterSteps(t, filepath.Join(partial, fmt.Sprintf("rank-%05d.jsonl", r)), keep, r == 2)
	}
	// Corrupt: garbage in the middle of rank 1, a wrong-kind field in rank 0,
	// rank 3 written by an older version (config spread in the run line),
	// rank 1 failed, and a file that is not a rank file.
	corrupt := filepath.Join(root, "20261121-151533-e9f0", "metrics")
	damage(t, filepath.Join(corrupt, "rank-00001.jsonl"), 12, "\x00\x00\x00garbage{{\n")
	damage(t, filepath.Join(corrupt, "rank-00000.jsonl"), 20, `{"type":"step","step":"nineteen","loss":0.6}`+"\n")
	oldRunLine(t, filepath.Join(corrupt, "rank-00003.jsonl"))
	failEnd(t, filepath.Join(corrupt, "rank-00001.jsonl"))
	mustOK(t, os.WriteFile(filepath.Join(corrupt, "rank-old.jsonl"), []byte("hello\n"), 0o644))
	// Empty: a pending job (no metrics folder), and a job whose ranks
	// created their files but wrote nothing.
	pending := filepath.Join(root, "20261121-160000-f1a2")
	mustOK(t, os.MkdirAll(pending, 0o755))
	writeMeta(t, pending, recordSpec{execid: "20261121-160000-f1a2", ntasks: 4, tp: 2, steps: 200, model: "gpt", device: "auto"})
	empty := filepath.Join(root, "20261121-160100-a0b0")
	mustOK(t, os.MkdirAll(filepath.Join(empty, "metrics"), 0o755))
	writeMeta(t, empty, recordSpec{execid: "20261121-160100-a0b0", ntasks: 4, tp: 2, steps: 200, model: "gpt", device: "auto"})
	for r := range 4 {
		mustOK(t, os.WriteFile(RankFile(empty, r), nil, 0o644))
	}
}

func writeMeta(t *testing.T, dir string, sp recordSpec) {
	t.Helper()
	jobid := fmt.Sprint(4242000 + len(sp.execid)*int(sp.execid[len(sp.execid)-1]))
	meta := map[string]any{"execid": sp.execid, "jobid": jobid, "executor": "slurm", "host": "jean-zay1",
		"submit_time": "2026-11-21T14:30:05Z", "hpcrun_version": "0.1.0",
		"spec": map[string]any{"name": "hpcrun-" + sp.model, "ntasks": sp.ntasks}}
	b, _ := json.MarshalIndent(meta, "", "  ")
	mustOK(t, os.WriteFile(filepath.Join(dir, "meta.json"), append(b, '\n'), 0o644))
	toml := fmt.Sprintf("model = %q\nlayers = 2\ndim = 64\nheads = 4\nseq = %d\nbsz = 16\ngrad_accum = 1\nepochs = 1\nsteps = %d\nlr = 0.001\nprecision = \"fp32\"\ndata = \"synthetic\"\ndevice = %q\nntasks = %d\ntp = %d\n",
		sp.model, seqOf(sp.model), sp.steps, "auto", sp.ntasks, sp.tp)
	mustOK(t, os.WriteFile(filepath.Join(dir, "train.toml"), []byte(toml), 0o644))
}

func seqOf(model string) int {
	if model == "gpt" {
		return 128
	}
	return 32
}

func writeRecorded(t *testing.T, root string, sp recordSpec, seed uint64) {
	t.Helper()
	dir := filepath.Join(root, sp.execid)
	mustOK(t, os.MkdirAll(dir, 0o755))
	writeMeta(t, dir, sp)
	rng := rand.New(rand.NewPCG(seed, 7))
	start := 1.7634690e9 + float64(seed)*3600
	cfg, _ := json.Marshal(map[string]any{"model": sp.model, "preset": "tiny", "layers": 2, "dim": 64, "heads": 4,
		"seq": seqOf(sp.model), "bsz": 16, "grad_accum": 1, "epochs": 1, "steps": sp.steps, "lr": 0.001,
		"warmup": 10, "precision": "fp32", "data": "synthetic", "seed": 1234, "eval_every": sp.evalEvery,
		"device": "auto", "ntasks": sp.ntasks, "tp": sp.tp})
	dp := sp.ntasks / sp.tp
	for r := range sp.ntasks {
		w, err := Create(dir, r)
		mustOK(t, err)
		now := start + rng.Float64()*0.05
		w.now = func() time.Time { return time.UnixMicro(int64(now * 1e6)) }
		mustOK(t, w.Run(RunInfo{Config: cfg, Rank: r, World: sp.ntasks, TPRank: r % sp.tp, DPRank: r / sp.tp,
			TP: sp.tp, DP: dp, Host: fmt.Sprintf("r14i3n%d", r/4), Device: sp.device, TotalSteps: sp.steps,
			Params: 215_000, FlopsPerToken: sp.flopsPerTk, PeakFlops: sp.peakFlops}))
		begin := now
		dpRank := r / sp.tp
		for s := 1; s <= sp.steps; s++ {
			st := sp.stepS * (1 + 0.06*rng.NormFloat64())
			if s <= 2 {
				st *= 6 - 2*float64(s) // warm-up: caches, allocator, compilation
			}
			now += st
			// The loss is the same on the TP ranks of one replica.
			lrng := rand.New(rand.NewPCG(uint64(s), uint64(dpRank)+100*seed))
			loss := 0.69*math.Exp(-float64(s)/float64(sp.steps)*1.6) + 0.25 + 0.03*lrng.NormFloat64()
			if sp.model == "gpt" {
				loss = 5.5*math.Exp(-float64(s)/40) + 2.1 + 0.05*lrng.NormFloat64()
			}
			mem := sp.memPeak - int64(rng.IntN(1<<20)) - 4<<20
			mustOK(t, w.Step(Step{Step: s, Epoch: (s - 1) / 25, Loss: round(loss, 6), LR: 0.001 * min(1, float64(s)/10),
				GradNorm: round(1.8*math.Exp(-float64(s)/30)+0.3+0.1*rng.Float64(), 5), Tokens: int64(16 * seqOf(sp.model)), Samples: 16,
				StepS: round(st, 6), CommS: round(st*sp.commShare*(1+0.1*rng.NormFloat64()), 6), MemBytes: mem, MemPeakBytes: sp.memPeak}))
			if sp.gpu && s%5 == 0 {
				mustOK(t, w.GPU(GPUSample{Index: r, MemUsedBytes: 1<<30 + sp.memPeak*3 + int64(rng.IntN(8<<20)), MemTotalBytes: 85520809984, UtilPct: float64(60 + rng.IntN(30))}))
			}
			if sp.evalEvery > 0 && s%sp.evalEvery == 0 {
				acc := math.NaN()
				if sp.model == "bert" {
					acc = round(0.5+0.4*(1-math.Exp(-float64(s)/15))+0.01*lrng.NormFloat64(), 4)
				}
				now += sp.stepS * 2
				mustOK(t, w.Eval(Eval{Step: s, Loss: round(loss*1.05, 6), Accuracy: acc}))
			}
		}
		mustOK(t, w.End(StatusCompleted, nil, time.Duration((now-begin+0.4)*1e9)))
		mustOK(t, w.Close())
	}
}

func round(v float64, digits int) float64 {
	p := math.Pow(10, float64(digits))
	return math.Round(v*p) / p
}

// cutAfterSteps keeps the lines up to the given step (evals of that step
// too) and, when torn, half of the next line.
func cutAfterSteps(t *testing.T, path string, keep int, torn bool) {
	t.Helper()
	b, err := os.ReadFile(path)
	mustOK(t, err)
	var out []byte
	for line := range splitLines(b) {
		l, err := ParseLine(line[:len(line)-1])
		mustOK(t, err)
		if (l.Step != nil && l.Step.Step > keep) || (l.Eval != nil && l.Eval.Step > keep) || l.End != nil {
			if torn {
				out = append(out, line[:len(line)/2]...)
			}
			break
		}
		out = append(out, line...)
	}
	mustOK(t, os.WriteFile(path, out, 0o644))
}

func splitLines(b []byte) func(func([]byte) bool) {
	return func(yield func([]byte) bool) {
		for len(b) > 0 {
			i := 0
			for i < len(b) && b[i] != '\n' {
				i++
			}
			if i < len(b) {
				i++
			}
			if !yield(b[:i]) {
				return
			}
			b = b[i:]
		}
	}
}

// damage replaces line n (1-based) with text.
func damage(t *testing.T, path string, n int, text string) {
	t.Helper()
	b, err := os.ReadFile(path)
	mustOK(t, err)
	var out []byte
	i := 0
	for line := range splitLines(b) {
		i++
		if i == n {
			out = append(out, text...)
			continue
		}
		out = append(out, line...)
	}
	mustOK(t, os.WriteFile(path, out, 0o644))
}

// oldRunLine rewrites the run line as a version-0 writer did: no "v", the
// config's fields spread over the line.
func oldRunLine(t *testing.T, path string) {
	t.Helper()
	b, err := os.ReadFile(path)
	mustOK(t, err)
	var out []byte
	first := true
	for line := range splitLines(b) {
		if first {
			first = false
			var m map[string]any
			mustOK(t, json.Unmarshal(line, &m))
			cfg := m["config"].(map[string]any)
			delete(m, "config")
			delete(m, "v")
			delete(m, "flops_per_token")
			for k, v := range cfg {
				m[k] = v
			}
			nb, _ := json.Marshal(m)
			out = append(append(out, nb...), '\n')
			continue
		}
		out = append(out, line...)
	}
	mustOK(t, os.WriteFile(path, out, 0o644))
}

// failEnd turns the rank's end line into a failure.
func failEnd(t *testing.T, path string) {
	t.Helper()
	b, err := os.ReadFile(path)
	mustOK(t, err)
	var out []byte
	for line := range splitLines(b) {
		if l, err := ParseLine(line[:len(line)-1]); err == nil && l.End != nil {
			var buf bytesBuffer
			w := NewWriter(&buf)
			w.now = func() time.Time { return time.UnixMicro(int64(l.End.TS * 1e6)) }
			mustOK(t, w.End("", errors.New("nccl: all-reduce on group tp[0 1]: rank 0 did not answer within 60s"), time.Duration(l.End.WallS*1e9)))
			out = append(out, buf...)
			continue
		}
		out = append(out, line...)
	}
	mustOK(t, os.WriteFile(path, out, 0o644))
}

type bytesBuffer []byte

func (b *bytesBuffer) Write(p []byte) (int, error) { *b = append(*b, p...); return len(p), nil }
