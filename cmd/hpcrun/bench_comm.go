package main

import (
	"fmt"
	"os"
	"os/exec"
	"strconv"

	"github.com/hpcrun/hpcrun/bench"
	"github.com/hpcrun/hpcrun/internal/units"
	"github.com/hpcrun/hpcrun/nccl"
	"github.com/urfave/cli/v2"
)

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
			"with mpirun in the same allocation (shared memory within a node, TCP between).\n\n" +
			"It keeps, for hpcrun plan, a latency and a bus bandwidth fitted to hpcrun's\n" +
			"times, and the skew a collective adds in training: the wait for the slowest\n" +
			"rank after the same GEMM on every rank (1 and 20 ms of it), as a fixed part\n" +
			"and a share of the work before the collective.",
		Flags: []cli.Flag{
			&cli.IntFlag{Name: "nproc", Value: 4, Usage: "number of `RANKS`"},
			&cli.StringFlag{Name: "min", Value: "4KiB", Usage: "smallest buffer `SIZE`"},
			&cli.StringFlag{Name: "max", Value: "64MiB", Usage: "largest buffer `SIZE`"},
			&cli.StringFlag{Name: "backend", Value: nccl.BackendAuto, Usage: "hpcrun backend: auto (TCP ring + shared memory) or tcp"},
			&cli.BoolFlag{Name: "no-mpi", Usage: "skip the Open MPI peer"},
			&cli.IntFlag{Name: "repeat", Value: 2, Usage: "run each side `N` times, alternating, and show each size's best and median time (the machine may be shared)"},
			&cli.IntFlag{Name: "nodes", Usage: "spread the ranks over `N` nodes of a Slurm allocation (0: this machine)"},
		},
		Action: func(c *cli.Context) error {
			if spec := os.Getenv(bench.CommWorkerEnv); spec != "" {
				return bench.CommWorker(spec, c.App.Writer)
			}
			if c.NArg() > 0 {
				return fmt.Errorf("bench comm takes no arguments, got %q", c.Args().Slice())
			}
			n := c.Int("nproc")
			if n < 2 || n > 64 {
				return fmt.Errorf("--nproc %d: use 2..64 ranks", n)
			}
			lo, err := units.ParseBytes(c.String("min"))
			if err != nil {
				return fmt.Errorf("--min: %w", err)
			}
			hi, err := units.ParseBytes(c.String("max"))
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
			self, err := os.Executable()
			if err != nil {
				return fmt.Errorf("bench comm: find own binary: %w", err)
			}
			rep, err := bench.Comm(c.Context, bench.CommOptions{N: n, Nodes: nodes, Min: lo, Max: hi, Backend: b, MPI: !c.Bool("no-mpi"),
				Repeat: c.Int("repeat"), Program: self, Args: os.Args[1:], Warn: c.App.ErrWriter})
			if err == nil {
				err = rep.SaveFit(c.App.ErrWriter)
			}
			if err != nil {
				return err
			}
			if c.Bool("json") {
				return writeJSON(c, rep)
			}
			return rep.WriteText(c.App.Writer)
		},
	}
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
