package main

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hpcrun/hpcrun/train/metrics"
	"github.com/urfave/cli/v2"
)

var updateMetrics = flag.Bool("update", false, "rewrite golden files under testdata/metrics")

// recordedRuns are the recorded runs of the metrics package (4 ranks, tp 2).
var recordedRuns = filepath.Join("..", "..", "train", "metrics", "testdata", "runs")

func TestMetricsCommandGolden(t *testing.T) {
	// The recorded runs' jobs were on another cluster: no Slurm here is
	// asked about them (this one would not know their ids).
	t.Setenv("PATH", t.TempDir())
	tests := []struct {
		name string
		args []string
		err  string
	}{
		{name: "summary-prefix", args: []string{"metrics", "20261121-1430"}},
		{name: "summary-jobid", args: []string{"metrics", "4243120"}},
		{name: "plot", args: []string{"metrics", "--plot", "20261121-143005-a3f9"}},
		{name: "compare", args: []string{"metrics", "--compare", "20261121-143210-b7e1", "20261121-143005-a3f9", "20261121-143455-c0d2"}},
		{name: "last", args: []string{"metrics", "--last", "3"}},
		{name: "corrupt", args: []string{"metrics", "20261121-151533-e9f0"}},
		{name: "unknown", args: []string{"metrics", "19990101-000000-0000"}, err: "no such run"},
		{name: "ambiguous", args: []string{"metrics", "20261121-14"}, err: "matches 3 runs"},
		{name: "plot-flag-after", args: []string{"metrics", "20261121-143005-a3f9", "--plot"}},
		{name: "no-args", args: []string{"metrics"}, err: "usage"},
		{name: "plot-many", args: []string{"metrics", "--plot", "20261121-143005-a3f9", "20261121-143210-b7e1"}, err: "draw one run"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			out, err := runApp(t, append([]string{"--runs-dir", recordedRuns}, tt.args...)...)
			if tt.err != "" {
				if err == nil || !strings.Contains(err.Error(), tt.err) {
					t.Fatalf("error %v, want one containing %q", err, tt.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			abs, _ := filepath.Abs(recordedRuns)
			out = strings.ReplaceAll(strings.ReplaceAll(out, abs, "RUNS"), recordedRuns, "RUNS")
			path := filepath.Join("testdata", "metrics", tt.name+".txt")
			if *updateMetrics {
				if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(path, []byte(out), 0o644); err != nil {
					t.Fatal(err)
				}
				return
			}
			want, err := os.ReadFile(path)
			if err != nil {
				t.Fatalf("%v (go test -update creates it)", err)
			}
			if out != string(want) {
				t.Errorf("output differs from %s (go test -update rewrites it):\n%s", path, out)
			}
		})
	}
}

func TestMetricsJSONAndPNG(t *testing.T) {
	// The recorded runs' jobs were on another cluster: no Slurm here is
	// asked about them (this one would not know their ids).
	t.Setenv("PATH", t.TempDir())
	out, err := runApp(t, "--runs-dir", recordedRuns, "metrics", "--json", "20261121-150002-d4c8")
	if err != nil {
		t.Fatal(err)
	}
	var got struct {
		Status string `json:"status"`
		Step   int    `json:"step"`
		Curves struct {
			Loss []*float64 `json:"loss"`
		} `json:"curves"`
	}
	if err := json.Unmarshal([]byte(out), &got); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if got.Status != "running" || got.Step != 59 || len(got.Curves.Loss) != 59 {
		t.Errorf("--json: status %s step %d, %d loss points", got.Status, got.Step, len(got.Curves.Loss))
	}
	out, err = runApp(t, "--json", "--runs-dir", recordedRuns, "metrics", "--last", "2")
	var many []map[string]any
	if err != nil || json.Unmarshal([]byte(out), &many) != nil || len(many) != 2 {
		t.Errorf("--json --last 2: %v\n%s", err, out)
	}
	png := filepath.Join(t.TempDir(), "run.png")
	if _, err := runApp(t, "--runs-dir", recordedRuns, "metrics", "--png", png, "20261121-143005-a3f9"); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(png); err != nil || !bytes.HasPrefix(b, []byte("\x89PNG")) {
		t.Errorf("--png wrote no PNG: %v", err)
	}
	if _, err := runApp(t, "--runs-dir", recordedRuns, "metrics", "--png", png, "20261121-160000-f1a2"); err == nil || !strings.Contains(err.Error(), "nothing to plot") {
		t.Errorf("--png of a pending run: %v", err)
	}
}

// TestWatchFollowsToTheEnd watches a copy of the partial run while the
// remaining lines and the end lines are appended, as a running job would.
func TestWatchFollowsToTheEnd(t *testing.T) {
	runs := t.TempDir()
	src := filepath.Join(recordedRuns, "20261121-150002-d4c8")
	dst := filepath.Join(runs, "20261121-150002-d4c8")
	copyDir(t, src, dst)

	app := newApp()
	var out syncBuffer
	app.Writer, app.ErrWriter = &out, &out
	done := make(chan error, 1)
	go func() {
		done <- app.RunContext(context.Background(), []string{"hpcrun", "--runs-dir", runs, "watch", "--interval", "10ms", "20261121-150002"})
	}()
	time.Sleep(50 * time.Millisecond)
	for r := range 4 {
		f, err := os.OpenFile(metrics.RankFile(dst, r), os.O_RDWR, 0)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(f)
		if i := bytes.LastIndexByte(b, '\n'); i+1 < len(b) {
			// Finish the torn line the way the rank would have.
			if err := f.Truncate(int64(i + 1)); err != nil {
				t.Fatal(err)
			}
		}
		f.Close()
		w, err := metrics.Create(dst, r)
		if err != nil {
			t.Fatal(err)
		}
		for s := 60; s <= 100; s++ {
			w.Step(metrics.Step{Step: s, Loss: 2.5, Samples: 16, StepS: 0.35})
		}
		w.End("", nil, 40*time.Second)
		w.Close()
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(60 * time.Second): // a hang, not a speed: a busy machine takes seconds
		t.Fatal("watch did not return after every rank ended")
	}
	if s := out.String(); !strings.Contains(s, "20261121-150002-d4c8 completed at step 100 of 100: loss 2.5000") || !strings.Contains(s, "(100/100)") {
		t.Errorf("watch output:\n%s", s)
	}
}

func TestWatchErrors(t *testing.T) {
	if _, err := runApp(t, "--runs-dir", recordedRuns, "watch", "nope"); err == nil || !strings.Contains(err.Error(), "no such run") {
		t.Errorf("unknown run: %v", err)
	}
	_, err := runApp(t, "--runs-dir", recordedRuns, "watch", "20261121-151533-e9f0")
	var exit cli.ExitCoder
	if err == nil || !asExit(err, &exit) || exit.ExitCode() != 1 || !strings.Contains(err.Error(), "rank 1: nccl") {
		t.Errorf("failed run: %v", err)
	}
}

func copyDir(t *testing.T, src, dst string) {
	t.Helper()
	err := filepath.Walk(src, func(p string, info os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, p)
		if info.IsDir() {
			return os.MkdirAll(filepath.Join(dst, rel), 0o755)
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		return os.WriteFile(filepath.Join(dst, rel), b, 0o644)
	})
	if err != nil {
		t.Fatal(err)
	}
}

// syncBuffer is a bytes.Buffer safe for a writer and a reader goroutine.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// TestWatchStoppedRun: watch on a run stopped at step 22 of 60 shows the
// bar at 22 of 60, not full, and the samples/s metrics shows.
func TestWatchStoppedRun(t *testing.T) {
	runs := t.TempDir()
	dir := filepath.Join(runs, "20261125-120000-abcd")
	for r := range 2 {
		w, err := metrics.Create(dir, r)
		if err != nil {
			t.Fatal(err)
		}
		w.Run(metrics.RunInfo{Config: []byte(`{"model":"bert","steps":60,"ntasks":2,"tp":1}`), Rank: r, World: 2, TP: 1, DP: 2, DPRank: r, TotalSteps: 60})
		for s := 1; s <= 22; s++ {
			// A slow first step, as compilation and caches make it.
			w.Step(metrics.Step{Step: s, Loss: 2, Samples: 16, Tokens: 512, StepS: map[bool]float64{true: 1, false: 0.01 * float64(1+s%3)}[s == 1], TS: 1e9 + float64(s)})
		}
		w.End(metrics.StatusInterrupted, nil, 3*time.Second)
		w.Close()
	}
	sum, _, err := metrics.ReadSummary(dir, metrics.NoCurves)
	if err != nil {
		t.Fatal(err)
	}
	out, err := runApp(t, "--runs-dir", runs, "watch", "20261125-120000")
	if err != nil {
		t.Fatal(err)
	}
	rate := fmt.Sprintf("%.1f samples/s", float64(sum.SamplesPerS))
	if strings.Contains(out, "100%") || !strings.Contains(out, "(22/60)") || !strings.Contains(out, "interrupted at step 22 of 60") || !strings.Contains(out, rate) {
		t.Errorf("watch of a run stopped at 22 of 60 (metrics: %s):\n%s", rate, out)
	}
}

// TestRunByItsFolder: metrics, watch and logs take a run by its folder in
// the runs dir, as ckpt info does (runs/<execid> was refused: "give an
// execid"), and say which runs dir a folder elsewhere is not in.
func TestRunByItsFolder(t *testing.T) {
	const id = "20261121-150002-d4c8"
	want, err := runApp(t, "--runs-dir", recordedRuns, "metrics", id)
	if err != nil {
		t.Fatal(err)
	}
	abs, _ := filepath.Abs(filepath.Join(recordedRuns, id))
	for _, ref := range []string{filepath.Join(recordedRuns, id), filepath.Join(recordedRuns, id) + "/", abs} {
		if out, err := runApp(t, "--runs-dir", recordedRuns, "metrics", ref); err != nil || out != want {
			t.Errorf("metrics %s: %v\n%s\nwant the output of metrics %s:\n%s", ref, err, out, id, want)
		}
		// The recorded run has no job log: logs found the run to say so.
		if _, err := runApp(t, "--runs-dir", recordedRuns, "logs", ref); err == nil || !strings.Contains(err.Error(), "no slurm-4243120.out in") {
			t.Errorf("logs %s: %v, want the run's missing log", ref, err)
		}
	}
	_, err = runApp(t, "--runs-dir", recordedRuns, "metrics", t.TempDir())
	if err == nil || !strings.Contains(err.Error(), "is not a run's folder in the runs dir") {
		t.Errorf("metrics of a folder outside the runs dir: %v", err)
	}
}

// TestMetricsPlanLineSaysDefaultRates: a run whose plan was made with the
// default CPU rates on a busy machine says so on its plan-vs-run lines of
// time (step s, comm share, tokens/s: "+402.8%" said nothing of why), not
// on the memory's.
func TestMetricsPlanLineSaysDefaultRates(t *testing.T) {
	const id = "20261121-143005-a3f9"
	runs := t.TempDir()
	copyDir(t, filepath.Join(recordedRuns, id), filepath.Join(runs, id))
	metaPath := filepath.Join(runs, id, "meta.json")
	b, err := os.ReadFile(metaPath)
	if err != nil {
		t.Fatal(err)
	}
	var meta map[string]any
	if err := json.Unmarshal(b, &meta); err != nil {
		t.Fatal(err)
	}
	// As hpcrun plan writes it on a CPU without cpu-gemm.json, load 5.
	meta["plan"] = map[string]any{
		"device": map[string]any{"name": "cpu", "source": "default 100 GFLOP/s for 2 cores and 10 GB/s a core, not measured; 1 core a rank (1 thread)",
			"warnings": []string{"the CPU rates are not measured (defaults): run hpcrun bench gemm",
				"this machine is busy (load average 5.0 on 2 cores): the measured rates and a run's timing now are both off"}},
		"memory": map[string]any{"engine_peak_bytes": 1 << 20},
		"time":   map[string]any{"step_s": 2.0, "tokens_per_s": 100.0},
	}
	b, _ = json.Marshal(meta)
	os.WriteFile(metaPath, b, 0o644)
	out, err := runApp(t, "--runs-dir", runs, "metrics", id)
	if err != nil {
		t.Fatal(err)
	}
	const caveat = "(planned with default CPU rates, not measured: hpcrun bench gemm; planned on a busy machine (load average 5.0 on 2 cores))"
	for _, l := range strings.Split(out, "\n") {
		isTime := strings.HasPrefix(l, "step s ") || strings.HasPrefix(l, "tokens/s ") || strings.HasPrefix(l, "comm share ")
		if isTime != strings.HasSuffix(l, caveat) {
			t.Errorf("line %q: want the caveat on the time lines alone", l)
		}
	}
	if !strings.Contains(out, "plan vs run") {
		t.Errorf("no plan-vs-run table:\n%s", out)
	}
}
