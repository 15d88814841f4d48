// Command planaccuracy measures how far hpcrun plan's step and comm times
// are from a run's on this machine, for plan.AccuracyCases (GPT small, bsz
// 8, seq 128: tp 1, tp 2, dp 2, pp 2 with 4 micro-batches, tp 2 + sp, dp
// 2 + zero 1, tp 2 x dp 2 on this host; dp 2 and pp 2 over two hosts of the local
// Slurm). It measures the rates first (hpcrun bench gemm --rates-only
// --threads <its cores>, bench comm --nproc 2 and --nproc 2 --nodes 2),
// runs each case twice in a row (-runs N: 2N times, alternating, each
// column the mean of N; hpcrun run, or submit --executor slurm --wait
// over hosts; p50 step time, p50 comm time a step), prints
// predicted, measured, repeat and error, and with -write keeps the rates
// and the times under train/plan/testdata for the plan's test of recorded
// figures. Run it on a quiet machine, from the repository root, with the
// local Slurm up (scripts/slurm-local.sh up --nodes 3):
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

	"github.com/hpcrun/hpcrun/internal/atomicfile"
	"github.com/hpcrun/hpcrun/train/plan"
)

func main() {
	bin := flag.String("bin", "bin/hpcrun", "the hpcrun binary")
	steps := flag.Int("steps", 40, "steps a run")
	runs := flag.Int("runs", 1, "runs of each case a column: each column is their mean, the two columns' runs alternating")
	skipBench := flag.Bool("skip-bench", false, "keep the rates already measured (the user's cache)")
	write := flag.Bool("write", false, "write the rates and the times under train/plan/testdata")
	flag.Parse()
	if *runs < 1 {
		fmt.Fprintln(os.Stderr, "planaccuracy: -runs must be 1 or more")
		os.Exit(2)
	}
	if err := run(*bin, *steps, *runs, *skipBench, *write); err != nil {
		fmt.Fprintln(os.Stderr, "planaccuracy:", err)
		os.Exit(1)
	}
}

func run(bin string, steps, runsACol int, skipBench, write bool) error {
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
		if err := hpcrun(os.Stdout, bin, "bench", "comm", "--nproc", "2", "--nodes", "2", "--no-mpi", "--repeat", "3"); err != nil {
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
	// Each case twice in a row (or 2 x runsACol times, alternating between
	// the columns, each column their mean): the repeat says how far two
	// runs differ here and now (this machine's speed drifts by 10-17% over
	// 20 minutes, which two passes apart would measure instead).
	for i := range cases {
		var sum [2][2]float64
		for k := range 2 * runsACol {
			s, comm, err := measure(bin, runs, steps, cases[i])
			if err != nil {
				return fmt.Errorf("%s: %w", cases[i].Name, err)
			}
			sum[k%2][0], sum[k%2][1] = sum[k%2][0]+s, sum[k%2][1]+comm
			fmt.Printf("%-13s run %d: p50 step %.4f s, p50 comm %.4f s\n", cases[i].Name, k+1, s, comm)
		}
		n := float64(runsACol)
		cases[i].MeasuredS, cases[i].CommS = sum[0][0]/n, sum[0][1]/n
		cases[i].MeasuredRepS, cases[i].CommRepS = sum[1][0]/n, sum[1][1]/n
	}
	load1 := plan.LoadAverage()
	fmt.Printf("\n%-13s %10s %10s %10s %8s %8s   %10s %10s %10s %8s\n", "case", "predicted", "measured", "repeat", "error", "repeats", "comm pred", "comm", "repeat", "error")
	for _, c := range cases {
		p, err := plan.AccuracyPlan(c, runtime.NumCPU(), rates, comm)
		if err != nil {
			return err
		}
		mean, commMean := (c.MeasuredS+c.MeasuredRepS)/2, (c.CommS+c.CommRepS)/2
		fmt.Printf("%-13s %9.1fms %9.1fms %9.1fms %+7.1f%% %7.1f%%   %9.2fms %9.2fms %9.2fms %+7.1f%%\n", c.Name, 1e3*p.Time.StepS, 1e3*c.MeasuredS, 1e3*c.MeasuredRepS,
			100*(p.Time.StepS-mean)/mean, 100*math.Abs(c.MeasuredRepS-c.MeasuredS)/c.MeasuredS,
			1e3*p.Time.EngineCommS(), 1e3*c.CommS, 1e3*c.CommRepS, 100*(p.Time.EngineCommS()-commMean)/commMean)
	}
	machine := fmt.Sprintf("%s, %d cores, %s, %d steps a run, %d runs a column", rates.CPU, runtime.NumCPU(), time.Now().UTC().Format(time.DateOnly), steps, runsACol)
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
		if err := atomicfile.WriteFile(filepath.Join(dir, "rates", f), b, 0o644); err != nil {
			return err
		}
	}
	var buf bytes.Buffer
	if err := (plan.AccuracyTable{NumCPU: runtime.NumCPU(), Machine: machine, Load: [2]float64{load0, load1}, Cases: cases}).WriteTSV(&buf); err != nil {
		return err
	}
	return atomicfile.WriteFile(filepath.Join(dir, "accuracy.tsv"), buf.Bytes(), 0o644)
}

// measure runs c for steps steps with hpcrun run (over hosts, hpcrun
// submit to the local Slurm, waited for) and returns its p50 step time
// and its p50 comm time a step (the typical step's, as the step time is:
// the mean, comm share x p50, moved 40% between passes with the steps a
// rank was held up).
func measure(bin, runs string, steps int, c plan.AccuracyCase) (step, comm float64, err error) {
	args := []string{"run"}
	if c.Nodes > 1 {
		args = []string{"submit", "--executor", "slurm", "--wait"}
	}
	args = append(append(args, "--runs-dir", runs, "--ckpt-every", "-1", "--steps", strconv.Itoa(steps)), c.Flags()...)
	var out bytes.Buffer
	if err := hpcrun(&out, bin, args...); err != nil {
		return 0, 0, fmt.Errorf("%v: %s", err, lastLines(out.String()))
	}
	out.Reset()
	if err := hpcrun(&out, bin, "metrics", "--runs-dir", runs, "--last", "1", "--json"); err != nil {
		return 0, 0, err
	}
	var sum struct {
		Status  string  `json:"status"`
		P50     float64 `json:"step_p50_s"`
		CommP50 float64 `json:"comm_p50_s"`
	}
	if err := json.Unmarshal(out.Bytes(), &sum); err != nil || !(sum.P50 > 0) || sum.Status != "completed" {
		return 0, 0, fmt.Errorf("no p50 step time of a completed run in hpcrun metrics --json (status %q, %v)", sum.Status, err)
	}
	return sum.P50, sum.CommP50, nil
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
