// Command planaccuracy measures how far hpcrun plan's step time is from a
// run's on this machine, for plan.AccuracyCases (GPT small, bsz 8, seq
// 128: tp 1, tp 2, dp 2, pp 2 with 4 micro-batches, tp 2 + sp, dp 2 +
// zero 1). It measures the rates first (hpcrun bench gemm --rates-only
// --threads <its cores>, bench comm --nproc 2), runs each case twice (hpcrun run, p50 step time),
// prints predicted, measured, repeat and error, and with -write keeps the
// rates and the times under train/plan/testdata for the plan's test of
// recorded figures. Run it on a quiet machine, from the repository root:
//
//	make build && go run ./scripts/planaccuracy -bin bin/hpcrun -write
package main

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/hpcrun/hpcrun/train/plan"
)

func main() {
	bin := flag.String("bin", "bin/hpcrun", "the hpcrun binary")
	steps := flag.Int("steps", 40, "steps a run")
	skipBench := flag.Bool("skip-bench", false, "keep the rates already measured (the user's cache)")
	write := flag.Bool("write", false, "write the rates and the times under train/plan/testdata")
	flag.Parse()
	if err := run(*bin, *steps, *skipBench, *write); err != nil {
		fmt.Fprintln(os.Stderr, "planaccuracy:", err)
		os.Exit(1)
	}
}

func run(bin string, steps int, skipBench, write bool) error {
	bin, err := filepath.Abs(bin)
	if err != nil {
		return err
	}
	load0 := plan.LoadAverage()
	if !skipBench {
		if err := hpcrun(os.Stdout, bin, "bench", "gemm", "--rates-only", "--threads", strconv.Itoa(runtime.NumCPU())); err != nil {
			return err
		}
		if err := hpcrun(os.Stdout, bin, "bench", "comm", "--nproc", "2", "--no-mpi", "--repeat", "3"); err != nil {
			return err
		}
	}
	rates, err := plan.LoadCPURates()
	if err != nil {
		return err
	}
	comm, err := plan.LoadCommRates()
	if err != nil {
		return err
	}
	runs, err := os.MkdirTemp("", "planaccuracy-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(runs)
	cases := append([]plan.AccuracyCase(nil), plan.AccuracyCases...)
	// Two passes, the second in reverse order, so that drift shows.
	for pass := range 2 {
		for k := range cases {
			i := k
			if pass == 1 {
				i = len(cases) - 1 - k
			}
			s, err := measure(bin, runs, steps, cases[i])
			if err != nil {
				return fmt.Errorf("%s: %w", cases[i].Name, err)
			}
			if pass == 0 {
				cases[i].MeasuredS = s
			} else {
				cases[i].MeasuredRepS = s
			}
			fmt.Printf("%-10s pass %d: p50 step %.4f s\n", cases[i].Name, pass+1, s)
		}
	}
	load1 := plan.LoadAverage()
	fmt.Printf("\n%-10s %10s %10s %10s %8s %8s\n", "case", "predicted", "measured", "repeat", "error", "repeats")
	for _, c := range cases {
		p, err := plan.AccuracyPlan(c, runtime.NumCPU(), rates, comm)
		if err != nil {
			return err
		}
		fmt.Printf("%-10s %9.1fms %9.1fms %9.1fms %+7.1f%% %7.1f%%\n", c.Name, 1e3*p.Time.StepS, 1e3*c.MeasuredS, 1e3*c.MeasuredRepS,
			100*(p.Time.StepS-c.MeasuredS)/c.MeasuredS, 100*math.Abs(c.MeasuredRepS-c.MeasuredS)/c.MeasuredS)
	}
	machine := fmt.Sprintf("%s, %d cores, %s, %d steps a run", rates.CPU, runtime.NumCPU(), time.Now().UTC().Format(time.DateOnly), steps)
	fmt.Printf("machine: %s; load average %.2f before, %.2f after\n", machine, load0, load1)
	if !write {
		return nil
	}
	dir := filepath.Join("train", "plan", "testdata")
	for _, f := range []string{"cpu-gemm.json", "cpu-comm.json"} {
		src, _ := plan.CPURatesPath()
		b, err := os.ReadFile(filepath.Join(filepath.Dir(src), f))
		if err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(dir, "rates", f), b, 0o644); err != nil {
			return err
		}
	}
	var buf bytes.Buffer
	if err := (plan.AccuracyTable{NumCPU: runtime.NumCPU(), Machine: machine, Load: [2]float64{load0, load1}, Cases: cases}).WriteTSV(&buf); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "accuracy.tsv"), buf.Bytes(), 0o644)
}

// measure runs c for steps steps with hpcrun run and returns its p50 step
// time.
func measure(bin, runs string, steps int, c plan.AccuracyCase) (float64, error) {
	args := append([]string{"run", "--runs-dir", runs, "--ckpt-every", "-1", "--steps", strconv.Itoa(steps)}, c.Flags()...)
	var out bytes.Buffer
	if err := hpcrun(&out, bin, args...); err != nil {
		return 0, fmt.Errorf("%v: %s", err, lastLines(out.String()))
	}
	out.Reset()
	if err := hpcrun(&out, bin, "metrics", "--runs-dir", runs, "--last", "1", "--json"); err != nil {
		return 0, err
	}
	var sum struct {
		P50 float64 `json:"step_p50_s"`
	}
	if err := json.Unmarshal(out.Bytes(), &sum); err != nil || !(sum.P50 > 0) {
		return 0, fmt.Errorf("no p50 step time in hpcrun metrics --json (%v)", err)
	}
	return sum.P50, nil
}

// hpcrun runs bin with args, its output to out.
func hpcrun(out io.Writer, bin string, args ...string) error {
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("hpcrun %s: %w", strings.Join(args, " "), err)
	}
	return nil
}

// lastLines are the last five lines of s.
func lastLines(s string) string {
	l := strings.Split(strings.TrimSpace(s), "\n")
	return strings.Join(l[max(0, len(l)-5):], "\n")
}
