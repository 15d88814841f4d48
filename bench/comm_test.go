package bench

import (
	"bytes"
	"math"
	"strings"
	"testing"

	"github.com/hpcrun/hpcrun/nccl"
	"github.com/hpcrun/hpcrun/train/plan"
)

func TestCommSizesAndIters(t *testing.T) {
	s := CommSizes(4<<10, 64<<20)
	if len(s) != 8 || s[0] != 4<<10 || s[7] != 64<<20 {
		t.Fatalf("CommSizes = %v", s)
	}
	// Same rule as bench/mpi/mpi_allreduce.c: 256 MiB of traffic, 3..200 runs.
	for _, c := range []struct {
		bytes int64
		want  int
	}{{4 << 10, 200}, {1 << 20, 200}, {64 << 20, 4}, {256 << 20, 3}} {
		if got := CommIters(c.bytes); got != c.want {
			t.Errorf("CommIters(%d) = %d, want %d", c.bytes, got, c.want)
		}
	}
	// 16 MiB untimed first, 1 to the timed count, as mpi_allreduce.c.
	for _, c := range []struct {
		bytes int64
		want  int
	}{{4 << 10, 200}, {1 << 20, 16}, {16 << 20, 1}, {64 << 20, 1}} {
		if got := CommWarmups(c.bytes); got != c.want {
			t.Errorf("CommWarmups(%d) = %d, want %d", c.bytes, got, c.want)
		}
	}
}

// TestCommRows checks the bus bandwidth 2(n-1)/n*bytes/time, each size's
// best and median time over the rounds, and the ratios Open MPI's time
// over hpcrun's, best against best and median against median.
func TestCommRows(t *testing.T) {
	var ours, shm runTimes
	for _, r := range []map[int64]float64{{1000: 2e-6, 4000: 4e-6}, {1000: 1e-6, 4000: 5e-6}, {1000: 8e-6}} {
		ours = ours.add(r)
	}
	shm = shm.add(map[int64]float64{1000: 2e-6}).add(map[int64]float64{1000: 5e-6}).add(map[int64]float64{1000: 3e-6})
	rows := commRows(4, []int64{1000, 4000}, ours, shm, nil)
	if len(rows) != 2 {
		t.Fatalf("rows = %+v", rows)
	}
	r := rows[0]
	if r.HpcrunS != 1e-6 || math.Abs(r.HpcrunBusBW-1.5) > 1e-9 || r.RatioShm != 2 || math.Abs(r.MPIShmBusBW-0.75) > 1e-9 {
		t.Errorf("1000 B: %+v; want the best time 1e-6 s, 1.5 GB/s, shm 0.75 GB/s and ratio 2", r)
	}
	if r.HpcrunMedianS != 2e-6 || r.MPIShmMedianS != 3e-6 || math.Abs(r.RatioShmMedian-1.5) > 1e-9 {
		t.Errorf("1000 B: %+v; want the medians 2e-6 and 3e-6 s, ratio 1.5", r)
	}
	if r := rows[1]; r.HpcrunS != 4e-6 || r.HpcrunMedianS != 4.5e-6 || r.MPIShmS != 0 || r.RatioShm != 0 || r.RatioShmMedian != 0 || r.RatioTCP != 0 {
		t.Errorf("4000 B: %+v; want hpcrun's best, the median of two, and no peer", r)
	}
	if BusBandwidth(4, 1000, 0) != 0 {
		t.Error("a size never timed has a bandwidth")
	}
	if ours.best(77) != 0 || ours.median(77) != 0 {
		t.Error("a key never timed has a time")
	}
}

func TestCommReportText(t *testing.T) {
	rep := CommReport{Nproc: 2, Nodes: 1, Backend: "auto", Repeat: 3, Rows: []CommRow{
		{Bytes: 4 << 10, HpcrunBusBW: 1.25, MPIShmBusBW: 1, RatioShm: 0.8, RatioShmMedian: 1.1},
		{Bytes: 1 << 20, HpcrunBusBW: 2},
	}}
	var b bytes.Buffer
	if err := rep.WriteText(&b); err != nil {
		t.Fatal(err)
	}
	want := "all-reduce float32 sum, 2 ranks on this host, hpcrun backend auto; bus bandwidth GB/s = 2(n-1)/n*bytes/time\n" +
		"best of 3 runs a side; ratio: Open MPI's time over hpcrun's, best against best; median: the same of the runs' medians\n" +
		"  size  hpcrun  mpi-shm  ratio  median  mpi-tcp  ratio  median\n" +
		"  4KiB   1.250    1.000  0.800   1.100        -      -       -\n" +
		"  1MiB   2.000        -      -       -        -      -       -\n"
	if b.String() != want {
		t.Errorf("table:\n%s\nwant:\n%s", b.String(), want)
	}
	rep.srun = true
	b.Reset()
	rep.WriteText(&b)
	if !strings.Contains(b.String(), "2 ranks over 1 nodes") {
		t.Errorf("a run over the nodes of an allocation: %s", b.String())
	}
}

