package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/hpcrun/hpcrun/bench"
	"github.com/hpcrun/hpcrun/idrenv"
	"github.com/hpcrun/hpcrun/nccl"
	"github.com/hpcrun/hpcrun/slurm"
	"github.com/urfave/cli/v2"
)

// benchCommWorkerEnv marks a process spawned by `hpcrun bench comm` as one
// rank of the benchmark: "rank,size,port,token,backend,min,max".
const benchCommWorkerEnv = "HPCRUN_BENCH_COMM_WORKER"

func benchCommCommand() *cli.Command {
	return &cli.Command{
		Name:  "comm",
		Usage: "collective bus bandwidth next to Open MPI",
		Description: "Spawns --nproc copies of hpcrun on this machine that all-reduce float32\n" +
			"buffers of --min to --max bytes (x4 each step) through nccl.Init (shared memory,\n" +
			"or the loopback TCP ring with --backend tcp), and prints the bus bandwidth\n" +
			"2(n-1)/n * bytes / time of the slowest rank. When mpicc and mpirun exist, the\n" +
			"same sizes run through Open MPI's MPI_Allreduce (bench/mpi/mpi_allreduce.c)\n" +
			"with its shared-memory and its TCP transport, and each ratio is Open MPI's\n" +
			"time over hpcrun's (above 1: hpcrun is faster).\n\n" +
			"With --nodes N the ranks spread over N nodes of a Slurm allocation (salloc is\n" +
			"asked for one when there is none): hpcrun's ranks start with srun, Open MPI's\n" +
			"with mpirun in the same allocation (shared memory within a node, TCP between).",
		Flags: []cli.Flag{
			&cli.IntFlag{Name: "nproc", Value: 4, Usage: "number of `RANKS`"},
			&cli.StringFlag{Name: "min", Value: "4KiB", Usage: "smallest buffer `SIZE`"},
			&cli.StringFlag{Name: "max", Value: "64MiB", Usage: "largest buffer `SIZE`"},
			&cli.StringFlag{Name: "backend", Value: nccl.BackendAuto, Usage: "hpcrun backend: auto (TCP ring + shared memory) or tcp"},
			&cli.BoolFlag{Name: "no-mpi", Usage: "skip the Open MPI peer"},
			&cli.IntFlag{Name: "repeat", Value: 2, Usage: "run each side `N` times, alternating, and keep each size's best time (the machine may be shared)"},
			&cli.IntFlag{Name: "nodes", Usage: "spread the ranks over `N` nodes of a Slurm allocation (0: this machine)"},
		},
		Action: func(c *cli.Context) error {
			if spec := os.Getenv(benchCommWorkerEnv); spec != "" {
				return benchCommWorker(spec, c.App.Writer)
			}
			if c.NArg() > 0 {
				return fmt.Errorf("bench comm takes no arguments, got %q", c.Args().Slice())
			}
			n := c.Int("nproc")
			if n < 2 || n > 64 {
				return fmt.Errorf("--nproc %d: use 2..64 ranks", n)
			}
			lo, err := parseBytes(c.String("min"))
			if err != nil {
				return fmt.Errorf("--min: %w", err)
			}
			hi, err := parseBytes(c.String("max"))
			if err != nil {
				return fmt.Errorf("--max: %w", err)
			}
			if lo < 4 || hi < lo || lo%4 != 0 {
				return fmt.Errorf("--min %d --max %d: need 4 <= min <= max, min a multiple of 4 bytes", lo, hi)
			}
			b := c.String("backend")
			if b != nccl.BackendAuto && b != nccl.BackendTCP {
				return fmt.Errorf("--backend %q: use auto or tcp", b)
			}
			if c.Int("repeat") < 1 {
				return fmt.Errorf("--repeat %d: need at least 1", c.Int("repeat"))
			}
			nodes := c.Int("nodes")
			if nodes < 0 || (nodes > 0 && n%nodes != 0) {
				return fmt.Errorf("--nodes %d: give a count that divides --nproc %d", nodes, n)
			}
			if nodes > 0 && os.Getenv("SLURM_JOB_ID") == "" {
				return inAllocation(c, n, nodes)
			}
			return runBenchComm(c, n, nodes, lo, hi, b, !c.Bool("no-mpi"))
		},
	}
}

