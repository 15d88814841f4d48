package gpu

import (
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/hpcrun/hpcrun/train/metrics"
)

type recorder struct {
	mu sync.Mutex
	gs []metrics.GPUSample
}

func (r *recorder) GPU(g metrics.GPUSample) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.gs = append(r.gs, g)
	return nil
}

func (r *recorder) n() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.gs)
}

// waitFor polls cond until it holds, failing the test after a generous
// deadline: the sampler's progress, not a fixed sleep, ends each wait, so
// a loaded machine only makes it slower.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("after 10 s: %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// TestNVML runs against the machine's real NVML: absent here (a clean
// ErrUnavailable), present on a GPU machine (real samples).
func TestNVML(t *testing.T) {
	var rec recorder
	s, err := Start(0, 20*time.Millisecond, &rec)
	if err != nil {
		if !errors.Is(err, ErrUnavailable) {
			t.Fatalf("Start without NVML: %v, want an error wrapping ErrUnavailable", err)
		}
		t.Logf("no NVML, as expected on a machine without a GPU: %v", err)
		return
	}
	waitFor(t, "fewer than 3 samples at 20 ms", func() bool { return rec.n() >= 3 })
	if err := s.Stop(); err != nil {
		t.Fatal(err)
	}
	g := rec.gs[0]
	if g.MemTotalBytes <= 0 || g.MemUsedBytes < 0 || g.MemUsedBytes > g.MemTotalBytes || g.UtilPct < 0 || g.UtilPct > 100 {
		t.Errorf("implausible sample %+v", g)
	}
	t.Logf("NVML sample: %+v", g)
}

type fakeDevice struct {
	mu     sync.Mutex
	reads  int
	failAt int
	closed int
}

func (d *fakeDevice) read() (uint64, uint64, float64, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.reads++
	if d.failAt > 0 && d.reads >= d.failAt {
		return 0, 0, 0, errors.New("GPU is lost")
	}
	return uint64(d.reads) << 20, 80 << 30, float64(d.reads % 100), nil
}

func (d *fakeDevice) close() error { d.closed++; return nil }

func TestSamplerLoop(t *testing.T) {
	dev := &fakeDevice{}
	var rec recorder
	s, err := start(2, dev, 5*time.Millisecond, &rec)
	if err != nil {
		t.Fatal(err)
	}
	if rec.n() != 1 {
		t.Errorf("Start recorded %d samples, want 1 at once", rec.n())
	}
	waitFor(t, "fewer than 3 samples at 5 ms", func() bool { return rec.n() >= 3 })
	if err := s.Stop(); err != nil {
		t.Fatal(err)
	}
	n := rec.n()
	if n < 3 || rec.gs[0].Index != 2 || rec.gs[0].MemTotalBytes != 80<<30 || rec.gs[n-1].TS < rec.gs[0].TS {
		t.Errorf("%d samples: %+v", n, rec.gs)
	}
	if err := s.Stop(); err != nil || dev.closed != 1 || rec.n() != n {
		t.Errorf("second Stop: %v, closed %d times, %d samples", err, dev.closed, rec.n())
	}

	lost := &fakeDevice{failAt: 3}
	s, err = start(0, lost, time.Millisecond, &rec)
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the lost device was never read a third time", func() bool {
		lost.mu.Lock()
		defer lost.mu.Unlock()
		return lost.reads >= lost.failAt
	})
	if err := s.Stop(); err == nil || lost.closed != 1 {
		t.Errorf("lost device: Stop returned %v, closed %d", err, lost.closed)
	}
	if _, err := start(0, &fakeDevice{failAt: 1}, time.Millisecond, &rec); err == nil {
		t.Error("device failing at once: Start returned no error")
	}
	if _, err := Start(0, 0, &rec); err == nil {
		t.Error("zero interval: no error")
	}
}
