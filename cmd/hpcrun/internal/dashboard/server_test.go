package dashboard

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hpcrun/hpcrun/train/metrics"
)

const testToken = "t0k3n-for-the-tests-0123456789"

// writeRun writes a run of ranks x steps (tp 2) under runsDir through the
// metrics Writer, steps from..to, and the run line when from is 1.
func writeRun(t testing.TB, runsDir, execID string, ranks, from, to int, end bool) {
	t.Helper()
	dir := filepath.Join(runsDir, execID)
	for r := range ranks {
		w, err := metrics.Create(dir, r)
		if err != nil {
			t.Fatal(err)
		}
		if from == 1 {
			cfg := fmt.Sprintf(`{"model":"gpt","preset":"tiny","layers":2,"dim":64,"heads":4,"seq":32,"bsz":8,"steps":%d,"ntasks":%d,"tp":2}`, to*2, ranks)
			if err := w.Run(metrics.RunInfo{Config: []byte(cfg), Rank: r, World: ranks, TP: 2, DP: ranks / 2, TPRank: r % 2, DPRank: r / 2,
				Host: "n1", Device: "cpu", TotalSteps: to * 2, FlopsPerToken: 1e6, PeakFlops: 1e12, Start: 1e9}); err != nil {
				t.Fatal(err)
			}
		}
		for s := from; s <= to; s++ {
			st := metrics.Step{Step: s, Epoch: 1, Loss: 5 / math.Sqrt(float64(s)), LR: 1e-3, GradNorm: 1 + 1/float64(s),
				Tokens: 256, Samples: 8, StepS: 0.1 + 0.001*float64(r), CommS: 0.02, MemBytes: int64(30+r) << 20,
				MemPeakBytes: int64(31+r) << 20, TS: 1e9 + float64(s)}
			if err := w.Step(st); err != nil {
				t.Fatal(err)
			}
			if s%50 == 0 {
				if err := w.Eval(metrics.Eval{Step: s, Loss: 4 / math.Sqrt(float64(s)), Accuracy: math.NaN(), TS: 1e9 + float64(s)}); err != nil {
					t.Fatal(err)
				}
			}
		}
		if end {
			if err := w.End(metrics.StatusCompleted, nil, time.Duration(to)*100*time.Millisecond); err != nil {
				t.Fatal(err)
			}
		}
		if err := w.Close(); err != nil {
			t.Fatal(err)
		}
	}
}

func newTestServer(t *testing.T, runsDir string) *httptest.Server {
	t.Helper()
	s, err := New(Options{RunsDir: runsDir, Token: testToken, Poll: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(s)
	t.Cleanup(ts.Close)
	return ts
}

// tokenCookie is the cookie a browser holds for ts after opening its URL.
func tokenCookie(ts *httptest.Server) *http.Cookie {
	return &http.Cookie{Name: cookieFor(ts.Listener.Addr().String()), Value: testToken}
}

// noRedirect is a client that shows redirects instead of following them.
var noRedirect = &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}

func get(t *testing.T, c *http.Client, url string, cookie *http.Cookie) (*http.Response, string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, url, nil)
	if cookie != nil {
		req.AddCookie(cookie)
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, string(b)
}

func TestTokenOnceThenCookie(t *testing.T) {
	ts := newTestServer(t, t.TempDir())
	for _, u := range []string{"/", "/run/x", "/events/x", "/static/app.js", "/?token=wrong", "/?token=" + testToken[:len(testToken)-1]} {
		if resp, _ := get(t, noRedirect, ts.URL+u, nil); resp.StatusCode != http.StatusForbidden {
			t.Errorf("GET %s without the token: %s, want 403", u, resp.Status)
		}
	}
	if resp, _ := get(t, noRedirect, ts.URL+"/", &http.Cookie{Name: tokenCookie(ts).Name, Value: "guess"}); resp.StatusCode != http.StatusForbidden {
		t.Errorf("a wrong cookie: %s, want 403", resp.Status)
	}
	resp, _ := get(t, noRedirect, ts.URL+"/compare?run=a&token="+testToken, nil)
	if resp.StatusCode != http.StatusSeeOther || resp.Header.Get("Location") != "/compare?run=a" {
		t.Fatalf("the token: %s to %q, want 303 to the same page without it", resp.Status, resp.Header.Get("Location"))
	}
	var cookie *http.Cookie
	for _, c := range resp.Cookies() {
		if c.Name == tokenCookie(ts).Name {
			cookie = c
		}
	}
	if cookie == nil || !cookie.HttpOnly || cookie.SameSite != http.SameSiteStrictMode || cookie.Value != testToken {
		t.Fatalf("cookie %+v, want the token, HttpOnly, SameSite=Strict", cookie)
	}
	if resp, body := get(t, noRedirect, ts.URL+"/", cookie); resp.StatusCode != http.StatusOK || !strings.Contains(body, `id="runs"`) {
		t.Errorf("with the cookie: %s", resp.Status)
	}
	if resp, body := get(t, noRedirect, ts.URL+"/static/app.js", cookie); resp.StatusCode != http.StatusOK || !strings.Contains(body, "EventSource") {
		t.Errorf("app.js with the cookie: %s", resp.Status)
	}
	req, _ := http.NewRequest(http.MethodPost, ts.URL+"/", nil)
	req.AddCookie(cookie)
	if resp, err := http.DefaultClient.Do(req); err != nil || resp.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("POST: %v %v, want 405", resp.Status, err)
	}
	if csp := resp.Header.Get("Content-Security-Policy"); !strings.Contains(csp, "default-src 'none'") {
		t.Errorf("Content-Security-Policy %q", csp)
	}
}

