package metrics

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/hpcrun/hpcrun/internal/rundir"
)

var update = flag.Bool("update", false, "rewrite the golden files under testdata/golden")

// golden compares got with testdata/golden/name, or rewrites it with -update.
func golden(t *testing.T, name string, got []byte) {
	t.Helper()
	path := filepath.Join("testdata", "golden", name)
	if *update {
		mustOK(t, os.MkdirAll(filepath.Dir(path), 0o755))
		mustOK(t, os.WriteFile(path, got, 0o644))
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test -update to create it)", err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("%s differs from the golden file (go test -update rewrites it)\ngot:\n%s\nwant:\n%s", name, got, want)
	}
}

var recordedRuns = []struct{ name, execid string }{
	{"complete-tp2", "20261121-143005-a3f9"},
	{"complete-tp1", "20261121-143210-b7e1"},
	{"complete-tp4-nvml", "20261121-143455-c0d2"},
	{"partial", "20261121-150002-d4c8"},
	{"corrupt-mixed-versions", "20261121-151533-e9f0"},
	{"pending", "20261121-160000-f1a2"},
	{"empty-files", "20261121-160100-a0b0"},
}

func TestSummaryGolden(t *testing.T) {
	for _, tt := range recordedRuns {
		t.Run(tt.name, func(t *testing.T) {
			run, err := ReadRun(filepath.Join("testdata", "runs", tt.execid))
			mustOK(t, err)
			s, c := Summarize(run)
			checkGolden(t, tt.name, s, c)
		})
	}
}

// TestReadSummaryGolden checks that the streaming reader gives the golden
// summaries too, with blocks of the default size and with blocks so small
// that lines straddle them.
func TestReadSummaryGolden(t *testing.T) {
	for _, size := range []int{0, 61} {
		for _, tt := range recordedRuns {
			t.Run(fmt.Sprintf("%s/block%d", tt.name, size), func(t *testing.T) {
				if size > 0 {
					defer setBlockSize(size)()
				}
				s, c, err := ReadSummary(filepath.Join("testdata", "runs", tt.execid), AllPoints)
				mustOK(t, err)
				checkGolden(t, tt.name, s, c)
			})
		}
	}
}

// setBlockSize makes the readers' blocks n bytes and returns the undo.
func setBlockSize(n int) func() {
	oldMax, oldMin := blockMax, blockMin
	blockMax, blockMin = n, n
	return func() { blockMax, blockMin = oldMax, oldMin }
}

func checkGolden(t *testing.T, name string, s Summary, c Curves) {
	t.Helper()
	var buf bytes.Buffer
	mustOK(t, WriteSummary(&buf, s))
	golden(t, name+".txt", buf.Bytes())
	j, err := json.MarshalIndent(struct {
		Summary Summary `json:"summary"`
		Curves  Curves  `json:"curves"`
	}{s, c}, "", "  ")
	mustOK(t, err)
	golden(t, name+".json", append(j, '\n'))
}

func TestCompareGolden(t *testing.T) {
	var ss []Summary
	for _, id := range []string{"20261121-143210-b7e1", "20261121-143005-a3f9", "20261121-143455-c0d2", "20261121-150002-d4c8"} {
		run, err := ReadRun(filepath.Join("testdata", "runs", id))
		mustOK(t, err)
		s, _ := Summarize(run)
		ss = append(ss, s)
	}
	var buf bytes.Buffer
	mustOK(t, WriteCompare(&buf, ss))
	golden(t, "compare.txt", buf.Bytes())
}

// TestRecordedFacts pins the facts the golden files show, so that a wrong
// golden file cannot be accepted with -update unnoticed.
func TestRecordedFacts(t *testing.T) {
	read := func(id string) (*Run, Summary) {
		run, err := ReadRun(filepath.Join("testdata", "runs", id))
		mustOK(t, err)
		s, _ := Summarize(run)
		return run, s
	}
	_, full := read("20261121-143005-a3f9")
	if full.Status != StatusCompleted || full.Step != 40 || full.Config.TP != 2 || full.Config.DP != 2 || full.WarmupSteps != 3 {
		t.Errorf("complete run: %+v", full)
	}
	// From the recorded lines, past the warmup: the samples of the tp-rank-0
	// ranks (one a replica) over the slowest rank's step time summed over
	// steps, and the comm time over the step time of every rank.
	samples, slowest, step, comm, commP50 := recordedRates(t, filepath.Join("testdata", "runs", "20261121-143005-a3f9"), full.WarmupSteps)
	if v, want := float64(full.SamplesPerS), samples/slowest; math.Abs(v-want) > 1e-12*want {
		t.Errorf("samples/s = %.17g, the recorded lines give %.17g", v, want)
	}
	if v, want := float64(full.CommShare), comm/step; math.Abs(v-want) > 1e-12*want {
		t.Errorf("comm share = %.17g, the recorded lines give %.17g", v, want)
	}
	if v := float64(full.CommP50S); math.Abs(v-commP50) > 1e-12*commP50 || !(v > 0) {
		t.Errorf("comm p50 = %.17g s, the recorded lines' median step gives %.17g s", v, commP50)
	}
	if full.MemorySource != "engine" || full.Memory[0].EnginePeakBytes != 38<<20 || full.MFU.Known() || !full.ModelFlopsPerS.Known() {
		t.Errorf("memory/flops: %+v", full)
	}
	_, gpu := read("20261121-143455-c0d2")
	if gpu.MemorySource != "nvml" || !gpu.MFU.Known() || gpu.Memory[3].GPUTotalBytes != 85520809984 {
		t.Errorf("gpu run: %+v", gpu)
	}
	prun, part := read("20261121-150002-d4c8")
	if part.Status != "running" || part.Step != 59 || !prun.Ranks[2].Torn || len(part.Problems) != 0 {
		t.Errorf("partial run: status %s step %d torn %v problems %v", part.Status, part.Step, prun.Ranks[2].Torn, part.Problems)
	}
	_, bad := read("20261121-151533-e9f0")
	if bad.Status != StatusFailed || !strings.HasPrefix(bad.Error, "rank 1: nccl") || len(bad.Problems) != 3 || len(bad.Versions) != 2 {
		t.Errorf("corrupt run: status %s error %q problems %q versions %v", bad.Status, bad.Error, bad.Problems, bad.Versions)
	}
	_, pend := read("20261121-160000-f1a2")
	if pend.Status != "pending" || pend.Config.Model != "gpt" || pend.TotalSteps != 200 {
		t.Errorf("pending run: %+v", pend)
	}
	_, empty := read("20261121-160100-a0b0")
	if empty.Status != "starting" || empty.Step != 0 {
		t.Errorf("empty files: %+v", empty)
	}
}

