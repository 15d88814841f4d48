package bench

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/hpcrun/hpcrun/idrenv"
	"github.com/hpcrun/hpcrun/internal/stats"
	"github.com/hpcrun/hpcrun/internal/units"
	"github.com/hpcrun/hpcrun/nccl"
	"github.com/hpcrun/hpcrun/slurm"
	"github.com/hpcrun/hpcrun/tensor"
	"github.com/hpcrun/hpcrun/train/plan"
)

// CommWorkerEnv marks a process spawned by Comm as one rank of the
// all-reduce benchmark: "rank,size,port,token,backend,min,max" (rank and
// size "slurm" when srun started it).
const CommWorkerEnv = "HPCRUN_BENCH_COMM_WORKER"

// CommOptions is one all-reduce benchmark: N ranks of Program Args (the
// program that runs CommWorker when CommWorkerEnv is set), on this machine
// or over Nodes nodes of the Slurm allocation it runs in, on float32
// buffers of Min to Max bytes (x4 each step).
type CommOptions struct {
	N, Nodes int
	Min, Max int64
	Backend  string // nccl.BackendAuto or nccl.BackendTCP
	MPI      bool   // time Open MPI's MPI_Allreduce beside (bench/mpi)
	Repeat   int    // rounds, alternating sides; each size keeps its best and median time
	Program  string
	Args     []string
	// Warn gets a line when the Open MPI peer cannot run (nil: discarded).
	Warn io.Writer
}

// CommRow is one size of the report (times in seconds per all-reduce,
// bandwidths in GB/s of bus bandwidth, ratios Open MPI's time over
// hpcrun's: above 1, hpcrun is faster).
type CommRow struct {
	Bytes   int64   `json:"bytes"`
	HpcrunS float64 `json:"hpcrun_s"`
	// ColdS is hpcrun's time with the buffer out of the caches, as in a
	// training step (what the plan's fit takes); 0 when not measured.
	ColdS float64 `json:"hpcrun_cold_s,omitempty"`
	// GatherColdS and ScatterColdS are hpcrun's all-gather into a buffer
	// of Bytes and reduce-scatter of one, cold as ColdS (sequence
	// parallelism's and ZeRO's collectives); 0 when not measured.
	GatherColdS  float64 `json:"hpcrun_allgather_cold_s,omitempty"`
	ScatterColdS float64 `json:"hpcrun_reducescatter_cold_s,omitempty"`
	HpcrunBusBW  float64 `json:"hpcrun_busbw_gbs"`
	MPIShmS      float64 `json:"mpi_shm_s,omitempty"`
	MPIShmBusBW  float64 `json:"mpi_shm_busbw_gbs,omitempty"`
	RatioShm     float64 `json:"ratio_vs_mpi_shm,omitempty"`
	MPITCPS      float64 `json:"mpi_tcp_s,omitempty"`
	MPITCPBusBW  float64 `json:"mpi_tcp_busbw_gbs,omitempty"`
	RatioTCP     float64 `json:"ratio_vs_mpi_tcp,omitempty"`
	// The medians of each side's times over the rounds, and their ratios.
	// The times above are the best: where whole runs of many ranks on few
	// cores come out fast or slow (the scheduler's state, not the
	// collective's), the best of a few runs is a tail and the median the
	// typical run, as noisy machines need both.
	HpcrunMedianS  float64 `json:"hpcrun_median_s"`
	MPIShmMedianS  float64 `json:"mpi_shm_median_s,omitempty"`
	RatioShmMedian float64 `json:"ratio_vs_mpi_shm_median,omitempty"`
	MPITCPMedianS  float64 `json:"mpi_tcp_median_s,omitempty"`
	RatioTCPMedian float64 `json:"ratio_vs_mpi_tcp_median,omitempty"`
}

// CommReport is hpcrun bench comm's result (its --json).
type CommReport struct {
	Nproc   int       `json:"nproc"`
	Nodes   int       `json:"nodes"`
	Backend string    `json:"backend"`
	Peer    string    `json:"peer"`
	Repeat  int       `json:"repeat"` // runs a side that the rows' best and median are of
	Rows    []CommRow `json:"rows"`
	// SkewS is the fixed part of what a collective adds after the same
	// work on every rank (timeSkew): the wait for the slowest, on top of
	// its own time, less its growth with the work (SkewFrac).
	SkewS float64 `json:"skew_s"`
	// SkewFrac is the wait's growth with the work before the collective:
	// the skew after w seconds of work is SkewS + SkewFrac w.
	SkewFrac float64 `json:"skew_frac"`
	srun     bool    // the ranks ran over the nodes of an allocation
}

