package plan

import (
	"bufio"
	"fmt"
	"io"
	"strconv"
	"strings"

	"github.com/hpcrun/hpcrun/train/config"
)

// This file is the plan's accuracy on the CPU: the layouts of a small GPT
// it is checked on (AccuracyCases), the file their measured step times are
// recorded in (testdata/accuracy.tsv, written by scripts/planaccuracy and
// read by its test) and the plan of each on the machine they ran on.

// AccuracyCase is one layout of the accuracy table: GPT small, bsz 8, seq
// 128, on one host through the local launcher, or over Nodes hosts of a
// Slurm allocation with one core a task.
type AccuracyCase struct {
	Name         string
	NTasks, TP   int
	PP, Micro    int
	SP           bool
	Zero         int
	Nodes        int     // 0: one host, hpcrun run
	MeasuredS    float64 // p50 step seconds, 0 when not measured
	MeasuredRepS float64 // a repeat's, 0 when none
	// CommS and CommRepS are the two runs' time in the collectives and
	// point-to-point transfers a step (the p50 over the steps; before
	// 2026-11-27 comm share x p50 step), 0 when not measured.
	CommS, CommRepS float64
}

// AccuracyCases are the layouts: tp 1 on one rank, tp 2, dp 2, pp 2 with
// 4 micro-batches, tp 2 with sequence parallelism, dp 2 with ZeRO-1, tp 2
// x dp 2 (4 ranks taking turns on 2 cores), and dp 2 and pp 2 over two
// hosts.
var AccuracyCases = []AccuracyCase{
	{Name: "tp1", NTasks: 1, TP: 1},
	{Name: "tp2", NTasks: 2, TP: 2},
	{Name: "dp2", NTasks: 2, TP: 1},
	{Name: "pp2-m4", NTasks: 2, TP: 1, PP: 2, Micro: 4},
	{Name: "tp2-sp", NTasks: 2, TP: 2, SP: true},
	{Name: "dp2-zero1", NTasks: 2, TP: 1, Zero: 1},
	{Name: "tp2-dp2", NTasks: 4, TP: 2},
	{Name: "dp2-2hosts", NTasks: 2, TP: 1, Nodes: 2},
	{Name: "pp2-m4-2hosts", NTasks: 2, TP: 1, PP: 2, Micro: 4, Nodes: 2},
}

// Config is the case's training config.
func (c AccuracyCase) Config() (config.Config, error) {
	cfg := config.DefaultConfig()
	cfg.Model = "gpt"
	if err := cfg.ApplyPreset("small"); err != nil {
		return cfg, err
	}
	cfg.BatchSize, cfg.Seq = 8, 128
	cfg.NTasks, cfg.TP, cfg.PP, cfg.MicroBatches, cfg.SP, cfg.Zero = c.NTasks, c.TP, max(c.PP, 1), c.Micro, c.SP, c.Zero
	return cfg, cfg.Validate()
}

// Flags are the case's flags of hpcrun run and hpcrun plan.
func (c AccuracyCase) Flags() []string {
	f := []string{"--model", "gpt", "--preset", "small", "--bsz", "8", "--seq", "128", "--ntasks", strconv.Itoa(c.NTasks), "--tp", strconv.Itoa(c.TP)}
	if c.PP > 1 {
		f = append(f, "--pp", strconv.Itoa(c.PP), "--micro-batches", strconv.Itoa(c.Micro))
	}
	if c.SP {
		f = append(f, "--sp")
	}
	if c.Zero > 0 {
		f = append(f, "--zero", strconv.Itoa(c.Zero))
	}
	if c.Nodes > 1 {
		f = append(f, "--nodes", strconv.Itoa(c.Nodes), "--cpus-per-task", "1")
	}
	return f
}

// AccuracyTable is testdata/accuracy.tsv: the machine the cases ran on
// and their measured step times.
type AccuracyTable struct {
	NumCPU  int
	Machine string // the CPU, the date, the steps: a comment
	// Load is the machine's 1-minute load average before and after the
	// runs: above NumCPU before them, the figures are a busy machine's
	// (after them it holds the runs' own ranks: 4 of tp2-dp2's on 2 cores).
	Load  [2]float64
	Cases []AccuracyCase
}

// Busy says the machine was busy with other work when the cases began: a
// load average above its cores. The repeats' agreement says whether it
// stayed quiet.
func (t AccuracyTable) Busy() bool {
	return t.Load[0] > float64(t.NumCPU)
}