// TestRecordedRunsFound: the recorded runs answer rundir.Find, the one
// lookup every command uses, by execid, prefix and job id.
func TestRecordedRunsFound(t *testing.T) {
	root := filepath.Join("testdata", "runs")
	for ref, want := range map[string]string{
		"20261121-143005-a3f9": "20261121-143005-a3f9",
		"20261121-1432":        "20261121-143210-b7e1",
		"4243120":              "20261121-150002-d4c8", // a reused job id: the newest run
	} {
		r, err := rundir.Find(root, ref)
		if err != nil || r.ExecID != want {
			t.Errorf("Find(%q) = %s, %v; want %s", ref, r.ExecID, err, want)
			continue
		}
		if _, err := ReadRun(r.Dir.Path()); err != nil {
			t.Errorf("ReadRun(%s): %v", r.Dir, err)
		}
	}
	if _, err := ReadRun(filepath.Join(root, "nope")); !errors.Is(err, ErrNoRun) {
		t.Errorf("ReadRun of a missing run: %v", err)
	}
}

// recordedRates reads the step lines of every rank of the run in dir and
// sums, over the steps after the first warmup ones: the samples of the
// tp-rank-0 ranks, the slowest rank's step_s, and every rank's step_s and
// comm_s. A reference for Summarize written from the lines alone.
func recordedRates(t *testing.T, dir string, warmup int) (samples, slowest, step, comm, commP50 float64) {
	t.Helper()
	stepComm, stepRanks := map[int]float64{}, map[int]float64{}
	files, err := filepath.Glob(filepath.Join(dir, "metrics", "rank-*.jsonl"))
	mustOK(t, err)
	slow := map[int]float64{}
	for _, f := range files {
		b, err := os.ReadFile(f)
		mustOK(t, err)
		tpRank := -1
		for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
			var l struct {
				Type    string  `json:"type"`
				TPRank  int     `json:"tp_rank"`
				Step    int     `json:"step"`
				Samples float64 `json:"samples"`
				StepS   float64 `json:"step_s"`
				CommS   float64 `json:"comm_s"`
			}
			mustOK(t, json.Unmarshal([]byte(line), &l))
			switch {
			case l.Type == "run":
				tpRank = l.TPRank
			case l.Type == "step" && l.Step > warmup:
				if tpRank == 0 {
					samples += l.Samples
				}
				slow[l.Step] = max(slow[l.Step], l.StepS)
				step += l.StepS
				comm += l.CommS
				stepComm[l.Step] += l.CommS
				stepRanks[l.Step]++
			}
		}
	}
	for _, s := range slow {
		slowest += s
	}
	var means []float64
	for st, c := range stepComm {
		means = append(means, c/stepRanks[st])
	}
	sort.Float64s(means)
	// The lower middle of an even count, as a nearest-rank median.
	return samples, slowest, step, comm, means[(len(means)-1)/2]
}

// A stopped run is summed up by the reason of a rank that got the stop
// signal, not of one that stopped with it, whichever rank wrote first.
func TestSummaryNamesTheSignalledRank(t *testing.T) {
	dir := t.TempDir()
	for rank, reason := range []string{"step 6 of 400, checkpoint saved: " + RelayedStop, "step 6 of 400, checkpoint saved: stopped by SIGINT (Ctrl-C)"} {
		w, err := Create(dir, rank)
		if err != nil {
			t.Fatal(err)
		}
		w.End(StatusInterrupted, errors.New(reason), time.Second)
		w.Close()
	}
	s, _, err := ReadSummary(dir, 0)
	if err != nil {
		t.Fatal(err)
	}
	if s.Status != StatusInterrupted || !strings.Contains(s.Error, "stopped by SIGINT (Ctrl-C)") {
		t.Errorf("status %q, %q: want interrupted by SIGINT", s.Status, s.Error)
	}
}
