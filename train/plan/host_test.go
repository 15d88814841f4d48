package plan

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hpcrun/hpcrun/train/config"
)

func TestRankCores(t *testing.T) {
	for _, tt := range []struct {
		s      Share
		numCPU int
		want   float64
	}{
		{Share{TasksPerNode: 1, CPUsPerTask: 4}, 8, 4},
		{Share{TasksPerNode: 1}, 8, 1},                   // cpus_per_task 0 is one core
		{Share{TasksPerNode: 2, CPUsPerTask: 4}, 4, 2},   // the node's tasks share its cores
		{Share{TasksPerNode: 4, CPUsPerTask: 1}, 2, 0.5}, // oversubscribed: half a core
		{Share{CPUsPerTask: 3}, 16, 3},                   // no tasks per node counts as one
	} {
		if got := RankCores(tt.s, tt.numCPU); got != tt.want {
			t.Errorf("RankCores(%+v, %d) = %g, want %g", tt.s, tt.numCPU, got, tt.want)
		}
	}
}

func TestMemInfoTotal(t *testing.T) {
	info := "MemFree:         1000 kB\nMemTotal:       16384 kB\nMemAvailable:    2000 kB\n"
	if got := memInfoTotal(strings.NewReader(info)); got != 16384*1024 {
		t.Errorf("memInfoTotal = %d, want %d", got, 16384*1024)
	}
	if got := memInfoTotal(strings.NewReader("MemFree: 1 kB\n")); got != 0 {
		t.Errorf("memInfoTotal without MemTotal = %d, want 0", got)
	}
}

func TestHostCPU(t *testing.T) {
	s := Share{TasksPerNode: 4, CPUsPerTask: 1}
	d := hostCPU(s, 2, 8*gib, CPURate{}, false)
	if d.Name != "cpu" || d.FP32Flops != DefaultCPUFlops/4 || d.MemBytes != 2*gib || d.Wait != oversubscribedWait {
		t.Errorf("default rate, half a core: %+v", d)
	}
	if want := "default 100 GFLOP/s for 2 cores (hpcrun bench gemm measures this machine); 0.5 core a rank"; d.Source != want {
		t.Errorf("source %q, want %q", d.Source, want)
	}

	rate := CPURate{GFlops: 80, Threads: 4, Measured: time.Date(2026, 11, 25, 10, 0, 0, 0, time.UTC)}
	d = hostCPU(Share{TasksPerNode: 2, CPUsPerTask: 4}, 8, 8*gib, rate, true)
	if d.FP32Flops != 80e9 || d.MemBytes != 4*gib || d.Wait != 0 {
		t.Errorf("measured 20 GFLOP/s a core, 4 cores a rank: %+v", d)
	}
	if want := "hpcrun bench gemm of 2026-11-25: 80.0 GFLOP/s on 4 threads; 4 cores a rank"; d.Source != want {
		t.Errorf("source %q, want %q", d.Source, want)
	}

	// A rate read with no threads is not a rate: the default stands.
	if d := hostCPU(s, 2, 0, CPURate{GFlops: 80}, true); d.FP32Flops != DefaultCPUFlops/4 || d.MemBytes != defaultCPUMemBytes {
		t.Errorf("rate of 0 threads, unknown memory: %+v", d)
	}
}

func TestRankDevice(t *testing.T) {
	cpu, cuda := config.DefaultConfig(), config.DefaultConfig()
	cpu.Device, cuda.Device = "cpu", "cuda"
	for _, tt := range []struct {
		gpu     string
		cfg     config.Config
		s       Share
		want    string // the device's name; "" for none
		why     bool
		wantErr bool
	}{
		{"", config.DefaultConfig(), Share{TasksPerNode: 2}, "cpu", false, false},
		{"a100", config.DefaultConfig(), Share{TasksPerNode: 4, GPUsPerNode: 4}, "a100-80", false, false},
		{"CPU", config.DefaultConfig(), Share{TasksPerNode: 4, GPUsPerNode: 4}, "cpu", false, false},
		{"h100", cpu, Share{TasksPerNode: 1}, "cpu", false, false}, // the config's device wins
		{"", config.DefaultConfig(), Share{TasksPerNode: 4, GPUsPerNode: 4}, "", true, false},
		{"", cuda, Share{TasksPerNode: 1}, "", true, false},
		{"tpu-v9", config.DefaultConfig(), Share{TasksPerNode: 1}, "", false, true},
	} {
		d, why, err := RankDevice(tt.gpu, tt.cfg, tt.s)
		if (err != nil) != tt.wantErr || (why != "") != tt.why || d.Name != tt.want {
			t.Errorf("RankDevice(%q, device %q, %+v) = %q, why %q, err %v; want %q, why %v, err %v",
				tt.gpu, tt.cfg.Device, tt.s, d.Name, why, err, tt.want, tt.why, tt.wantErr)
		}
		if tt.why && !strings.Contains(why, "h100-80") {
			t.Errorf("why %q does not list the GPUs", why)
		}
	}
}

// TestCPURateCache saves a rate, replaces it and reads it back: the file
// is the one hpcrun bench gemm names, whole, with no temporary left.
func TestCPURateCache(t *testing.T) {
	cache := t.TempDir()
	t.Setenv("XDG_CACHE_HOME", cache)
	if _, err := LoadCPURate(); err == nil {
		t.Fatal("a rate read from an empty cache")
	}
	for _, gflops := range []float64{12.5, 40} {
		c := CPURate{GFlops: gflops, Threads: 2, Measured: time.Date(2026, 11, 25, 10, 0, 0, 0, time.UTC)}
		path, err := SaveCPURate(c)
		if err != nil {
			t.Fatal(err)
		}
		if want := filepath.Join(cache, "hpcrun", "cpu-gemm.json"); path != want {
			t.Errorf("kept in %s, want %s", path, want)
		}
		got, err := LoadCPURate()
		if err != nil || got != c {
			t.Errorf("read back %+v, %v; want %+v", got, err, c)
		}
	}
	ents, err := os.ReadDir(filepath.Join(cache, "hpcrun"))
	if err != nil || len(ents) != 1 {
		t.Errorf("cache dir holds %v (%v); want cpu-gemm.json alone", ents, err)
	}
	if d := HostCPU(Share{TasksPerNode: 1, CPUsPerTask: 1}); !strings.HasPrefix(d.Source, "hpcrun bench gemm of 2026-11-25: 40.0 GFLOP/s on 2 threads") {
		t.Errorf("HostCPU's source %q: not the rate kept", d.Source)
	}
}