// WriteTSV writes the table: a line saying the figures are provisional
// when the machine was busy, "# numcpu N", "# load BEFORE AFTER", "#
// machine ...", then a line a case, name, the two p50 step times and the
// two comm times in seconds, tab-separated.
func (t AccuracyTable) WriteTSV(w io.Writer) error {
	if t.Busy() {
		fmt.Fprintf(w, "# PROVISIONAL: a busy machine's figures (load above its cores): TestRecordedAccuracy logs them and does not check them\n")
	}
	fmt.Fprintf(w, "# numcpu %d\n# load %.2f %.2f\n# machine %s\n# case\tmeasured_s\trepeat_s\tcomm_s\tcomm_repeat_s\n", t.NumCPU, t.Load[0], t.Load[1], t.Machine)
	for _, c := range t.Cases {
		fmt.Fprintf(w, "%s\t%.4f\t%.4f\t%.5f\t%.5f\n", c.Name, c.MeasuredS, c.MeasuredRepS, c.CommS, c.CommRepS)
	}
	return nil
}

// ReadAccuracyTSV reads what WriteTSV wrote (or, before the comm times,
// its first three columns); the cases are AccuracyCases' of those names.
func ReadAccuracyTSV(r io.Reader) (AccuracyTable, error) {
	var t AccuracyTable
	sc := bufio.NewScanner(r)
	for line := 1; sc.Scan(); line++ {
		text := sc.Text()
		if v, ok := strings.CutPrefix(text, "# numcpu "); ok {
			n, err := strconv.Atoi(strings.TrimSpace(v))
			if err != nil || n < 1 {
				return t, fmt.Errorf("accuracy.tsv:%d: numcpu %q", line, v)
			}
			t.NumCPU = n
			continue
		}
		if v, ok := strings.CutPrefix(text, "# load "); ok {
			if _, err := fmt.Sscan(v, &t.Load[0], &t.Load[1]); err != nil {
				return t, fmt.Errorf("accuracy.tsv:%d: load %q: want two load averages", line, v)
			}
			continue
		}
		if v, ok := strings.CutPrefix(text, "# machine "); ok {
			t.Machine = v
			continue
		}
		if strings.HasPrefix(text, "#") || strings.TrimSpace(text) == "" {
			continue
		}
		f := strings.Split(text, "\t")
		i := -1
		for j, c := range AccuracyCases {
			if c.Name == f[0] {
				i = j
			}
		}
		if (len(f) != 3 && len(f) != 5) || i < 0 {
			return t, fmt.Errorf("accuracy.tsv:%d: want a case name, two step times and two comm times, got %q", line, text)
		}
		c := AccuracyCases[i]
		v := make([]float64, 4)
		for j := range f[1:] {
			x, err := strconv.ParseFloat(f[1+j], 64)
			if err != nil || x < 0 {
				return t, fmt.Errorf("accuracy.tsv:%d: bad time %q in %q", line, f[1+j], text)
			}
			v[j] = x
		}
		c.MeasuredS, c.MeasuredRepS, c.CommS, c.CommRepS = v[0], v[1], v[2], v[3]
		if !(c.MeasuredS > 0) {
			return t, fmt.Errorf("accuracy.tsv:%d: bad step time in %q", line, text)
		}
		t.Cases = append(t.Cases, c)
	}
	if t.NumCPU == 0 {
		return t, fmt.Errorf("accuracy.tsv: no # numcpu line")
	}
	return t, sc.Err()
}

// AccuracyPlan is the plan of c on a machine of numCPU cores with the
// rates and comm fits given, its ranks started by the local launcher (as
// hpcrun run starts them) or, over several nodes, by srun with one core a
// task, with the vocabulary of GPT small's byte tokenizer (256).
func AccuracyPlan(c AccuracyCase, numCPU int, rates *CPURates, comm *CommRates) (*Plan, error) {
	cfg, err := c.Config()
	if err != nil {
		return nil, err
	}
	m := Machine{NumCPU: numCPU, Mem: 16 * gib, Load: -1}
	if rates != nil {
		m.CPU, m.Now = rates.CPU, rates.Measured
	}
	share := Share{TasksPerNode: c.NTasks, Launcher: LaunchLocal}
	if c.Nodes > 1 {
		share = Share{TasksPerNode: c.NTasks / c.Nodes, CPUsPerTask: 1, Launcher: LaunchSlurm}
	}
	dev := hostCPU(share, m, rates, nil, comm)
	return New(Request{Config: cfg, Vocab: 256, Nodes: max(c.Nodes, 1), Device: dev})
}