// CommSizes are the buffer sizes from lo to hi, x4 each step.
func CommSizes(lo, hi int64) []int64 {
	var s []int64
	for b := lo; b <= hi; b *= 4 {
		s = append(s, b)
	}
	return s
}

// CommIters is the number of timed all-reduces for a size: 256 MiB of
// traffic, 3 to 200 runs; bench/mpi/mpi_allreduce.c uses the same rule.
func CommIters(bytes int64) int {
	return int(min(max((256<<20)/bytes, 3), 200))
}

// CommWarmups is the number of untimed all-reduces before a size's timed
// ones: 16 MiB of traffic, 1 to CommIters (200 at 4 KiB, as many as OSU's
// micro-benchmarks skip); bench/mpi/mpi_allreduce.c uses the same rule.
// With one, the first size measured paid for the ranks' start: between 3
// hosts of 2 ranks on 2 cores, hpcrun had 0.053-0.103 GB/s at 4 KiB
// measured first and 0.088-0.114 measured second, Open MPI 0.061-0.086
// both ways; with a tenth of CommIters (20) first, 0.061-0.082; with 200,
// 0.070-0.107 (Open MPI 0.059-0.084).
func CommWarmups(bytes int64) int {
	return min(CommIters(bytes), int(max((16<<20)/bytes, 1)))
}

// BusBandwidth is the bus bandwidth in GB/s of an all-reduce of bytes
// over n ranks that took s seconds: 2(n-1)/n * bytes / s; 0 when s is.
func BusBandwidth(n int, bytes int64, s float64) float64 {
	if s <= 0 {
		return 0
	}
	return 2 * float64(n-1) / float64(n) * float64(bytes) / s / 1e9
}

// Comm runs the benchmark: hpcrun's ranks, then (o.MPI) Open MPI's, o.Repeat
// times, and reports each size's best time.
func Comm(ctx context.Context, o CommOptions) (CommReport, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	warn := o.Warn
	if warn == nil {
		warn = io.Discard
	}
	rep := CommReport{Nproc: o.N, Nodes: max(o.Nodes, 1), Backend: o.Backend, Peer: "none", Repeat: o.Repeat, srun: o.Nodes > 0}
	mpi := o.MPI
	var ours, shm, tcp runTimes
	for range o.Repeat {
		var t map[int64]float64
		var err error
		if o.Nodes > 0 {
			t, err = srunRanks(ctx, o)
		} else {
			t, err = localRanks(ctx, o)
		}
		if err != nil {
			return rep, err
		}
		ours = ours.add(t)
		if mpi && o.Nodes > 0 {
			// Across nodes Open MPI picks its transport per pair: shared
			// memory within a node, TCP between; one column, "tcp".
			t, err := runMPI(ctx, o.N, o.Min, o.Max, "self,vader,tcp")
			if err != nil {
				fmt.Fprintf(warn, "bench comm: Open MPI peer skipped: %v\n", err)
				mpi = false
				continue
			}
			tcp = tcp.add(t)
			rep.Peer = "Open MPI MPI_Allreduce launched by mpirun in the same allocation (btl vader within a node, tcp between)"
		} else if mpi {
			s, err := runMPI(ctx, o.N, o.Min, o.Max, "self,vader")
			var t map[int64]float64
			if err == nil {
				t, err = runMPI(ctx, o.N, o.Min, o.Max, "self,tcp")
			}
			if err != nil {
				fmt.Fprintf(warn, "bench comm: Open MPI peer skipped: %v\n", err)
				mpi = false
				continue
			}
			shm, tcp = shm.add(s), tcp.add(t)
			rep.Peer = "Open MPI MPI_Allreduce (btl vader = shared memory; btl tcp)"
		}
	}
	// The skew is noise: the median of the rounds', not the least.
	rep.SkewS, rep.SkewFrac = ours.median(skewKey), ours.median(skewFracKey)
	rep.Rows = commRows(o.N, CommSizes(o.Min, o.Max), ours, shm, tcp)
	return rep, nil
}

