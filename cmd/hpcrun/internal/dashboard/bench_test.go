package dashboard

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// The runs dir of the benchmarks: 200 runs of 4 ranks, 1M step lines in
// all: 199 runs of 1000 steps and one of 51000, written by the metrics
// Writer. Made once per test binary, removed by TestMain.
var (
	benchOnce sync.Once
	benchDir  string
)

const (
	benchRuns  = 200
	benchSmall = 1000
	benchBig   = 51000 // (199*1000 + 51000) * 4 ranks = 1,000,000 step lines
	bigID      = "20261124-000000-b199"
)

func benchRunsDir(b *testing.B) string {
	benchOnce.Do(func() {
		dir, err := os.MkdirTemp("", "hpcrun-serve-bench-")
		if err != nil {
			b.Fatal(err)
		}
		start := time.Now()
		for i := range benchRuns - 1 {
			writeRun(b, dir, fmt.Sprintf("20261124-%06d-%04x", i, i), 4, 1, benchSmall, i%10 != 0)
		}
		writeRun(b, dir, bigID, 4, 1, benchBig, false)
		benchDir = dir
		b.Logf("wrote %d runs, 1M step lines, in %v", benchRuns, time.Since(start).Round(time.Millisecond))
	})
	return benchDir
}

// serveOnce serves one request in-process and fails on a status other
// than 200.
func serveOnce(b *testing.B, s http.Handler, path string) {
	req := httptest.NewRequest(http.MethodGet, path, nil)
	req.AddCookie(&http.Cookie{Name: cookieFor(req.Host), Value: testToken})
	rec := httptest.NewRecorder()
	s.ServeHTTP(rec, req)
	if rec.Code != http.StatusOK {
		b.Fatalf("GET %s: %d %s", path, rec.Code, rec.Body.String())
	}
}

// peakRSSMB is the process's peak resident memory (VmHWM), in MB; 0 where
// /proc does not say. Run one benchmark per process to read it for that one.
func peakRSSMB() float64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			kb, _ := strconv.ParseFloat(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 64)
			return kb / 1e3
		}
	}
	return 0
}

// heapMB is the live heap after a collection, in MB.
func heapMB() float64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return float64(m.HeapAlloc) / 1e6
}

func newBenchServer(b *testing.B) *Server {
	s, err := New(Options{RunsDir: benchRunsDir(b), Token: testToken})
	if err != nil {
		b.Fatal(err)
	}
	return s
}

// BenchmarkRunsPageCold is the runs page of a server that has read nothing
// yet: every run's summary is read.
func BenchmarkRunsPageCold(b *testing.B) {
	benchRunsDir(b)
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		serveOnce(b, newBenchServer(b), "/")
	}
	b.StopTimer()
	b.ReportMetric(peakRSSMB(), "peak-RSS-MB")
}

// BenchmarkRunsPage is the runs page of a running server: the summaries of
// runs whose files have not changed come from its cache.
func BenchmarkRunsPage(b *testing.B) {
	s := newBenchServer(b)
	serveOnce(b, s, "/")
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		serveOnce(b, s, "/")
	}
	b.StopTimer()
	b.ReportMetric(heapMB(), "heap-MB")
	b.ReportMetric(peakRSSMB(), "peak-RSS-MB")
}

// BenchmarkRunPage is the page of a run of 1000 steps x 4 ranks.
func BenchmarkRunPage(b *testing.B) {
	s := newBenchServer(b)
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		serveOnce(b, s, "/run/20261124-000007-0007")
	}
	b.StopTimer()
	b.ReportMetric(peakRSSMB(), "peak-RSS-MB")
}

// BenchmarkRunPageBig is the page of the biggest run, 51000 steps x 4
// ranks (a fifth of the runs dir's lines).
func BenchmarkRunPageBig(b *testing.B) {
	s := newBenchServer(b)
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		serveOnce(b, s, "/run/"+bigID)
	}
	b.StopTimer()
	b.ReportMetric(heapMB(), "heap-MB")
	b.ReportMetric(peakRSSMB(), "peak-RSS-MB")
}