// TestTimeAllReduce runs the worker's timing loop on an in-process world:
// rank 0 alone writes one "<bytes> <seconds>" line a size, which
// parseTimes reads back.
func TestTimeAllReduce(t *testing.T) {
	outs := make([]bytes.Buffer, 3)
	err := nccl.RunInProcess(3, func(c nccl.Comm) error { return timeAllReduce(c, 256, 4096, &outs[c.Rank()]) })
	if err != nil {
		t.Fatal(err)
	}
	if outs[1].Len() != 0 || outs[2].Len() != 0 {
		t.Errorf("ranks 1 and 2 wrote %q, %q", outs[1].String(), outs[2].String())
	}
	m, err := parseTimes(&outs[0])
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range []int64{256, 1024, 4096} {
		if s, ok := m[b]; !ok || s <= 0 {
			t.Errorf("size %d: %v, %v in %v", b, s, ok, m)
		}
	}
	if _, err := parseTimes(strings.NewReader("4096 x\n")); err == nil {
		t.Error("a bad line reads")
	}
}

func TestCommWorkerSpec(t *testing.T) {
	if err := CommWorker("0,2,1", nil); err == nil || !strings.Contains(err.Error(), "want rank,size,port") {
		t.Errorf("short spec: %v", err)
	}
	if err := CommWorker("0,x,1,tok,auto,4,8", nil); err == nil || !strings.Contains(err.Error(), "field 1") {
		t.Errorf("bad size: %v", err)
	}
}

// TestCommFit fits the report's times (30 µs + bus bytes at 2 GB/s) on
// the path they ran on, and keeps the fit where hpcrun plan reads it.
func TestCommFit(t *testing.T) {
	t.Setenv("XDG_CACHE_HOME", t.TempDir())
	var times = map[int64]float64{}
	sizes := CommSizes(4<<10, 16<<20)
	for _, b := range sizes {
		times[b] = 30e-6 + 2*1.0/2*float64(b)/2e9
	}
	for _, tt := range []struct {
		rep  CommReport
		path string
	}{
		{CommReport{Nproc: 2, Nodes: 1, Backend: "auto"}, plan.PathShm},
		{CommReport{Nproc: 2, Nodes: 1, Backend: "tcp"}, plan.PathTCP},
		{CommReport{Nproc: 2, Nodes: 2, Backend: "auto", srun: true}, plan.PathNet},
		{CommReport{Nproc: 2, Nodes: 1, Backend: "auto", srun: true}, plan.PathShm}, // srun on one node
	} {
		tt.rep.Rows, tt.rep.SkewS, tt.rep.SkewFrac = commRows(2, sizes, runTimes(nil).add(times), nil, nil), 80e-6, 0.03
		f, err := tt.rep.Fit()
		if err != nil || f.Path != tt.path || math.Abs(f.LatencyS-30e-6) > 1e-9 || math.Abs(f.BusGBs-2) > 1e-6 || f.SkewS != 80e-6 || f.SkewFrac != 0.03 {
			t.Errorf("%+v: fit %+v, %v; want %s, 30 µs, 2 GB/s", tt.rep, f, err, tt.path)
		}
		var out strings.Builder
		if err := tt.rep.SaveFit(&out); err != nil || !strings.Contains(out.String(), "cpu-comm.json") {
			t.Errorf("SaveFit: %q, %v", out.String(), err)
		}
	}
	c, err := plan.LoadCommRates()
	if err != nil || len(c.Fits) != 3 {
		t.Errorf("kept %+v, %v: want the three paths", c, err)
	}
	// Cold times (a training step's), where measured, give the bandwidth,
	// the hot ones the latency: 3x the hot ones here.
	// The all-gather and the reduce-scatter, cold, at 1 and 0.5 GB/s of
	// their bus bytes (n-1)/n b, give theirs.
	cold := map[int64]float64{}
	for b, s := range times {
		cold[b], cold[coldKey(coldAllReduce, b)] = s, 3*s
		cold[coldKey(coldAllGather, b)] = 30e-6 + float64(b)/2/1e9
		cold[coldKey(coldReduceScatter, b)] = 30e-6 + float64(b)/2/0.5e9
	}
	rep := CommReport{Nproc: 2, Nodes: 1, Backend: "auto", Rows: commRows(2, sizes, runTimes(nil).add(cold), nil, nil)}
	f, err := rep.Fit()
	if err != nil || rep.Rows[0].ColdS != 3*times[sizes[0]] || math.Abs(f.LatencyS-30e-6) > 1e-9 || math.Abs(f.BusGBs-2.0/3) > 1e-6 {
		t.Errorf("cold times fitted as %+v, %v; want 30 µs, 0.67 GB/s", f, err)
	}
	if math.Abs(f.GatherGBs-1) > 1e-6 || math.Abs(f.ScatterGBs-0.5) > 1e-6 {
		t.Errorf("all-gather and reduce-scatter fitted at %.4f and %.4f GB/s, want 1 and 0.5", f.GatherGBs, f.ScatterGBs)
	}
}