// commRows sets the best and median times of each side beside hpcrun's,
// size by size.
func commRows(n int, sizes []int64, ours, shm, tcp runTimes) []CommRow {
	var rows []CommRow
	for _, b := range sizes {
		best, med := ours.best(b), ours.median(b)
		r := CommRow{Bytes: b, HpcrunS: best, HpcrunBusBW: BusBandwidth(n, b, best), HpcrunMedianS: med,
			ColdS: ours.best(coldKey(coldAllReduce, b)), GatherColdS: ours.best(coldKey(coldAllGather, b)),
			ScatterColdS: ours.best(coldKey(coldReduceScatter, b))}
		if s := shm.best(b); s > 0 {
			r.MPIShmS, r.MPIShmBusBW, r.RatioShm = s, BusBandwidth(n, b, s), s/best
			r.MPIShmMedianS = shm.median(b)
			r.RatioShmMedian = r.MPIShmMedianS / med
		}
		if s := tcp.best(b); s > 0 {
			r.MPITCPS, r.MPITCPBusBW, r.RatioTCP = s, BusBandwidth(n, b, s), s/best
			r.MPITCPMedianS = tcp.median(b)
			r.RatioTCPMedian = r.MPITCPMedianS / med
		}
		rows = append(rows, r)
	}
	return rows
}

// WriteText prints the report as hpcrun bench comm's table.
func (rep CommReport) WriteText(out io.Writer) error {
	w := tabwriter.NewWriter(out, 0, 0, 2, ' ', tabwriter.AlignRight)
	where := "on this host"
	if rep.srun {
		where = fmt.Sprintf("over %d nodes", rep.Nodes)
	}
	fmt.Fprintf(out, "all-reduce float32 sum, %d ranks %s, hpcrun backend %s; bus bandwidth GB/s = 2(n-1)/n*bytes/time\n", rep.Nproc, where, rep.Backend)
	runs := "runs"
	if rep.Repeat == 1 {
		runs = "run"
	}
	fmt.Fprintf(out, "best of %d %s a side; ratio: Open MPI's time over hpcrun's, best against best; median: the same of the runs' medians\n", rep.Repeat, runs)
	fmt.Fprintln(w, "size\thpcrun\tmpi-shm\tratio\tmedian\tmpi-tcp\tratio\tmedian\t")
	f := func(v float64) string {
		if v == 0 {
			return "-"
		}
		return fmt.Sprintf("%.3f", v)
	}
	for _, r := range rep.Rows {
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t\n", units.Size(r.Bytes), f(r.HpcrunBusBW),
			f(r.MPIShmBusBW), f(r.RatioShm), f(r.RatioShmMedian), f(r.MPITCPBusBW), f(r.RatioTCP), f(r.RatioTCPMedian))
	}
	return w.Flush()
}

// runTimes is one side's times of every round, by key (a size's bytes,
// or a key of parseTimes' other lines).
type runTimes map[int64][]float64

// add appends one round's times.
func (t runTimes) add(m map[int64]float64) runTimes {
	if t == nil {
		t = runTimes{}
	}
	for k, s := range m {
		t[k] = append(t[k], s)
	}
	return t
}

// best is key's smallest time, 0 if never timed.
func (t runTimes) best(k int64) float64 {
	if len(t[k]) == 0 {
		return 0
	}
	return slices.Min(t[k])
}

// median is key's median time, 0 if never timed.
func (t runTimes) median(k int64) float64 {
	if len(t[k]) == 0 {
		return 0
	}
	return stats.Median(t[k])
}

