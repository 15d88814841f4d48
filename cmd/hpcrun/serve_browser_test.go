package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/hpcrun/hpcrun/internal/rundir"
	"github.com/hpcrun/hpcrun/slurm"
)

// failureRuns are the runs recorded for the failure classifier, with the
// final job state in their meta.json.
var failureRuns = filepath.Join("internal", "failure", "testdata")

// chromium is the browser the dashboard tests drive: Debian's chromium,
// installed by .ci/run. Without it the tests skip, unless
// HPCRUN_REQUIRE_CHROMIUM=1 (CI) makes that a failure.
func chromium(t *testing.T) string {
	t.Helper()
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	if os.Getenv("HPCRUN_REQUIRE_CHROMIUM") == "1" {
		t.Fatal("chromium not found and HPCRUN_REQUIRE_CHROMIUM=1: install it (apt-get install chromium)")
	}
	t.Skip("chromium not installed (apt-get install chromium): the dashboard's browser tests are skipped")
	return ""
}

// serveRuns is a runs dir for the dashboard: the metrics package's recorded
// runs, the failure classifier's, and one running run (a recorded run cut
// in the middle of its steps, its launcher this test process) whose rank
// files the test can grow. It returns the dir, the running run's execid
// and, for each of its rank files, the lines still to append.
func serveRuns(t *testing.T) (dir, running string, rest map[string][]byte) {
	t.Helper()
	dir = t.TempDir()
	copyDir(t, recordedRuns, dir)
	ents, err := os.ReadDir(failureRuns)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		if !e.IsDir() {
			continue
		}
		m, err := slurm.ReadMeta(rundir.Dir(filepath.Join(failureRuns, e.Name())))
		if err != nil {
			t.Fatal(err)
		}
		copyDir(t, filepath.Join(failureRuns, e.Name()), filepath.Join(dir, m.ExecID))
	}
	// The running run: recorded run c0d2, half its lines, started by hpcrun
	// run on this host with this process as its launcher.
	running = "20261123-120000-5eed"
	src := filepath.Join(recordedRuns, "20261121-143455-c0d2")
	d := rundir.Dir(filepath.Join(dir, running))
	copyDir(t, src, d.Path())
	m, err := slurm.ReadMeta(d)
	if err != nil {
		t.Fatal(err)
	}
	m.ExecID, m.Executor, m.JobID, m.Host, m.Final = running, "run", strconv.Itoa(os.Getpid()), slurm.Host(), nil
	m.SubmitTime = time.Now()
	if err := slurm.WriteMeta(d, m); err != nil {
		t.Fatal(err)
	}
	rest = map[string][]byte{}
	files, _ := d.MetricsFiles()
	for _, p := range files {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		lines := bytes.SplitAfter(b, []byte("\n"))
		half := len(lines) / 2
		if err := os.WriteFile(p, bytes.Join(lines[:half], nil), 0o644); err != nil {
			t.Fatal(err)
		}
		rest[p] = bytes.Join(lines[half:], nil)
	}
	return dir, running, rest
}

// startServe runs hpcrun serve in-process on a free port and returns the
// URL it printed (with its token).
func startServe(t *testing.T, runsDir, token string) string {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	pr, pw := io.Pipe()
	app := newApp()
	app.Writer, app.ErrWriter = pw, io.Discard
	done := make(chan error, 1)
	go func() {
		done <- app.RunContext(ctx, []string{"hpcrun", "serve", "--runs-dir", runsDir, "--addr", "127.0.0.1:0", "--token", token})
		pw.Close()
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("serve: %v", err)
			}
		case <-time.After(10 * time.Second):
			t.Errorf("serve did not stop within 10 s of its context's end")
		}
	})
	line, err := bufio.NewReader(pr).ReadString('\n')
	if err != nil {
		t.Fatalf("serve printed no URL: %v", err)
	}
	go io.Copy(io.Discard, pr)
	for _, f := range strings.Fields(line) {
		if strings.HasPrefix(f, "http://") {
			return f
		}
	}
	t.Fatalf("serve's first line has no URL: %q", line)
	return ""
}