func TestEmptyTokenRefusesAll(t *testing.T) {
	s, err := New(Options{RunsDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(s)
	defer ts.Close()
	for _, u := range []string{"/", "/?token="} {
		if resp, _ := get(t, noRedirect, ts.URL+u, &http.Cookie{Name: tokenCookie(ts).Name, Value: ""}); resp.StatusCode != http.StatusForbidden {
			t.Errorf("GET %s with no server token: %s, want 403", u, resp.Status)
		}
	}
}

var pointsRE = regexp.MustCompile(`data-chart=\\?"loss\\?" data-points=\\?"(\d+)`)

func TestRunPageAndLiveEvents(t *testing.T) {
	runs := t.TempDir()
	const id = "20261123-150000-abcd"
	writeRun(t, runs, id, 4, 1, 10, false)
	ts := newTestServer(t, runs)
	cookie := tokenCookie(ts)

	resp, body := get(t, http.DefaultClient, ts.URL+"/run/"+id[:13], cookie) // a prefix finds it
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("run page: %s\n%s", resp.Status, body)
	}
	for _, want := range []string{`data-events="/events/` + id + `"`, `data-chart="tokens_per_s"`, `data-chart="mfu"`, `data-chart="memory"`, `data-key="step" data-value="10"`} {
		if !strings.Contains(body, want) {
			t.Errorf("run page lacks %s", want)
		}
	}
	if m := pointsRE.FindStringSubmatch(body); m == nil || m[1] != "10" {
		t.Errorf("loss chart points %v, want 10", m)
	}
	if resp, _ := get(t, http.DefaultClient, ts.URL+"/run/19990101-000000-0000", cookie); resp.StatusCode != http.StatusNotFound {
		t.Errorf("unknown run: %s, want 404", resp.Status)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, ts.URL+"/events/"+id, nil)
	req.AddCookie(cookie)
	ev, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer ev.Body.Close()
	if ct := ev.Header.Get("Content-Type"); ct != "text/event-stream" {
		t.Fatalf("events: Content-Type %q", ct)
	}
	rd := bufio.NewReader(ev.Body)
	next := func() map[string]string {
		t.Helper()
		for {
			line, err := rd.ReadString('\n')
			if err != nil {
				t.Fatalf("events: %v", err)
			}
			if data, ok := strings.CutPrefix(line, "data: "); ok {
				var m map[string]string
				if err := json.Unmarshal([]byte(data), &m); err != nil {
					t.Fatalf("event data: %v", err)
				}
				return m
			}
		}
	}
	first := next()
	if m := pointsRE.FindStringSubmatch(first["charts"]); m == nil || m[1] != "10" {
		t.Fatalf("first event's loss chart has %v points, want 10", m)
	}
	writeRun(t, runs, id, 4, 11, 25, false)
	for {
		upd := next()
		m := pointsRE.FindStringSubmatch(upd["charts"])
		if m == nil {
			t.Fatalf("update without a loss chart")
		}
		if m[1] == "25" {
			if !strings.Contains(upd["summary"], `data-key="step" data-value="25"`) {
				t.Errorf("the summary of the update is not at step 25")
			}
			break
		}
		// An update may catch the ranks mid-append: it must not go back.
		if n, _ := strconv.Atoi(m[1]); n < 10 {
			t.Fatalf("update's loss chart has %v points", m)
		}
	}
}

func TestMaxStreams(t *testing.T) {
	runs := t.TempDir()
	writeRun(t, runs, "20261123-150000-abcd", 2, 1, 3, false)
	s, err := New(Options{RunsDir: runs, Token: testToken, MaxStreams: 1})
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(s)
	defer ts.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, ts.URL+"/events/20261123-150000-abcd", nil)
	req.AddCookie(tokenCookie(ts))
	first, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer first.Body.Close()
	resp, _ := get(t, http.DefaultClient, ts.URL+"/events/20261123-150000-abcd", tokenCookie(ts))
	if resp.StatusCode != http.StatusServiceUnavailable {
		t.Errorf("a second live page past MaxStreams 1: %s, want 503", resp.Status)
	}
}