// CommWorker is one rank of the benchmark, told its place by spec (the
// value of CommWorkerEnv): it all-reduces every size, hot then cold, times
// the cold all-gather and reduce-scatter, and measures the skew, and rank
// 0 prints "<key> <seconds>" lines: a size's key is its bytes (the
// slowest rank's time per all-reduce), coldKey of a collective and them
// (the same, cold), skewKey and skewFracKey the skew's two parts.
func CommWorker(spec string, out io.Writer) error {
	f := strings.Split(spec, ",")
	if len(f) != 7 {
		return fmt.Errorf("%s=%q: want rank,size,port,token,backend,min,max", CommWorkerEnv, spec)
	}
	var v [7]int64
	fields := []int{0, 1, 2, 5, 6}
	master := "127.0.0.1"
	if f[0] == "slurm" {
		// Started by srun on the nodes of an allocation: Slurm says who we are.
		env, err := idrenv.Detect()
		if err != nil {
			return err
		}
		// The threads a training rank runs with (hpcrun train does the
		// same), not all the node's cores: where tasks share them, the
		// ranks wait slower with more. Between 3 hosts of 2 ranks on 2
		// cores, GOMAXPROCS 1 against 2, alternated in blocks of one run:
		// 1.17x the bus bandwidth at 4 KiB, 1.42x at 16 KiB.
		env.LimitThreads()
		v[0], v[1], master, fields = int64(env.Rank), int64(env.WorldSize), env.MasterAddr, []int{2, 5, 6}
	}
	for _, i := range fields {
		x, err := strconv.ParseInt(f[i], 10, 64)
		if err != nil {
			return fmt.Errorf("%s: field %d: %w", CommWorkerEnv, i, err)
		}
		v[i] = x
	}
	ln, err := slurm.MasterListener()
	if err != nil {
		return err
	}
	comm, err := nccl.Init(context.Background(), nccl.Options{Rank: int(v[0]), Size: int(v[1]), MasterAddr: master,
		MasterPort: int(v[2]), Listener: ln, Token: f[3], Backend: f[4], Timeout: time.Minute})
	if err != nil {
		return err
	}
	defer comm.Close()
	return timeAllReduce(comm, v[5], v[6], out)
}

// timeAllReduce times comm's all-reduce on every size from lo to hi; rank
// 0 writes "<bytes> <seconds>" lines, the slowest rank's time.
func timeAllReduce(comm nccl.Comm, lo, hi int64, out io.Writer) error {
	buf := make([]float32, hi/4)
	for i := range buf {
		buf[i] = float32(comm.Rank()+i%7) * 0.25
	}
	for _, bytes := range CommSizes(lo, hi) {
		b := buf[:bytes/4]
		for range CommWarmups(bytes) {
			if err := comm.AllReduce(b, nccl.Sum); err != nil {
				return err
			}
		}
		if err := comm.Barrier(); err != nil {
			return err
		}
		n := CommIters(bytes)
		t0 := time.Now()
		for range n {
			if err := comm.AllReduce(b, nccl.Sum); err != nil {
				return err
			}
		}
		dt := []float32{float32(time.Since(t0).Seconds() / float64(n))}
		if err := comm.AllReduce(dt, nccl.Max); err != nil {
			return err
		}
		if comm.Rank() == 0 {
			fmt.Fprintf(out, "%d %.9f\n", bytes, dt[0])
		}
	}
	if err := timeCold(comm, buf, lo, hi, out); err != nil {
		return err
	}
	skew, frac, err := timeSkew(comm)
	if err != nil {
		return err
	}
	if comm.Rank() == 0 {
		fmt.Fprintf(out, "%d %.9f\n%d %.9f\n", skewKey, skew, skewFracKey, frac)
	}
	return nil
}

// The collectives timeCold times.
const (
	coldAllReduce = 1 + iota
	coldAllGather
	coldReduceScatter
)

// coldKey marks the line of a size's cold times of a collective (timeCold):
// below the skew's, apart for each collective.
func coldKey(collective int, bytes int64) int64 { return -(int64(collective)<<40 | bytes) }

// coldRounds is at most how many cold collectives timeCold makes a size.
const coldRounds = 10