// parseBytes reads "4096", "4KiB", "64MiB", "1GiB".
func parseBytes(s string) (int64, error) {
	mult := int64(1)
	t := strings.TrimSpace(s)
	for _, u := range []struct {
		suffix string
		m      int64
	}{{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}, {"K", 1 << 10}, {"M", 1 << 20}, {"G", 1 << 30}, {"B", 1}} {
		if strings.HasSuffix(t, u.suffix) {
			t, mult = strings.TrimSuffix(t, u.suffix), u.m
			break
		}
	}
	v, err := strconv.ParseInt(t, 10, 64)
	if err != nil || v < 0 {
		return 0, fmt.Errorf("size %q: want bytes like 4096, 4KiB or 64MiB", s)
	}
	return v * mult, nil
}

// benchIters is the number of timed all-reduces for a size; bench/
// mpi/mpi_allreduce.c uses the same rule.
func benchIters(bytes int64) int {
	return int(min(max((256<<20)/bytes, 3), 200))
}

func benchSizes(lo, hi int64) []int64 {
	var s []int64
	for b := lo; b <= hi; b *= 4 {
		s = append(s, b)
	}
	return s
}

// benchCommWorker is one rank: rank 0 prints "<bytes> <seconds>" lines.
func benchCommWorker(spec string, out io.Writer) error {
	f := strings.Split(spec, ",")
	if len(f) != 7 {
		return fmt.Errorf("%s=%q: want rank,size,port,token,backend,min,max", benchCommWorkerEnv, spec)
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
		v[0], v[1], master, fields = int64(env.Rank), int64(env.WorldSize), env.MasterAddr, []int{2, 5, 6}
	}
	for _, i := range fields {
		x, err := strconv.ParseInt(f[i], 10, 64)
		if err != nil {
			return fmt.Errorf("%s: field %d: %w", benchCommWorkerEnv, i, err)
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
	buf := make([]float32, v[6]/4)
	for i := range buf {
		buf[i] = float32(int(v[0])+i%7) * 0.25
	}
	for _, bytes := range benchSizes(v[5], v[6]) {
		b := buf[:bytes/4]
		if err := comm.AllReduce(b, nccl.Sum); err != nil { // warm-up
			return err
		}
		if err := comm.Barrier(); err != nil {
			return err
		}
		n := benchIters(bytes)
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
	return nil
}

// commRow is one line of the table (times in seconds per all-reduce,
// bandwidths in GB/s of bus bandwidth).
type commRow struct {
	Bytes       int64   `json:"bytes"`
	HpcrunS     float64 `json:"hpcrun_s"`
	HpcrunBusBW float64 `json:"hpcrun_busbw_gbs"`
	MPIShmS     float64 `json:"mpi_shm_s,omitempty"`
	MPIShmBusBW float64 `json:"mpi_shm_busbw_gbs,omitempty"`
	RatioShm    float64 `json:"ratio_vs_mpi_shm,omitempty"`
	MPITCPS     float64 `json:"mpi_tcp_s,omitempty"`
	MPITCPBusBW float64 `json:"mpi_tcp_busbw_gbs,omitempty"`
	RatioTCP    float64 `json:"ratio_vs_mpi_tcp,omitempty"`
}

type commReport struct {
	Nproc   int       `json:"nproc"`
	Nodes   int       `json:"nodes"`
	Backend string    `json:"backend"`
	Peer    string    `json:"peer"`
	Rows    []commRow `json:"rows"`
}

// inAllocation runs this very command again inside a new Slurm allocation
// of nodes nodes, n/nodes tasks each.
func inAllocation(c *cli.Context, n, nodes int) error {
	self, err := os.Executable()
	if err != nil {
		return err
	}
	salloc, err := exec.LookPath("salloc")
	if err != nil {
		return fmt.Errorf("bench comm --nodes: salloc not found: run it on a Slurm cluster (scripts/slurm-local.sh up --nodes 3 makes one here)")
	}
	args := append([]string{"-N", strconv.Itoa(nodes), "--ntasks-per-node", strconv.Itoa(n / nodes), self}, os.Args[1:]...)
	cmd := exec.CommandContext(c.Context, salloc, args...)
	cmd.Stdout, cmd.Stderr = c.App.Writer, c.App.ErrWriter
	return cmd.Run()
}

func runBenchComm(c *cli.Context, n, nodes int, lo, hi int64, backend string, mpi bool) error {
	ctx, cancel := context.WithCancel(c.Context)
	defer cancel()
	rep := commReport{Nproc: n, Nodes: max(nodes, 1), Backend: backend, Peer: "none"}
	var ours, shm, tcp map[int64]float64
	for range c.Int("repeat") {
		var o map[int64]float64
		var err error
		if nodes > 0 {
			o, err = srunHpcrunRanks(ctx, n, nodes, lo, hi, backend)
		} else {
			o, err = runHpcrunRanks(ctx, n, lo, hi, backend)
		}
		if err != nil {
			return err
		}
		ours = best(ours, o)
		if mpi && nodes > 0 {
			// Across nodes Open MPI picks its transport per pair: shared
			// memory within a node, TCP between; one column, "tcp".
			t, err := runMPI(ctx, n, lo, hi, "self,vader,tcp")
			if err != nil {
				fmt.Fprintf(c.App.ErrWriter, "bench comm: Open MPI peer skipped: %v\n", err)
				mpi = false
				continue
			}
			tcp = best(tcp, t)
			rep.Peer = "Open MPI MPI_Allreduce launched by mpirun in the same allocation (btl vader within a node, tcp between)"
		} else if mpi {
			s, t, err := runMPIPeer(ctx, n, lo, hi)
			if err != nil {
				fmt.Fprintf(c.App.ErrWriter, "bench comm: Open MPI peer skipped: %v\n", err)
				mpi = false
				continue
			}
			shm, tcp = best(shm, s), best(tcp, t)
			rep.Peer = "Open MPI MPI_Allreduce (btl vader = shared memory; btl tcp)"
		}
	}
	busbw := func(bytes int64, s float64) float64 {
		if s <= 0 {
			return 0
		}
		return 2 * float64(n-1) / float64(n) * float64(bytes) / s / 1e9
	}
	for _, b := range benchSizes(lo, hi) {
		r := commRow{Bytes: b, HpcrunS: ours[b], HpcrunBusBW: busbw(b, ours[b])}
		if s, ok := shm[b]; ok {
			r.MPIShmS, r.MPIShmBusBW, r.RatioShm = s, busbw(b, s), s/ours[b]
		}
		if s, ok := tcp[b]; ok {
			r.MPITCPS, r.MPITCPBusBW, r.RatioTCP = s, busbw(b, s), s/ours[b]
		}
		rep.Rows = append(rep.Rows, r)
	}
	if c.Bool("json") {
		return writeJSON(c, rep)
	}
	w := tabwriter.NewWriter(c.App.Writer, 0, 0, 2, ' ', tabwriter.AlignRight)
	where := "on this host"
	if nodes > 0 {
		where = fmt.Sprintf("over %d nodes", nodes)
	}
	fmt.Fprintf(c.App.Writer, "all-reduce float32 sum, %d ranks %s, hpcrun backend %s; bus bandwidth GB/s = 2(n-1)/n*bytes/time\n", n, where, backend)
	fmt.Fprintln(w, "size\thpcrun\tmpi-shm\tratio\tmpi-tcp\tratio\t")
	f := func(v float64) string {
		if v == 0 {
			return "-"
		}
		return fmt.Sprintf("%.3f", v)
	}
	for _, r := range rep.Rows {
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\t\n", humanBytes(r.Bytes), f(r.HpcrunBusBW), f(r.MPIShmBusBW), f(r.RatioShm), f(r.MPITCPBusBW), f(r.RatioTCP))
	}
	return w.Flush()
}

// best keeps each size's smallest time.
func best(acc, m map[int64]float64) map[int64]float64 {
	if acc == nil {
		acc = map[int64]float64{}
	}
	for b, s := range m {
		if old, ok := acc[b]; !ok || s < old {
			acc[b] = s
		}
	}
	return acc
}

func humanBytes(b int64) string {
	switch {
	case b >= 1<<20 && b%(1<<20) == 0:
		return fmt.Sprintf("%dMiB", b>>20)
	case b >= 1<<10 && b%(1<<10) == 0:
		return fmt.Sprintf("%dKiB", b>>10)
	}
	return fmt.Sprintf("%dB", b)
}

// runHpcrunRanks starts n copies of this binary as benchmark ranks (the
// worker spec in the environment) through the one local launcher; one
// failed rank ends the others.
func runHpcrunRanks(ctx context.Context, n int, lo, hi int64, backend string) (map[int64]float64, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("bench comm: find own binary: %w", err)
	}
	master, port, err := slurm.ListenMaster()
	if err != nil {
		return nil, fmt.Errorf("bench comm: %w", err)
	}
	tok, err := randomToken()
	if err != nil {
		return nil, err
	}
	var out bytes.Buffer
	stderr := make([]bytes.Buffer, n)
	tasks := slurm.Tasks{Master: master, N: n, Program: self, Args: os.Args[1:],
		Vars: func(r int) []string {
			return []string{fmt.Sprintf("%s=%d,%d,%d,%s,%s,%d,%d", benchCommWorkerEnv, r, n, port, tok, backend, lo, hi)}
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

// srunHpcrunRanks starts the benchmark's ranks with srun on the nodes of
// the allocation this process runs in; rank 0's times come back on srun's
// output.
func srunHpcrunRanks(ctx context.Context, n, nodes int, lo, hi int64, backend string) (map[int64]float64, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("bench comm: find own binary: %w", err)
	}
	tok, err := randomToken()
	if err != nil {
		return nil, err
	}
	port := idrenv.DerivePort(os.Getenv("SLURM_JOB_ID") + "/bench/" + tok[:6])
	var out, errb bytes.Buffer
	cmd := exec.CommandContext(ctx, "srun", "-N", strconv.Itoa(nodes), "-n", strconv.Itoa(n), "--ntasks-per-node", strconv.Itoa(n/nodes), self, "bench", "comm")
	cmd.Env = append(os.Environ(), fmt.Sprintf("%s=slurm,slurm,%d,%s,%s,%d,%d", benchCommWorkerEnv, port, tok, backend, lo, hi))
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("bench comm: srun: %v: %s", err, strings.TrimSpace(errb.String()))
	}
	return parseTimes(&out)
}

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

// runMPIPeer builds bench/mpi/mpi_allreduce.c with mpicc and runs it with
// mpirun, once over shared memory and once over TCP.
// runMPIPeer times Open MPI's all-reduce on this machine, over shared
// memory and over TCP.
func runMPIPeer(ctx context.Context, n int, lo, hi int64) (shm, tcp map[int64]float64, err error) {
	if shm, err = runMPI(ctx, n, lo, hi, "self,vader"); err != nil {
		return nil, nil, err
	}
	if tcp, err = runMPI(ctx, n, lo, hi, "self,tcp"); err != nil {
		return nil, nil, err
	}
	return shm, tcp, nil
}

// runMPI builds bench/mpi/mpi_allreduce.c and runs it on n ranks with
// mpirun and the transports btl; inside a Slurm allocation mpirun places
// the ranks on its nodes.
func runMPI(ctx context.Context, n int, lo, hi int64, btl string) (map[int64]float64, error) {
	mpicc, err := exec.LookPath("mpicc")
	if err != nil {
		return nil, errors.New("mpicc not found (apt-get install openmpi-bin libopenmpi-dev)")
	}
	mpirun, err := exec.LookPath("mpirun")
	if err != nil {
		return nil, errors.New("mpirun not found (apt-get install openmpi-bin)")
	}
	// The binary must be where every node can read it: next to the runs,
	// in the working directory's file system, not in a node's /tmp.
	dir, err := os.MkdirTemp(".", ".hpcrun-bench-mpi-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	src, bin := filepath.Join(dir, "mpi_allreduce.c"), filepath.Join(dir, "mpi_allreduce")
	if err := os.WriteFile(src, bench.MPIAllreduceC, 0o644); err != nil {
		return nil, err
	}
	if out, err := exec.CommandContext(ctx, mpicc, "-O2", "-o", bin, src).CombinedOutput(); err != nil {
		return nil, fmt.Errorf("mpicc: %v: %s", err, out)
	}
	// Yield when idle: the ranks share few cores, and a busy-polling rank
	// would starve the one it waits for (mpirun only yields by itself when
	// it knows it oversubscribes, which inside an allocation it does not).
	args := []string{"-np", strconv.Itoa(n), "--oversubscribe", "--mca", "pml", "ob1", "--mca", "btl", btl, "--mca", "mpi_yield_when_idle", "1"}
	if os.Geteuid() == 0 {
		args = append([]string{"--allow-run-as-root"}, args...)
	}
	args = append(args, bin, strconv.FormatInt(lo, 10), strconv.FormatInt(hi, 10))
	var out, errb bytes.Buffer
	cmd := exec.CommandContext(ctx, mpirun, args...)
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("mpirun --mca btl %s: %v: %s", btl, err, strings.TrimSpace(errb.String()))
	}
	return parseTimes(&out)
}