// metricsJSON is hpcrun metrics --json of one run, as a generic object.
func metricsOf(t *testing.T, runsDir, execID string) map[string]any {
	t.Helper()
	app := newApp()
	var out bytes.Buffer
	app.Writer, app.ErrWriter = &out, io.Discard
	if err := app.Run([]string{"hpcrun", "metrics", "--runs-dir", runsDir, "--json", execID}); err != nil {
		t.Fatalf("metrics --json %s: %v", execID, err)
	}
	var m map[string]any
	if err := json.Unmarshal(out.Bytes(), &m); err != nil {
		t.Fatal(err)
	}
	return m
}

// sameNumber compares a page's data-value with a JSON figure: "" is null.
func sameNumber(page string, want any) bool {
	if want == nil {
		return page == ""
	}
	got, err := strconv.ParseFloat(page, 64)
	w, ok := want.(float64)
	return err == nil && ok && (got == w || math.Abs(got-w) <= 1e-12*math.Abs(w))
}

// values reads the data-value (else the text) of every element with a
// data-key under the elements sel selects, by key.
func values(ctx context.Context, t *testing.T, sel string) map[string]string {
	t.Helper()
	js := fmt.Sprintf(`(() => { const o = {}; document.querySelectorAll(%q).forEach(e => { if (!(e.dataset.key in o)) o[e.dataset.key] = e.dataset.value ?? e.textContent.trim(); }); return o; })()`, sel+" [data-key]")
	v, err := chromedp.Run(ctx, chromedp.Evaluate[map[string]string](js))
	if err != nil {
		t.Fatalf("values of %s: %v", sel, err)
	}
	return v
}

// attr is an attribute of the first element sel selects.
func attr(ctx context.Context, t *testing.T, sel, name string) string {
	t.Helper()
	r, err := chromedp.Run(ctx, chromedp.AttributeValue(chromedp.CSS(sel), name))
	if err != nil {
		t.Fatalf("%s of %s: %v", name, sel, err)
	}
	return r.Value
}