// timeCold times comm's all-reduce, all-gather and reduce-scatter on
// every size from lo to hi as a training step meets them: their buffers
// and the shared memory out of the caches, the other work of the step
// having been through them. Before each collective every rank writes a
// buffer twice the last-level cache and the ranks meet; rank 0 writes
// "<coldKey(collective, bytes)> <seconds>" lines, the slowest rank's mean
// time. The all-gather fills a buffer of bytes (a rank's part 1/n of it,
// rounded down to whole floats); the reduce-scatter reduces one.
func timeCold(comm nccl.Comm, buf []float32, lo, hi int64, out io.Writer) error {
	flush := make([]float32, flushBytes()/4)
	parts := make([]float32, hi/4)
	n := comm.Size()
	for _, collective := range []int{coldAllReduce, coldAllGather, coldReduceScatter} {
		for _, bytes := range CommSizes(lo, hi) {
			part := int(bytes/4) / n
			run := map[int]func() error{
				coldAllReduce:     func() error { return comm.AllReduce(buf[:bytes/4], nccl.Sum) },
				coldAllGather:     func() error { return comm.AllGather(parts[:part], buf[:n*part]) },
				coldReduceScatter: func() error { return comm.ReduceScatter(buf[:n*part], parts[:part], nccl.Sum) },
			}[collective]
			rounds := min(CommIters(bytes), coldRounds)
			var in time.Duration
			for i := range rounds {
				for j := range flush {
					flush[j] = float32(i)
				}
				if err := comm.Barrier(); err != nil {
					return err
				}
				t0 := time.Now()
				if err := run(); err != nil {
					return err
				}
				in += time.Since(t0)
			}
			dt := []float32{float32(in.Seconds() / float64(rounds))}
			if err := comm.AllReduce(dt, nccl.Max); err != nil {
				return err
			}
			if comm.Rank() == 0 {
				fmt.Fprintf(out, "%d %.9f\n", coldKey(collective, bytes), dt[0])
			}
		}
	}
	return nil
}

// flushBytes is twice this machine's last-level cache (sysfs), at least
// 64 MiB.
func flushBytes() int64 {
	var llc int64
	for i := range 8 {
		b, err := os.ReadFile(fmt.Sprintf("/sys/devices/system/cpu/cpu0/cache/index%d/size", i))
		if err != nil {
			break
		}
		if v, ok := strings.CutSuffix(strings.TrimSpace(string(b)), "K"); ok {
			if k, err := strconv.ParseInt(v, 10, 64); err == nil {
				llc = max(llc, k<<10)
			}
		}
	}
	return max(2*llc, 64<<20)
}

// skewKey and skewFracKey mark the skew's lines among the sizes' (a size
// is positive).
const (
	skewKey     = -1
	skewFracKey = -2
)

// skewRounds are the rounds timeSkew makes of each GEMM in skewWork, the
// work every rank does between two collectives: about 1 and 20 ms on one
// core, the span of a training step's work between its collectives.
var (
	skewRounds = [2]int{200, 100}
	skewWork   = [2]tensor.GemmShape{{M: 256, N: 512, K: 512}, {M: 4096, N: 512, K: 512}}
)

// timeSkew is what a collective adds in training to its own time: the
// wait for the slowest rank after the same work on every rank (noise,
// cores of unequal speed), which grows with the work. Every rank times
// rounds of a GEMM each followed by a one-float all-reduce, the work and
// the all-reduce apart, for two sizes of work, and rounds of the
// all-reduce alone; a round's wait is its all-reduce's time less the one
// alone, the ranks' mean. The two waits, against the two works, give
// the skew as fixed seconds + frac x the work's seconds (both at least
// 0), the work on one core; the plan takes frac of a step's compute
// whatever its threads, the wait growing with the time between two
// collectives.
func timeSkew(comm nccl.Comm) (fixed, frac float64, err error) {
	// One thread a rank, whatever its launcher gave: the work's size is a
	// core's, and ranks started by srun without cpus_per_task would
	// otherwise each take all the cores of a node they share.
	defer tensor.SetGemmThreads(0)
	tensor.SetGemmThreads(1)
	dev := tensor.NewCPU()
	x := []float32{1}
	ar := func() error { return comm.AllReduce(x, nccl.Sum) }
	for range 20 {
		if err := ar(); err != nil {
			return 0, 0, err
		}
	}
	if err := comm.Barrier(); err != nil {
		return 0, 0, err
	}
	t0 := time.Now()
	for range skewRounds[0] {
		if err := ar(); err != nil {
			return 0, 0, err
		}
	}
	a := []float32{float32(time.Since(t0).Seconds() / float64(skewRounds[0]))}
	if err := comm.AllReduce(a, nccl.Avg); err != nil {
		return 0, 0, err
	}
	alone := float64(a[0])
	var work, wait [2]float64
	for i, g := range skewWork {
		w, err := syncedRounds(dev, comm, g, skewRounds[i], ar)
		if err != nil {
			return 0, 0, err
		}
		work[i], wait[i] = w[0], max(w[1]-alone, 0)
	}
	if work[1] > work[0] {
		frac = max((wait[1]-wait[0])/(work[1]-work[0]), 0)
	}
	fixed = max(wait[0]-frac*work[0], 0)
	return fixed, frac, nil
}

