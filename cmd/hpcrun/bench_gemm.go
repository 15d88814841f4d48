package main

import (
	"fmt"
	"runtime"
	"slices"
	"time"

	"github.com/hpcrun/hpcrun/bench"
	"github.com/hpcrun/hpcrun/tensor"
	"github.com/urfave/cli/v2"
)

func benchGemmCommand() *cli.Command {
	return &cli.Command{
		Name:  "gemm",
		Usage: "GEMM GFLOP/s next to OpenBLAS sgemm, measured in the same run",
		Description: "Times tensor.Sgemm and OpenBLAS cblas_sgemm alternately on square and transformer\n" +
			"shapes and prints the median GFLOP/s of each and the median ratio of the rounds.\n" +
			"OpenBLAS is present only in a binary built with CGO_ENABLED=1 -tags openblas.\n" +
			"Then measures, for hpcrun plan, the engine's rate on the shapes of a step's GEMMs and its\n" +
			"Add/AdamW bandwidth at 1 to --threads threads, kept with the date and the CPU model.",
		Flags: []cli.Flag{
			&cli.IntFlag{Name: "threads", Value: runtime.NumCPU(), Usage: "threads for both libraries (the rates are measured at 1 to this many)"},
			&cli.IntFlag{Name: "rounds", Value: 5, Usage: "alternating rounds per shape (the median is reported)"},
			&cli.DurationFlag{Name: "min-time", Value: 200 * time.Millisecond, Usage: "least time one library runs a shape per round"},
			&cli.StringSliceFlag{Name: "shape", Usage: "benchmark `MxNxK` instead of the default shapes (repeatable)"},
			&cli.BoolFlag{Name: "quick", Usage: "skip the 2048 and lm-head shapes"},
			&cli.BoolFlag{Name: "rates-only", Usage: "measure only the plan's rates, not the comparison"},
		},
		Action: func(c *cli.Context) error {
			threads, rounds, minTime := c.Int("threads"), c.Int("rounds"), c.Duration("min-time")
			if threads < 1 {
				return cli.Exit(fmt.Sprintf("bench gemm: --threads %d: give at least 1", threads), 2)
			}
			if rounds < 1 {
				return cli.Exit(fmt.Sprintf("bench gemm: --rounds %d: give at least 1", rounds), 2)
			}
			if minTime <= 0 {
				return cli.Exit(fmt.Sprintf("bench gemm: --min-time %v: give a positive duration such as 200ms", minTime), 2)
			}
			shapes := bench.DefaultGemmShapes
			if specs := c.StringSlice("shape"); len(specs) > 0 {
				shapes = nil
				for _, s := range specs {
					sh, err := bench.ParseGemmShape(s)
					if err != nil {
						return cli.Exit("bench gemm: "+err.Error(), 2)
					}
					shapes = append(shapes, sh)
				}
			} else if c.Bool("quick") {
				shapes = slices.DeleteFunc(slices.Clone(shapes), func(s tensor.GemmShape) bool {
					return s.M*s.N*s.K > 1<<30
				})
			}
			peer, ok := tensor.OpenBLASPeer()
			if ok {
				if err := bench.ReexecWithOpenBLASCore(peer); err != nil {
					return cli.Exit("bench gemm: "+err.Error(), 1)
				}
			} else {
				peer = nil
			}
			if !c.Bool("rates-only") {
				if _, err := bench.Gemm(c.App.Writer, shapes, peer, threads, rounds, minTime); err != nil {
					return err
				}
			}
			fmt.Fprintf(c.App.Writer, "\nrates for hpcrun plan: the engine's GEMMs of a step and its bandwidth, best of %d rounds of >= %v\n", min(rounds, 2), minTime/4)
			gemms, err := bench.RateShapes()
			if err != nil {
				return err
			}
			r, err := bench.Rates(c.App.Writer, gemms, bench.RateThreads(threads), min(rounds, 2), minTime/4, true)
			if err != nil {
				return err
			}
			return bench.SaveRates(c.App.Writer, r)
		},
	}
}