// do runs browser steps, failing the test on an error.
func do(ctx context.Context, t *testing.T, what string, steps ...chromedp.Action[chromedp.Void]) {
	t.Helper()
	if err := chromedp.Do(ctx, steps...); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

// shoot saves a screenshot of the whole page as dir/name.png.
func shoot(ctx context.Context, t *testing.T, dir, name string) {
	t.Helper()
	png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatalf("screenshot %s: %v", name, err)
	}
	p := filepath.Join(dir, name+".png")
	if err := os.WriteFile(p, png, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("screenshot %s", p)
}

func location(ctx context.Context, t *testing.T) string {
	t.Helper()
	loc, err := chromedp.Run(ctx, chromedp.Location())
	if err != nil {
		t.Fatal(err)
	}
	return loc
}

func count(ctx context.Context, t *testing.T, sel string) int {
	t.Helper()
	n, err := chromedp.Run(ctx, chromedp.Evaluate[int](fmt.Sprintf(`document.querySelectorAll(%q).length`, sel)))
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// TestServeInBrowser opens every page of hpcrun serve in headless chromium
// and checks what it shows against hpcrun metrics --json and hpcrun queue,
// that a running run's charts grow as its rank files do, and that a wrong
// token is refused. Screenshots go to the test's temp dir (or to
// $HPCRUN_SCREENSHOTS).
func TestServeInBrowser(t *testing.T) {
	exe := chromium(t)
	runsDir, running, rest := serveRuns(t)
	const token = "0123456789abcdef0123456789abcdef"
	url := startServe(t, runsDir, token)
	base := strings.TrimSuffix(url, "/?token="+token)
	shots := os.Getenv("HPCRUN_SCREENSHOTS")
	if shots == "" {
		shots = t.TempDir()
	}

	// Without the token, or with a wrong one: refused before any page.
	for _, u := range []string{base + "/", base + "/run/" + running, base + "/?token=wrong" + token[5:], base + "/events/" + running, base + "/static/app.js"} {
		resp, err := http.Get(u)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusForbidden {
			t.Errorf("GET %s without the token: %s, want 403", u, resp.Status)
		}
	}

	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(exe), chromedp.NoSandbox, chromedp.DisableGPU, chromedp.NoFirstRun,
		chromedp.Flag("disable-background-networking", true), chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true), chromedp.WindowSize(1280, 1000))
	actx, cancelA := chromedp.NewExecAllocator(context.Background(), opts...)
	defer cancelA()
	bctx, cancel := chromedp.NewContext(actx)
	defer cancel()
	do(bctx, t, "start chromium") // no timeout on the first call: it owns the browser
	ctx, cancelT := context.WithTimeout(bctx, 90*time.Second)
	defer cancelT()

	do(ctx, t, "wrong token", chromedp.Navigate(base+"/?token=nottheone-nottheone"))
	if refused, err := chromedp.Run(ctx, chromedp.Text(chromedp.CSS("body"))); err != nil || !strings.Contains(refused, "forbidden") {
		t.Errorf("a wrong token shows %q (%v), want a refusal", refused, err)
	}
	shoot(ctx, t, shots, "refused")

	// The runs page: the token once, then the cookie.
	do(ctx, t, "runs page", chromedp.Navigate(url), chromedp.WaitVisible(chromedp.ID("runs")))
	shoot(ctx, t, shots, "runs")
	if loc := location(ctx, t); strings.Contains(loc, "token") {
		t.Errorf("the token stays in the address bar: %s", loc)
	}
	all, err := rundir.List(runsDir)
	if err != nil {
		t.Fatal(err)
	}
	if n := count(ctx, t, "#runs tbody tr[data-execid]"); n != len(all) {
		t.Errorf("runs page lists %d runs, want %d", n, len(all))
	}
	// hpcrun queue --all's rows (the command prints them to stdout).
	queue, err := queueRows(context.Background(), runsDir, true, "")
	if queue == nil {
		t.Fatalf("queue: %v", err)
	}
	failures := 0
	for _, q := range queue {
		if q.ExecID == "" {
			continue
		}
		row := values(ctx, t, fmt.Sprintf(`#runs tr[data-execid=%q]`, q.ExecID))
		want := metricsOf(t, runsDir, q.ExecID)
		for _, k := range []string{"step", "last_loss", "tokens_per_s"} {
			if !sameNumber(row[k], want[k]) {
				t.Errorf("runs page, %s: %s = %q, metrics --json says %v", q.ExecID, k, row[k], want[k])
			}
		}
		wantFailure := q.Failure // left out where the state says it ("cancelled" beside CANCELLED)
		if strings.EqualFold(q.Failure, string(q.State)) {
			wantFailure = ""
		}
		if row["failure"] != wantFailure || row["state"] != string(q.State) {
			t.Errorf("runs page, %s: state %q failure %q, queue says %q %q", q.ExecID, row["state"], row["failure"], q.State, q.Failure)
		}
		if q.Failure != "" {
			failures++
		}
	}
	if failures < 8 {
		t.Errorf("runs page shows %d failed runs with a class, want the failure fixtures' 11", failures)
	}

	// One finished run: its figures and its charts.
	done := "20261121-143005-a3f9"
	do(ctx, t, "run page", chromedp.Navigate(base+"/run/"+done), chromedp.WaitVisible(chromedp.CSS(`svg[data-chart="loss"]`)))
	shoot(ctx, t, shots, "run")
	sum := values(ctx, t, "#summary")
	want := metricsOf(t, runsDir, done)
	for _, k := range []string{"step", "step_p50_s", "step_p90_s", "tokens_per_s", "samples_per_s", "comm_share", "mfu",
		"model_flops_per_s", "last_loss", "last_eval_loss", "last_accuracy", "best_accuracy"} {
		if !sameNumber(sum[k], want[k]) {
			t.Errorf("run page %s: %s = %q, metrics --json says %v", done, k, sum[k], want[k])
		}
	}
	charts, err := chromedp.Run(ctx, chromedp.Evaluate[map[string]string](
		`Object.fromEntries([...document.querySelectorAll("#charts svg[data-chart]")].map(e => [e.dataset.chart, e.dataset.points]))`))
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"loss", "accuracy", "tokens_per_s", "step_time", "lr", "grad_norm", "memory"} {
		if charts[id] == "" || charts[id] == "0" {
			t.Errorf("run page %s: chart %s missing or empty (charts: %v)", done, id, charts)
		}
	}
	curve := want["curves"].(map[string]any)["loss"].([]any)
	if last := attr(ctx, t, `svg[data-chart="loss"]`, "data-last"); !sameNumber(last, curve[len(curve)-1]) {
		t.Errorf("loss chart ends at %s, metrics --json's curve at %v", last, curve[len(curve)-1])
	}

	// The running run: its charts grow as its ranks write.
	do(ctx, t, "live run page", chromedp.Navigate(base+"/run/"+running),
		chromedp.WaitVisible(chromedp.CSS(`svg[data-chart="loss"]`)), chromedp.WaitVisible(chromedp.CSS(".live")))
	// The first event (the page as it stands) has arrived.
	if _, err := chromedp.Run(ctx, chromedp.Poll[bool](`document.body.dataset.updates >= 1`, chromedp.WithPollingTimeout(10*time.Second))); err != nil {
		t.Fatalf("no server-sent event reached the live page: %v", err)
	}
	before := attr(ctx, t, `svg[data-chart="loss"]`, "data-points")
	shoot(ctx, t, shots, "live-before")
	for p, b := range rest {
		f, err := os.OpenFile(p, os.O_APPEND|os.O_WRONLY, 0)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := f.Write(b); err != nil {
			t.Fatal(err)
		}
		f.Close()
	}
	want = metricsOf(t, runsDir, running)
	wantPoints := len(want["curves"].(map[string]any)["loss"].([]any))
	if _, err := chromedp.Run(ctx, chromedp.Poll[bool](fmt.Sprintf(`document.querySelector('svg[data-chart="loss"]').dataset.points == "%d"`, wantPoints),
		chromedp.WithPollingTimeout(15*time.Second))); err != nil {
		t.Fatalf("the loss chart of the running run did not grow from %s to %d points: %v", before, wantPoints, err)
	}
	shoot(ctx, t, shots, "live-after")
	if b, _ := strconv.Atoi(before); b >= wantPoints {
		t.Errorf("the loss chart had %s points before the append, %d after", before, wantPoints)
	}
	sum = values(ctx, t, "#summary")
	if !sameNumber(sum["step"], want["step"]) || !sameNumber(sum["last_loss"], want["last_loss"]) || !sameNumber(sum["tokens_per_s"], want["tokens_per_s"]) {
		t.Errorf("live run page after the append: step %s loss %s tokens/s %s, metrics --json says %v %v %v",
			sum["step"], sum["last_loss"], sum["tokens_per_s"], want["step"], want["last_loss"], want["tokens_per_s"])
	}

	// Compare: two runs ticked on the runs page.
	second := "20261121-143210-b7e1"
	do(ctx, t, "compare", chromedp.Navigate(base+"/"), chromedp.WaitVisible(chromedp.ID("runs")),
		chromedp.Click(chromedp.CSS(fmt.Sprintf(`input[value=%q]`, done))),
		chromedp.Click(chromedp.CSS(fmt.Sprintf(`input[value=%q]`, second))),
		chromedp.Click(chromedp.ID("compare")),
		chromedp.WaitVisible(chromedp.CSS(`svg[data-chart="cmp_loss"]`)))
	shoot(ctx, t, shots, "compare")
	if loc := location(ctx, t); !strings.Contains(loc, "run="+done) || !strings.Contains(loc, "run="+second) {
		t.Errorf("compare page address %s does not name both runs", loc)
	}
	if n := count(ctx, t, `svg[data-chart="cmp_loss"] g.series`); n != 2 {
		t.Errorf("compare loss chart has %d series, want 2", n)
	}
	for _, id := range []string{done, second} {
		row := values(ctx, t, fmt.Sprintf(`#compare-table tr[data-execid=%q]`, id))
		w := metricsOf(t, runsDir, id)
		for _, k := range []string{"step", "last_loss", "last_eval_loss", "tokens_per_s", "step_p50_s", "comm_share"} {
			if !sameNumber(row[k], w[k]) {
				t.Errorf("compare page, %s: %s = %q, metrics --json says %v", id, k, row[k], w[k])
			}
		}
	}
}