// syncedRounds runs rounds of the GEMM g each followed by collective on
// every rank and returns the ranks' mean seconds a round in the GEMM and
// in the collective.
func syncedRounds(dev *tensor.CPUDevice, comm nccl.Comm, g tensor.GemmShape, rounds int, collective func() error) ([2]float64, error) {
	var ts [3]*tensor.Tensor
	for i, n := range []int{g.M * g.K, g.K * g.N, g.M * g.N} {
		t, err := dev.Alloc(n)
		if err != nil {
			return [2]float64{}, err
		}
		defer dev.Free(t)
		ts[i] = t
	}
	a, b, c := ts[0], ts[1], ts[2]
	gemm := func() { dev.Gemm(false, false, g.M, g.N, g.K, 1, a, 0, g.K, b, 0, g.N, 0, c, 0, g.N) }
	gemm()
	if err := comm.Barrier(); err != nil {
		return [2]float64{}, err
	}
	var inGemm, inColl time.Duration
	for range rounds {
		t0 := time.Now()
		gemm()
		t1 := time.Now()
		if err := collective(); err != nil {
			return [2]float64{}, err
		}
		inGemm, inColl = inGemm+t1.Sub(t0), inColl+time.Since(t1)
	}
	s := []float32{float32(inGemm.Seconds() / float64(rounds)), float32(inColl.Seconds() / float64(rounds))}
	if err := comm.AllReduce(s, nccl.Avg); err != nil {
		return [2]float64{}, err
	}
	return [2]float64{float64(s[0]), float64(s[1])}, nil
}

// localRanks starts o.N copies of o.Program as benchmark ranks (the worker
// spec in the environment) through slurm.Tasks, the one local launcher;
// one failed rank ends the others.
func localRanks(ctx context.Context, o CommOptions) (map[int64]float64, error) {
	master, port, err := slurm.ListenMaster()
	if err != nil {
		return nil, fmt.Errorf("bench comm: %w", err)
	}
	tok, err := slurm.NewToken()
	if err != nil {
		return nil, err
	}
	var out bytes.Buffer
	stderr := make([]bytes.Buffer, o.N)
	tasks := slurm.Tasks{Master: master, N: o.N, Program: o.Program, Args: o.Args,
		Vars: func(r int) []string {
			return []string{fmt.Sprintf("%s=%d,%d,%d,%s,%s,%d,%d", CommWorkerEnv, r, o.N, port, tok, o.Backend, o.Min, o.Max)}
		},
		Output: func(r int) (io.Writer, io.Writer) {
			if r == 0 {
				return &out, &stderr[r]
			}
			return io.Discard, &stderr[r]
		}}
	failed, err := tasks.Run(ctx)
	if err != nil {
		return nil, fmt.Errorf("bench comm: %w", err)
	}
	var errs []error
	for _, f := range failed {
		errs = append(errs, fmt.Errorf("rank %d: %v: %s", f.Rank, f.Err, strings.TrimSpace(stderr[f.Rank].String())))
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("bench comm: %w", err)
	}
	return parseTimes(&out)
}

// srunRanks starts the benchmark's ranks with srun on the nodes of the
// allocation this process runs in; rank 0's times come back on srun's
// output.
func srunRanks(ctx context.Context, o CommOptions) (map[int64]float64, error) {
	tok, err := slurm.NewToken()
	if err != nil {
		return nil, err
	}
	port := idrenv.DerivePort(os.Getenv("SLURM_JOB_ID") + "/bench/" + tok[:6])
	var out, errb bytes.Buffer
	cmd := exec.CommandContext(ctx, "srun", "-N", strconv.Itoa(o.Nodes), "-n", strconv.Itoa(o.N), "--ntasks-per-node", strconv.Itoa(o.N/o.Nodes), o.Program, "bench", "comm")
	cmd.Env = append(os.Environ(), fmt.Sprintf("%s=slurm,slurm,%d,%s,%s,%d,%d", CommWorkerEnv, port, tok, o.Backend, o.Min, o.Max))
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("bench comm: srun: %v: %s", err, strings.TrimSpace(errb.String()))
	}
	return parseTimes(&out)
}

