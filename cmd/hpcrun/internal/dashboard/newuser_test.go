package dashboard

import (
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/hpcrun/hpcrun/internal/rundir"
	"github.com/hpcrun/hpcrun/slurm"
	"github.com/hpcrun/hpcrun/train/metrics"
)

// What a new user saw on the runs page (issue 28): "COMPLETED completed",
// "4377.8" beside "12.6k", no model, a finished check run "pending", and
// "1 runs".
func TestRunsPageReadsPlainly(t *testing.T) {
	runs := t.TempDir()
	const done, check = "20261123-150000-abcd", "20261123-150100-cccc"
	writeRun(t, runs, done, 2, 1, 10, true)
	os.MkdirAll(filepath.Join(runs, check), 0o755)
	jobs := []Job{
		{ExecID: done, Executor: "slurm", Info: slurm.JobInfo{ID: "7", State: slurm.Completed}},
		{ExecID: check, Executor: "slurm", Info: slurm.JobInfo{ID: "8", State: slurm.Completed}, Check: true},
	}
	s, err := New(Options{RunsDir: runs, Token: testToken, Jobs: func(context.Context) ([]Job, error) { return jobs, nil }})
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(s)
	defer ts.Close()
	_, body := get(t, http.DefaultClient, ts.URL+"/", tokenCookie(ts))
	for _, bad := range []string{`<span class="why">completed</span>`, "pending", "1 runs"} {
		if strings.Contains(body, bad) {
			t.Errorf("runs page says %q", bad)
		}
	}
	for _, want := range []string{"<th>model</th>", "2 runs", `gpt <span class="why">tiny</span>`} {
		if !strings.Contains(body, want) {
			t.Errorf("runs page lacks %q", want)
		}
	}
	if got := num(4377.8); got != "4.38k" {
		t.Errorf("num(4377.8) = %q, want 4.38k beside 12.6k", got)
	}
}

// The run page's plan error is the CLI's: (planned - measured) / measured
// in percent.
func TestPlanErrorAsTheCLISaysIt(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "20261123-150000-abcd")
	os.MkdirAll(dir, 0o755)
	os.WriteFile(filepath.Join(dir, "meta.json"), []byte(`{"plan":{"time":{"tokens_per_s":1000}}}`), 0o644)
	rows := planOf(rundir.Dir(dir), metrics.Summary{TokensPerS: 2500})
	found := false
	for _, r := range rows {
		if r.Key == "tokens_per_s" {
			found = true
			if r.Error != "-60.0%" {
				t.Errorf("tokens/s planned 1000, measured 2500: error %q, want -60.0%%", r.Error)
			}
		}
	}
	if !found {
		t.Errorf("no tokens/s row in %+v", rows)
	}
}

// A legend of many long names wraps into rows inside the chart, instead of
// running off its right edge.
func TestLegendWraps(t *testing.T) {
	var ss []Series
	for i := range 6 {
		ss = append(ss, Series{Name: "20261121-14321" + strconv.Itoa(i) + "-b7e1", X: []float64{1, 2}, Y: []float64{1, 2}})
	}
	svg := string(Chart{ID: "loss", Title: "loss", Series: ss}.SVG())
	for _, m := range regexp.MustCompile(`class="legend" x="(\d+)"`).FindAllStringSubmatch(svg, -1) {
		if x, _ := strconv.Atoi(m[1]); x+6*len(ss[0].Name) > chartW {
			t.Errorf("a legend entry at x %d runs past the chart's %d", x, chartW)
		}
	}
}