func TestComparePage(t *testing.T) {
	runs := t.TempDir()
	writeRun(t, runs, "20261123-150000-aaaa", 2, 1, 60, true)
	writeRun(t, runs, "20261123-150001-bbbb", 4, 1, 100, true)
	ts := newTestServer(t, runs)
	cookie := tokenCookie(ts)
	resp, body := get(t, http.DefaultClient, ts.URL+"/compare?run=20261123-150000-aaaa&run=20261123-150001-bbbb", cookie)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("compare: %s\n%s", resp.Status, body)
	}
	if n := strings.Count(body, `data-series="20261123-150000-aaaa"`); n != 4 {
		t.Errorf("run aaaa is in %d charts, want 4", n)
	}
	if resp, _ := get(t, http.DefaultClient, ts.URL+"/compare?run=nope", cookie); resp.StatusCode != http.StatusNotFound {
		t.Errorf("compare of an unknown run: %s, want 404", resp.Status)
	}
}

func TestChartSVG(t *testing.T) {
	nan := math.NaN()
	c := Chart{ID: "x", Title: "t <b>", Series: []Series{{Name: "a&b", X: []float64{1, 2, 3, 4}, Y: []float64{1, nan, 3, 4}}}}
	svg := string(c.SVG())
	if !strings.Contains(svg, `data-points="4"`) || !strings.Contains(svg, `data-last="4"`) || strings.Contains(svg, "<b>") {
		t.Errorf("svg: %s", svg)
	}
	// The NaN leaves a gap: the path starts again after it.
	if n := strings.Count(svg, "M"); n != 2 {
		t.Errorf("path has %d moves, want 2 (a gap at the NaN)", n)
	}
	empty := string(Chart{ID: "e", Series: []Series{{X: []float64{1}, Y: []float64{nan}}}}.SVG())
	if !strings.Contains(empty, "no data yet") {
		t.Errorf("a chart without finite points: %s", empty)
	}
	for _, tt := range []struct{ lo, hi float64 }{{0, 1}, {0.31, 0.97}, {1e-6, 3e-6}, {-5, 1234567}, {7, 7.0000001}} {
		tk := niceTicks(tt.lo, tt.hi, 4)
		if len(tk) < 2 || tk[0] > tt.lo || tk[len(tk)-1] < tt.hi-1e-12 || len(tk) > 16 {
			t.Errorf("niceTicks(%g, %g) = %v", tt.lo, tt.hi, tk)
		}
	}
	x := make([]float64, 10000)
	for i := range x {
		x[i] = float64(i)
	}
	tx, _ := thin(x, x)
	if len(tx) > maxPoints+1 || tx[len(tx)-1] != 9999 {
		t.Errorf("thin: %d points ending at %g", len(tx), tx[len(tx)-1])
	}
}

func TestMain(m *testing.M) {
	code := m.Run()
	if benchDir != "" {
		os.RemoveAll(benchDir)
	}
	os.Exit(code)
}

// Two dashboards on one host (a browser sends a host's cookies to all its
// ports) keep a cookie each: opening the second does not log the first out.
func TestTwoDashboardsKeepTheirCookies(t *testing.T) {
	jar, err := cookiejar.New(nil)
	if err != nil {
		t.Fatal(err)
	}
	browser := &http.Client{Jar: jar}
	var servers []*httptest.Server
	for _, tok := range []string{testToken, testToken + "-other"} {
		s, err := New(Options{RunsDir: t.TempDir(), Token: tok})
		if err != nil {
			t.Fatal(err)
		}
		ts := httptest.NewServer(s)
		t.Cleanup(ts.Close)
		servers = append(servers, ts)
		if resp, _ := get(t, browser, ts.URL+"/?token="+tok, nil); resp.StatusCode != http.StatusOK {
			t.Fatalf("opening dashboard %d: %s", len(servers), resp.Status)
		}
	}
	for i, ts := range servers {
		if resp, _ := get(t, browser, ts.URL+"/", nil); resp.StatusCode != http.StatusOK {
			t.Errorf("dashboard %d after both were opened: %s, want 200", i+1, resp.Status)
		}
	}
}