// parseTimes reads rank 0's "<bytes> <seconds>" lines.
func parseTimes(r io.Reader) (map[int64]float64, error) {
	m := map[int64]float64{}
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		var b int64
		var s float64
		if _, err := fmt.Sscan(sc.Text(), &b, &s); err != nil {
			return nil, fmt.Errorf("bench comm: bad result line %q", sc.Text())
		}
		m[b] = s
	}
	return m, sc.Err()
}

// Fit is the report's all-reduce times fitted as a latency and a bus
// bandwidth (plan.FitComm), for the path they ran on: across the nodes of
// an allocation (plan.PathNet), or on this host over the TCP ring
// (backend tcp, plan.PathTCP) or shared memory (plan.PathShm). The
// bandwidth is the cold times' where measured (a training step's), the
// latency the hot ones': a cold time also holds the ranks' leaving the
// barrier before it one after the other, a wait the skew pays already.
// The cold all-gathers' and reduce-scatters' times give their own bus
// bandwidths (plan.FitGather), priced at the all-reduce's latency.
func (rep CommReport) Fit() (plan.CommFit, error) {
	hot, cold := map[int64]float64{}, map[int64]float64{}
	gather, scatter := map[int64]float64{}, map[int64]float64{}
	for _, r := range rep.Rows {
		hot[r.Bytes], cold[r.Bytes] = r.HpcrunS, cmp.Or(r.ColdS, r.HpcrunS)
		gather[r.Bytes], scatter[r.Bytes] = r.GatherColdS, r.ScatterColdS
	}
	lat, _, lo, hi, err := plan.FitComm(rep.Nproc, hot)
	if err != nil {
		return plan.CommFit{}, err
	}
	_, bw, _, _, err := plan.FitComm(rep.Nproc, cold)
	if err != nil {
		return plan.CommFit{}, err
	}
	// An all-gather or a reduce-scatter not measured (one size, an older
	// worker) leaves its bandwidth 0: the plan takes the all-reduce's.
	_, gatherBW, _, _, _ := plan.FitGather(rep.Nproc, gather)
	_, scatterBW, _, _, _ := plan.FitGather(rep.Nproc, scatter)
	path := plan.PathShm
	switch {
	case rep.srun && rep.Nodes > 1:
		path = plan.PathNet // across hosts; srun's ranks on one node share memory
	case rep.Backend == nccl.BackendTCP:
		path = plan.PathTCP
	}
	return plan.CommFit{Path: path, NRanks: rep.Nproc, Nodes: rep.Nodes, LatencyS: lat, BusGBs: bw, SkewS: rep.SkewS, SkewFrac: rep.SkewFrac,
		GatherGBs: gatherBW, ScatterGBs: scatterBW, MinBytes: lo, MaxBytes: hi,
		CPU: plan.CPUModel(), Measured: time.Now().UTC()}, nil
}

// SaveFit keeps the report's fit for hpcrun plan (plan.SaveCommFit) and
// says so on w; a report that cannot be fitted (one size, one rank) is
// only mentioned.
func (rep CommReport) SaveFit(w io.Writer) error {
	f, err := rep.Fit()
	if err != nil {
		_, err = fmt.Fprintf(w, "hpcrun plan keeps its comm rates: %v\n", err)
		return err
	}
	path, err := plan.SaveCommFit(f)
	if err != nil {
		return fmt.Errorf("bench comm: keep the fit: %w", err)
	}
	_, err = fmt.Fprintf(w, "hpcrun plan will take %s all-reduces over %d ranks as %.1f µs + bytes at %.2f GB/s (bus; all-gathers %.2f, reduce-scatters %.2f), their buffers out of the caches, and in training a wait for the slowest rank of %.0f µs + %.1f%% of the work before each, kept in %s\n",
		f.Path, f.NRanks, f.LatencyS*1e6, f.BusGBs, cmp.Or(f.GatherGBs, f.BusGBs), cmp.Or(f.ScatterGBs, f.BusGBs), f.SkewS*1e6, 100*f.SkewFrac, path)
	return err
}
