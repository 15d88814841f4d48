package plan

import (
	"errors"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/hpcrun/hpcrun/tensor"
	"github.com/hpcrun/hpcrun/train/config"
)

// TestRankCores: the threads and cores a rank gets as its launcher
// gives them: the local launcher splits the machine's cores over the
// tasks whatever cpus_per_task says (a lone rank of hpcrun run gets them
// all); srun gives cpus_per_task threads, or all the cores when none is
// asked, the node's tasks sharing them.
func TestRankCores(t *testing.T) {
	local, srun := LaunchLocal, LaunchSlurm
	for _, tt := range []struct {
		s       Share
		numCPU  int
		threads int
		cores   float64
	}{
		{Share{TasksPerNode: 1, CPUsPerTask: 1, Launcher: local}, 2, 2, 2}, // hpcrun run --nproc 1: 2 cores of 2
		{Share{TasksPerNode: 2, CPUsPerTask: 1, Launcher: local}, 2, 1, 1},
		{Share{TasksPerNode: 4, CPUsPerTask: 4, Launcher: local}, 2, 1, 0.5}, // oversubscribed: half a core
		{Share{TasksPerNode: 3, Launcher: local}, 8, 2, 2},
		{Share{TasksPerNode: 1, CPUsPerTask: 4, Launcher: srun}, 8, 4, 4},
		{Share{TasksPerNode: 1, Launcher: srun}, 8, 8, 8},                   // no cpus_per_task: all the cores
		{Share{TasksPerNode: 4, Launcher: srun}, 8, 8, 2},                   // ... shared by the node's tasks
		{Share{TasksPerNode: 2, CPUsPerTask: 4, Launcher: srun}, 4, 4, 2},   // the node's tasks share its cores
		{Share{TasksPerNode: 4, CPUsPerTask: 1, Launcher: srun}, 2, 1, 0.5}, // oversubscribed
		{Share{CPUsPerTask: 3}, 16, 3, 3},                                   // no tasks per node counts as one
	} {
		if got := RankThreads(tt.s, tt.numCPU); got != tt.threads {
			t.Errorf("RankThreads(%+v, %d) = %d, want %d", tt.s, tt.numCPU, got, tt.threads)
		}
		if got := RankCores(tt.s, tt.numCPU); got != tt.cores {
			t.Errorf("RankCores(%+v, %d) = %g, want %g", tt.s, tt.numCPU, got, tt.cores)
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

// testRates is a table measured at 1 and 2 threads: 10 and 20 GFLOP/s
// for a small product, 20 and 40 for a large, 30 and 60 for a batched
// one; Add at 8 and 12 GB/s, AdamW at 10 and 16.
func testRates() *CPURates {
	small, large := tensor.GemmShape{M: 64, N: 64, K: 64}, tensor.GemmShape{M: 1024, N: 1024, K: 1024}
	batched := tensor.GemmShape{M: 128, N: 128, K: 32, Batch: 8, TransB: true}
	return &CPURates{Format: RatesFormat, CPU: "Test CPU", Measured: time.Date(2026, 11, 25, 10, 0, 0, 0, time.UTC),
		Gemms:  []GemmRate{{small, 1, 10}, {large, 1, 20}, {batched, 1, 30}, {small, 2, 20}, {large, 2, 40}, {batched, 2, 60}},
		Stream: []StreamRate{{Threads: 1, AddGBs: 8, AdamGBs: 10}, {Threads: 2, AddGBs: 12, AdamGBs: 16}}}
}

func TestHostCPU(t *testing.T) {
	now := time.Date(2026, 11, 26, 10, 0, 0, 0, time.UTC)
	m := Machine{NumCPU: 2, Mem: 8 * gib, CPU: "Test CPU", Load: 0.5, Now: now}
	s := Share{TasksPerNode: 4, CPUsPerTask: 1, Launcher: LaunchLocal}
	d := hostCPU(s, m, nil, os.ErrNotExist, nil)
	if d.Name != "cpu" || d.FP32Flops != DefaultCPUFlops/4 || d.MemBytes != 2*gib || d.Wait != oversubscribedWait || d.Rates != nil {
		t.Errorf("default rate, half a core: %+v", d)
	}
	if want := "default 100 GFLOP/s for 2 cores and 15 GB/s a core, not measured; 0.5 core a rank (GOMAXPROCS 1: the local launcher splits the cores over 4 tasks)"; d.Source != want {
		t.Errorf("source %q, want %q", d.Source, want)
	}
	if len(d.Warnings) != 1 || !strings.Contains(d.Warnings[0], "run hpcrun bench gemm") {
		t.Errorf("warnings %q: want the GEMM rates not measured", d.Warnings)
	}
	if d := hostCPU(s, m, nil, ErrOldRates, nil); !strings.Contains(d.Warnings[0], "rerun hpcrun bench gemm") {
		t.Errorf("an old file: warnings %q", d.Warnings)
	}

	// A lone rank of hpcrun run has both cores: the 2-thread rates.
	r := testRates()
	comm := &CommRates{Format: CommRatesFormat, Fits: []CommFit{{Path: PathShm, NRanks: 2, LatencyS: 20e-6, BusGBs: 4, CPU: "Test CPU", Measured: now}}}
	d = hostCPU(Share{TasksPerNode: 1, CPUsPerTask: 1, Launcher: LaunchLocal}, m, r, nil, comm)
	if d.Threads != 2 || d.Cores != 2 || d.MemBandwidth != 12e9 || d.OptBandwidth != 16e9 || d.MemBytes != 8*gib || d.Wait != 0 {
		t.Errorf("a lone rank: %+v", d)
	}
	if len(d.Warnings) != 0 {
		t.Errorf("measured, fresh, same CPU, quiet: warnings %q", d.Warnings)
	}
	if !strings.Contains(d.Source, "2026-11-25") || !strings.Contains(d.Source, "2 cores a rank (GOMAXPROCS 2") {
		t.Errorf("source %q: no date or no cores", d.Source)
	}
	// A lone rank on 4 cores runs past the 2 threads measured: the GEMMs
	// scale per thread, the bandwidths stay, and the output says so.
	m4 := m
	m4.NumCPU = 4
	d = hostCPU(Share{TasksPerNode: 1, Launcher: LaunchLocal}, m4, r, nil, comm)
	if d.MemBandwidth != 12e9 || d.OptBandwidth != 16e9 || !strings.Contains(strings.Join(d.Warnings, "\n"), "a rank runs 4 threads, the CPU rates were measured up to 2: rerun hpcrun bench gemm --threads 4") {
		t.Errorf("4 threads, 2 measured: bandwidths %g %g, warnings %q", d.MemBandwidth, d.OptBandwidth, d.Warnings)
	}
	// Old, of another CPU, on a busy machine: each said.
	m2 := m
	m2.CPU, m2.Load, m2.Now = "Other CPU", 3.5, now.Add(40*24*time.Hour)
	d = hostCPU(Share{TasksPerNode: 1, Launcher: LaunchLocal}, m2, r, nil, comm)
	if w := strings.Join(d.Warnings, "\n"); !strings.Contains(w, "41 days old") || !strings.Contains(w, `measured on "Test CPU", this machine is "Other CPU"`) || !strings.Contains(w, "busy (load average 3.5 on 2 cores)") {
		t.Errorf("warnings %q: want old, other CPU, busy", d.Warnings)
	}
	// The same load on a machine of 64 cores, 2 of them this process's
	// (a cpuset): the load average is the machine's, so not busy.
	m2.OnlineCPU = 64
	d = hostCPU(Share{TasksPerNode: 1, Launcher: LaunchLocal}, m2, r, nil, comm)
	if w := strings.Join(d.Warnings, "\n"); strings.Contains(w, "busy") {
		t.Errorf("load 3.5 on a machine of 64 cores called busy: %q", d.Warnings)
	}
}

// TestNoCPUsPerTaskWarns: srun without cpus_per_task is planned with all
// the cores, and the output says where that is wrong.
func TestNoCPUsPerTaskWarns(t *testing.T) {
	m := Machine{NumCPU: 8, Mem: 8 * gib, Load: -1}
	for _, c := range []struct {
		s    Share
		want bool
	}{
		{Share{TasksPerNode: 2, Launcher: LaunchSlurm}, true},
		{Share{TasksPerNode: 2, CPUsPerTask: 4, Launcher: LaunchSlurm}, false},
		{Share{TasksPerNode: 8, Launcher: LaunchSlurm}, false}, // a core a task either way
		{Share{TasksPerNode: 2, Launcher: LaunchLocal}, false},
	} {
		d := hostCPU(c.s, m, testRates(), nil, nil)
		if got := strings.Contains(strings.Join(d.Warnings, "\n"), "no cpus_per_task: the plan lets each task use all 8 cores"); got != c.want {
			t.Errorf("%+v: warned %v, want %v (%q)", c.s, got, c.want, d.Warnings)
		}
	}
}

// TestCountCPUList reads the kernel's CPU lists.
func TestCountCPUList(t *testing.T) {
	for list, want := range map[string]int{"0": 1, "0-1": 2, "0-63": 64, "0-3,8,10-11": 7, "": 0, "3-1": 0, "x": 0, "0-": 0} {
		if got := countCPUList(list); got != want {
			t.Errorf("countCPUList(%q) = %d, want %d", list, got, want)
		}
	}
	if n := OnlineCPUs(); n != 0 && n < runtime.NumCPU() {
		t.Errorf("OnlineCPUs() = %d, fewer than this process's %d", n, runtime.NumCPU())
	}
}

// TestCommWarnings: the plan warns of the collectives its time takes, and
// of those only: none for one rank; a path not measured, or measured long
// ago, with the command that measures it (across nodes too).
func TestCommWarnings(t *testing.T) {
	now := time.Date(2026, 11, 26, 10, 0, 0, 0, time.UTC)
	m := Machine{NumCPU: 2, Mem: 8 * gib, CPU: "Test CPU", Load: 0.5, Now: now}
	shm := &CommRates{Format: CommRatesFormat, Fits: []CommFit{{Path: PathShm, NRanks: 2, LatencyS: 20e-6, BusGBs: 4, CPU: "Test CPU", Measured: now.Add(-40 * 24 * time.Hour)}}}
	for _, c := range []struct {
		name          string
		ntasks, tp    int
		nodes         int
		comm          *CommRates
		want, notWant string
	}{
		{"one rank", 1, 1, 1, nil, "", "collectives"},
		{"tp 2 not measured", 2, 2, 1, nil, "the shm collectives are not measured (defaults): run hpcrun bench comm --nproc 2", ""},
		{"tp 2 old fit", 2, 2, 1, shm, "the shm collectives' fit (2 ranks) is 40 days old: rerun hpcrun bench comm --nproc 2", ""},
		{"dp 2 across 2 nodes", 2, 1, 2, shm, "the net collectives are not measured (defaults): run hpcrun bench comm --nproc 2 --nodes 2", "shm"},
	} {
		cfg := config.DefaultConfig()
		cfg.NTasks, cfg.TP = c.ntasks, c.tp
		dev := hostCPU(Share{TasksPerNode: c.ntasks / c.nodes, Launcher: LaunchLocal}, m, testRates(), nil, c.comm)
		p, err := New(Request{Config: cfg, Vocab: 100, Nodes: c.nodes, Device: dev})
		if err != nil {
			t.Fatal(err)
		}
		w := strings.Join(p.Time.Warnings, "\n")
		if (c.want != "" && !strings.Contains(w, c.want)) || (c.notWant != "" && strings.Contains(w, c.notWant)) || (c.want == "" && w != "") {
			t.Errorf("%s: warnings %q, want %q", c.name, p.Time.Warnings, c.want)
		}
	}
}

// TestRatesLookup reads the table: a shape measured, one between two
// (in log FLOPs), the ends held flat, a batched one apart, thread counts
// between and beyond those measured, and cores shared by the threads.
func TestRatesLookup(t *testing.T) {
	r := testRates()
	mid := tensor.GemmShape{M: 256, N: 256, K: 256} // log FLOPs halfway between 64^3 and 1024^3
	for _, tt := range []struct {
		g       tensor.GemmShape
		threads int
		cores   float64
		want    float64 // GFLOP/s
	}{
		{tensor.GemmShape{M: 64, N: 64, K: 64}, 1, 1, 10},
		{mid, 1, 1, 15},
		{mid, 2, 2, 30},
		{tensor.GemmShape{M: 8, N: 8, K: 8}, 2, 2, 20},          // below the smallest: flat
		{tensor.GemmShape{M: 4096, N: 4096, K: 4096}, 1, 1, 20}, // above the largest: flat
		{tensor.GemmShape{M: 64, N: 64, K: 16, Batch: 4}, 2, 2, 60},
		{mid, 4, 4, 60},    // 4 threads: per thread as at 2
		{mid, 1, 0.5, 7.5}, // half a core
		{mid, 2, 1, 15},    // 2 threads on 1 core
	} {
		if got := r.GemmFlops(tt.g, tt.threads, tt.cores) / 1e9; math.Abs(got-tt.want) > 1e-9 {
			t.Errorf("GemmFlops(%v, %d threads, %g cores) = %g GFLOP/s, want %g", tt.g, tt.threads, tt.cores, got, tt.want)
		}
	}
	if add, adam := r.StreamBandwidth(2, 1); add != 6e9 || adam != 8e9 {
		t.Errorf("bandwidth of 2 threads on 1 core: %g, %g", add, adam)
	}
	// A step's elementwise bandwidth, measured at every thread count,
	// stands for Add's; measured at one only, not.
	r.Stream[0].ElemGBs = 4
	if elem, _ := r.StreamBandwidth(1, 1); elem != 8e9 {
		t.Errorf("elementwise measured at 1 thread of 2: %g, want Add's", elem)
	}
	r.Stream[1].ElemGBs = 5
	if elem, _ := r.StreamBandwidth(2, 2); elem != 5e9 {
		t.Errorf("elementwise at 2 threads: %g, want 5e9", elem)
	}
}

// TestFitComm: times of 20 µs + bytes at 4 GB/s of bus bandwidth give
// those back.
func TestFitComm(t *testing.T) {
	times := map[int64]float64{}
	for _, b := range []int64{4 << 10, 64 << 10, 1 << 20, 16 << 20} {
		times[b] = 20e-6 + 2*3.0/4*float64(b)/4e9
	}
	lat, bw, lo, hi, err := FitComm(4, times)
	if err != nil || math.Abs(lat-20e-6) > 1e-12 || math.Abs(bw-4) > 1e-9 || lo != 4<<10 || hi != 16<<20 {
		t.Errorf("FitComm = %g s, %g GB/s, %d..%d, %v; want 20 µs, 4 GB/s", lat, bw, lo, hi, err)
	}
	if _, _, _, _, err := FitComm(1, times); err == nil {
		t.Error("a fit of one rank")
	}
	c := &CommRates{Fits: []CommFit{{Path: PathShm, NRanks: 2}, {Path: PathShm, NRanks: 4}, {Path: PathNet, NRanks: 8}}}
	if f := c.Lookup(PathShm, 3); f == nil || f.NRanks != 2 {
		t.Errorf("Lookup(shm, 3) = %+v, want the 2-rank fit", f)
	}
	if f := c.Lookup(PathTCP, 2); f != nil {
		t.Errorf("Lookup(tcp, 2) = %+v, want none", f)
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

// TestRatesCache saves rates and comm fits, replaces them and reads them
// back: the files hpcrun bench gemm and bench comm name, whole, with no
// temporary left; an old one-rate file is refused with a one-line error.
func TestRatesCache(t *testing.T) {
	cache := t.TempDir()
	t.Setenv("XDG_CACHE_HOME", cache)
	if _, err := LoadCPURates(); err == nil {
		t.Fatal("rates read from an empty cache")
	}
	for _, cpu := range []string{"A", "B"} {
		r := testRates()
		r.CPU = cpu
		path, err := SaveCPURates(r)
		if err != nil {
			t.Fatal(err)
		}
		if want := filepath.Join(cache, "hpcrun", "cpu-gemm.json"); path != want {
			t.Errorf("kept in %s, want %s", path, want)
		}
		got, err := LoadCPURates()
		if err != nil || !reflect.DeepEqual(got, r) {
			t.Errorf("read back %+v, %v; want %+v", got, err, r)
		}
	}
	for _, lat := range []float64{1e-5, 2e-5} {
		for _, n := range []int{2, 4} {
			if _, err := SaveCommFit(CommFit{Path: PathShm, NRanks: n, LatencyS: lat, BusGBs: 3}); err != nil {
				t.Fatal(err)
			}
		}
	}
	c, err := LoadCommRates()
	if err != nil || len(c.Fits) != 2 || c.Fits[0].LatencyS != 2e-5 || c.Fits[1].NRanks != 4 {
		t.Errorf("comm fits %+v, %v: want the latest of 2 and 4 ranks", c, err)
	}
	ents, err := os.ReadDir(filepath.Join(cache, "hpcrun"))
	if err != nil || len(ents) != 2 {
		t.Errorf("cache dir holds %v (%v); want cpu-gemm.json and cpu-comm.json alone", ents, err)
	}
	if d := HostCPU(Share{TasksPerNode: 1, CPUsPerTask: 1}); d.Rates == nil || d.Comm == nil || !strings.HasPrefix(d.Source, `hpcrun bench gemm of 2026-11-25 on "B"`) {
		t.Errorf("HostCPU's source %q: not the rates kept", d.Source)
	}
	// The old format: one median rate.
	old := `{"gflops":40,"threads":2,"measured":"2026-11-25T10:00:00Z"}`
	if err := os.WriteFile(filepath.Join(cache, "hpcrun", "cpu-gemm.json"), []byte(old), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadCPURates(); !errors.Is(err, ErrOldRates) || strings.Contains(err.Error(), "\n") {
		t.Errorf("old format: %v, want ErrOldRates", err)
	}
}

func TestCPUInfoModel(t *testing.T) {
	info := "processor\t: 0\nvendor_id\t: GenuineIntel\nmodel name\t: Intel(R) Xeon(R) Test @ 2.0GHz\n\nprocessor\t: 1\nmodel name\t: other\n"
	if got := cpuInfoModel(strings.NewReader(info)); got != "Intel(R) Xeon(R) Test @ 2.0GHz" {
		t.Errorf("cpuInfoModel = %q", got)
	}
}

// TestCommSkew: a measured skew is paid once a collective, on top of the
// fit's latency and bandwidth, and its share of the work once a step, in
// tp and in dp groups; a pipeline alone pays none.
func TestCommSkew(t *testing.T) {
	now := time.Date(2026, 11, 26, 10, 0, 0, 0, time.UTC)
	m := Machine{NumCPU: 2, Mem: 8 * gib, CPU: "Test CPU", Load: 0.5, Now: now}
	plan := func(tp, pp int, skew, frac float64) Time {
		comm := &CommRates{Format: CommRatesFormat, Fits: []CommFit{{Path: PathShm, NRanks: 2, LatencyS: 20e-6, BusGBs: 4, SkewS: skew, SkewFrac: frac, CPU: "Test CPU", Measured: now}}}
		cfg := config.DefaultConfig()
		cfg.NTasks, cfg.TP, cfg.PP = 2, tp, pp
		if pp > 1 {
			cfg.MicroBatches = 4
		}
		p, err := New(Request{Config: cfg, Vocab: 100, Device: hostCPU(Share{TasksPerNode: 2, Launcher: LaunchLocal}, m, testRates(), nil, comm)})
		if err != nil {
			t.Fatal(err)
		}
		return p.Time
	}
	step := func(skew float64) Time { return plan(2, 1, skew, 0) }
	a, b := step(0), step(100e-6)
	if d := b.CommS - a.CommS; a.Collectives == 0 || math.Abs(d-float64(a.Collectives)*100e-6) > 1e-12 {
		t.Errorf("skew 100 µs adds %.6f s over %d collectives, want %.6f", d, a.Collectives, float64(a.Collectives)*100e-6)
	}
	for _, tp := range []int{2, 1} {
		a, b := plan(tp, 1, 0, 0), plan(tp, 1, 0, 0.05)
		if d, want := b.CommS-a.CommS, 0.05*(a.ComputeS+a.MemoryS); want <= 0 || math.Abs(d-want) > 1e-12 {
			t.Errorf("tp %d: a skew of 5%% of the work adds %.6f s, want %.6f", tp, d, want)
		}
	}
	if a, b := plan(1, 2, 0, 0), plan(1, 2, 0, 0.05); a.CommS != b.CommS || a.Transfers == 0 {
		t.Errorf("pp 2: a skew of 5%% of the work changes its comm from %.6f s to %.6f s; the bubble holds its waits", a.CommS, b.CommS)
	}
}
