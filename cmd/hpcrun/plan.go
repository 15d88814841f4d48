package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"runtime"
	"slices"

	"github.com/hpcrun/hpcrun/internal/units"
	"github.com/hpcrun/hpcrun/slurm"
	"github.com/hpcrun/hpcrun/train"
	trainconfig "github.com/hpcrun/hpcrun/train/config"
	"github.com/hpcrun/hpcrun/train/plan"
	"github.com/urfave/cli/v2"
)

// notPlanFlags are submit's flags that make no sense for a plan: plan
// takes submit's other flags.
var notPlanFlags = []string{"dry-run", "wait", "resume", "check", "force", "template"}

func planCommand() *cli.Command {
	var flags []cli.Flag
	for _, f := range submitCommand().Flags {
		if !slices.Contains(notPlanFlags, f.Names()[0]) {
			flags = append(flags, f)
		}
	}
	return &cli.Command{
		Name:  "plan",
		Usage: "predict a run's memory per rank, whether it fits, and its step time, before submitting it",
		Description: "Takes submit's flags and prints, per rank: parameters, gradients, AdamW moments,\n" +
			"activations per block (tensor-parallel split; --sp splits the layer norms and residuals\n" +
			"along the sequence; --zero 1 shards the moments over dp), logits and loss buffers, GPU\n" +
			"workspace, comm buffers and the CUDA context; the device's memory and whether the run\n" +
			"fits (and what would, when it does not: --sp, --zero 1, a larger tp, a smaller batch\n" +
			"with grad-accum, more nodes); a step time from the GEMM FLOPs at the device's rate\n" +
			"plus the collectives' bytes at the link's bandwidth; tokens/s and MFU.\n" +
			"The device is --gpu, else the profile's gpu key, else the CPU (its GEMM rate from the\n" +
			"last `hpcrun bench gemm`, else a stated default). submit --dry-run prints the same.",
		Flags:  flags,
		Action: runPlan,
	}
}

func runPlan(c *cli.Context) error {
	if c.NArg() > 0 {
		return cli.Exit(fmt.Sprintf("plan takes no arguments, got %q", c.Args().First()), 2)
	}
	p, err := planSubmit(c, false)
	if err != nil {
		return err
	}
	if p.plan == nil {
		return errors.New(p.planNote)
	}
	if wantJSON(c) {
		return writePlanJSON(c.App.Writer, p)
	}
	return p.plan.WriteText(c.App.Writer, p.suggest)
}

// predictRun makes the plan of p's training run. It returns a nil plan and
// why when the device is a GPU that nobody named.
func predictRun(p *submitPlan) (*plan.Plan, []plan.Suggestion, string, error) {
	lay, err := p.spec.Layout()
	if err != nil {
		return nil, nil, "", err
	}
	dev, why, err := plan.RankDevice(p.gpu, p.train, rankShare(lay, p.spec.CPUsPerTask))
	if err != nil || why != "" {
		return nil, nil, why, err
	}
	// The vocabulary without the data when it can be known so; a
	// WordPiece built from a data file only from the data, which plan
	// does not read (it plans for the most the vocabulary can hold).
	vocab, exact, err := train.PlanVocab(p.train)
	if err != nil {
		return nil, nil, "", err
	}
	if !exact && p.readData {
		data, err := train.Prepare(p.train)
		if err != nil {
			return nil, nil, "", err
		}
		vocab = data.Vocab
	}
	pl, sug, err := plan.Predict(plan.Request{Config: p.train, Vocab: vocab, Nodes: lay.Nodes, Device: dev}, exact || p.readData)
	return pl, sug, "", err
}

// rankShare is how the ranks of a run laid out as lay, cpusPerTask cores
// each, share a node.
func rankShare(lay slurm.Layout, cpusPerTask int) plan.Share {
	return plan.Share{TasksPerNode: lay.TasksPerNode, GPUsPerNode: lay.GPUsPerNode, CPUsPerTask: cpusPerTask}
}

// planJSON is hpcrun plan --json.
type planJSON struct {
	*plan.Plan
	Suggestions []plan.Suggestion `json:"suggestions,omitempty"`
}

func writePlanJSON(w io.Writer, p *submitPlan) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(planJSON{Plan: p.plan, Suggestions: p.suggest})
}

// bytesIEC writes n bytes as the CLI does, units.Bytes with two decimals.
func bytesIEC(n int64) string { return units.Bytes(n, 2) }

// refuseUnfitHere refuses, as submit does without --force, a run of
// ntasks ranks on this machine (hpcrun run) that the plan says does not fit
// a rank's share of this machine's memory. A run on GPUs, which the plan
// cannot name here, is not refused.
func refuseUnfitHere(cfg trainconfig.Config) error {
	lay := slurm.Layout{Nodes: 1, TasksPerNode: cfg.NTasks}
	dev, why, err := plan.RankDevice("", cfg, rankShare(lay, max(1, runtime.NumCPU()/max(cfg.NTasks, 1))))
	if err != nil || why != "" || dev.MemBytes <= 0 {
		return nil
	}
	data, err := train.Prepare(cfg)
	if err != nil {
		return err
	}
	pl, sug, err := plan.Predict(plan.Request{Config: cfg, Vocab: data.Vocab, Nodes: 1, Device: dev}, true)
	if err != nil || pl.Fits {
		return err
	}
	return cli.Exit(pl.Refusal(sug, "run --force to start it anyway"), 1)
}

// refuseUnfit is submit's error for a run that does not fit.
func refuseUnfit(p *submitPlan) error {
	return cli.Exit(p.plan.Refusal(p.suggest, "submit --force to submit it anyway"), 1)
}
