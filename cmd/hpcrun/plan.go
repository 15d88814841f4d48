package main

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"

	"github.com/hpcrun/hpcrun/internal/sweep"
	"github.com/hpcrun/hpcrun/internal/units"
	"github.com/hpcrun/hpcrun/slurm"
	trainconfig "github.com/hpcrun/hpcrun/train/config"
	"github.com/hpcrun/hpcrun/train/data"
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
	flags = append(flags,
		&cli.BoolFlag{Name: "auto", Usage: "rank every layout of --ntasks (tp x pp x dp, sp, zero, micro-batches) that fits, keeping the global batch (bsz x micro-batches x dp of the flags' layout)"},
		&cli.IntFlag{Name: "top", Value: 5, Usage: "with --auto, print the best `N` layouts (0: all)"},
		&cli.StringFlag{Name: "cluster", Usage: "plan at scale on a preset `CLUSTER` (" + strings.Join(plan.ClusterNames(), ", ") + "; default: the profile's cluster key; none: the engine's plan): a GPT trained as Megatron-LM does, simulated (plan-only)"},
		&cli.IntFlag{Name: "interleave", Usage: "with --cluster, the interleaved 1F1B schedule's virtual stages a rank holds (plan-only: the engine runs plain 1F1B)"})
	return &cli.Command{
		Name:  "plan",
		Usage: "predict a run's memory per rank, whether it fits, and its step time, before submitting it",
		Description: "Takes submit's flags and prints, per rank: parameters, gradients, AdamW moments,\n" +
			"activations per block (tensor-parallel split; --sp splits the layer norms and residuals\n" +
			"along the sequence; --zero 1 shards the moments over dp), logits and loss buffers, GPU\n" +
			"workspace, comm buffers and the CUDA context; the device's memory and whether the run\n" +
			"fits (and what would, when it does not: --sp, --zero 1, a larger tp, a smaller batch\n" +
			"with grad-accum, more nodes); a step time from the GEMM FLOPs at the device's rate\n" +
			"plus the collectives' latency and bytes at the link's bandwidth; tokens/s and MFU.\n" +
			"The device is --gpu, else the profile's gpu key, else the CPU (GEMMs by shape and bandwidth\n" +
			"from `hpcrun bench gemm`, collectives from `bench comm`, else stated defaults).\n" +
			"submit --dry-run prints the same.\n" +
			"--auto plans every layout of the tasks instead and prints the --top fastest that fit.",
		Flags:  flags,
		Action: runPlan,
	}
}

func runPlan(c *cli.Context) error {
	if c.NArg() > 0 {
		return cli.Exit(fmt.Sprintf("plan takes no arguments, got %q", c.Args().First()), 2)
	}
	if done, err := planAtScale(c); done {
		return err
	}
	p, err := planSubmit(c, false)
	if err != nil {
		return err
	}
	if p.plan == nil {
		return errors.New(p.planNote)
	}
	if c.Bool("auto") {
		res, err := planAuto(p)
		if err != nil {
			return cli.Exit("plan --auto: "+sweep.OneLine(err), 1)
		}
		res.Flags = flagsBut(c, autoFlags...)
		if wantJSON(c) {
			enc := json.NewEncoder(c.App.Writer)
			enc.SetIndent("", "  ")
			return enc.Encode(res)
		}
		return plan.WriteAuto(c.App.Writer, res, c.Int("top"))
	}
	if c.IsSet("top") {
		return cli.Exit("plan: --top needs --auto", 2)
	}
	if wantJSON(c) {
		return writePlanJSON(c.App.Writer, p)
	}
	return p.plan.WriteText(c.App.Writer, p.suggest)
}

// planAtScale is hpcrun plan --cluster (plan.ScaleCommand): the train
// flags' model and layout on a preset cluster (--cluster, else the
// profile's; none: neither), no executor involved. done is false when
// there is no cluster: the engine's plan follows.
func planAtScale(c *cli.Context) (done bool, err error) {
	cfg, err := resolveConfig(c)
	if err != nil {
		return true, err
	}
	name := cmp.Or(c.String("cluster"), cfg.Profile.Cluster)
	if name == "" || name == "none" {
		if c.IsSet("interleave") {
			return true, cli.Exit("plan: --interleave needs --cluster", 2)
		}
		return false, nil
	}
	tc := cfg.Train
	if err := applyTrainFlags(c, &tc); err != nil {
		return true, err
	}
	vocab, _, err := data.PlanVocab(tc)
	if err == nil {
		err = plan.ScaleCommand(c.App.Writer, plan.ScaleOptions{Config: tc, Vocab: vocab, Cluster: name,
			Interleave: c.Int("interleave"), Auto: c.Bool("auto"), Top: c.Int("top"), JSON: wantJSON(c),
			Flags: flagsBut(c, autoFlags...)})
	}
	if err != nil {
		return true, cli.Exit("plan --cluster: "+sweep.OneLine(err), 1)
	}
	return true, nil
}

// autoFlags are the flags that plan --auto's command for the first layout
// does not repeat from the command line: the layout's, which the search
// chooses (plan.Layout.Flags), with the tasks and nodes it keeps, and the
// flags of plan alone.
var autoFlags = []string{"ntasks", "nodes", "tp", "pp", "pp-split", "micro-batches", "grad-accum", "bsz", "sp", "zero", "recompute",
	"interleave", "auto", "top", "cluster", "json"}

// flagsBut is the flags set on c's command line, but those named in drop,
// as one shell-quoted string in the order of the command's flags: e.g.
// "--preset small --model gpt --steps 300 --lr 0.0003".
func flagsBut(c *cli.Context, drop ...string) string {
	set := c.LocalFlagNames()
	var words []string
	for _, f := range c.Command.Flags {
		names := f.Names()
		if slices.ContainsFunc(names, func(n string) bool { return slices.Contains(drop, n) }) ||
			!slices.ContainsFunc(names, func(n string) bool { return slices.Contains(set, n) }) {
			continue
		}
		name := names[0]
		if _, ok := f.(*cli.BoolFlag); ok {
			if c.Bool(name) {
				words = append(words, "--"+name)
			} else {
				words = append(words, "--"+name+"=false")
			}
			continue
		}
		words = append(words, "--"+name, slurm.Quote(fmt.Sprint(c.Value(name))))
	}
	return strings.Join(words, " ")
}

// predictRun makes the plan of p's training run. It returns a nil plan and
// why when the device is a GPU that nobody named.
func predictRun(p *submitPlan) (*plan.Plan, []plan.Suggestion, string, error) {
	r, known, why, err := planRequest(p)
	if err != nil || why != "" {
		return nil, nil, why, err
	}
	pl, sug, err := plan.Predict(r, known)
	return pl, sug, "", err
}

// planRequest is what the plan of p's run is made for; known says the
// vocabulary is the run's, not a bound; why (no request) when the device
// is a GPU that nobody named.
func planRequest(p *submitPlan) (r plan.Request, known bool, why string, err error) {
	lay, err := p.spec.Layout()
	if err != nil {
		return r, false, "", err
	}
	launcher := plan.LaunchSlurm
	if _, local := p.exec.(*slurm.Local); local {
		launcher = plan.LaunchLocal
	}
	dev, why, err := plan.RankDevice(p.gpu, p.train, plan.Share{TasksPerNode: lay.TasksPerNode, GPUsPerNode: lay.GPUsPerNode, CPUsPerTask: p.spec.CPUsPerTask, Launcher: launcher})
	if err != nil || why != "" {
		return r, false, why, err
	}
	// The vocabulary without the data when it can be known so; a
	// WordPiece built from a data file only from the data, which plan
	// does not read (it plans for the most the vocabulary can hold).
	vocab, exact, err := data.PlanVocab(p.train)
	if err != nil {
		return r, false, "", err
	}
	if !exact && p.readData {
		ds, err := data.Prepare(p.train)
		if err != nil {
			return r, false, "", err
		}
		vocab = ds.Vocab
	}
	return plan.Request{Config: p.train, Vocab: vocab, Nodes: lay.Nodes, Device: dev}, exact || p.readData, "", nil
}

// planAuto searches the layouts of p's tasks and global batch
// (plan.Auto).
func planAuto(p *submitPlan) (*plan.AutoResult, error) {
	r, _, why, err := planRequest(p)
	if err != nil || why != "" {
		return nil, cmp.Or(err, errors.New(why))
	}
	lay, err := p.spec.Layout()
	if err != nil {
		return nil, err
	}
	return plan.Auto(plan.AutoRequest{Request: r, TasksPerNode: lay.TasksPerNode})
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

// planHere is the plan of a run of ntasks ranks on this machine (hpcrun
// run), each with its share of this machine's cores and memory; nil for a
// run on GPUs, which the plan cannot name here.
func planHere(cfg trainconfig.Config) (*plan.Plan, []plan.Suggestion, error) {
	dev, why, err := plan.RankDevice("", cfg, plan.Share{TasksPerNode: cfg.NTasks, Launcher: plan.LaunchLocal})
	if err != nil || why != "" || dev.MemBytes <= 0 {
		return nil, nil, nil
	}
	ds, err := data.Prepare(cfg)
	if err != nil {
		return nil, nil, err
	}
	return plan.Predict(plan.Request{Config: cfg, Vocab: ds.Vocab, Nodes: 1, Device: dev}, true)
}

// refuseUnfitHere refuses, as submit does without --force, a run on this
// machine (hpcrun run) whose plan pl says it does not fit a rank's share
// of this machine's memory; a nil plan is not refused.
func refuseUnfitHere(pl *plan.Plan, sug []plan.Suggestion) error {
	if pl == nil || pl.Fits {
		return nil
	}
	return cli.Exit(pl.Refusal(sug, "run --force to start it anyway"), 1)
}

// recordPlan keeps pl in the run's meta.json, where metrics, sweep show
// and the dashboard read it beside what the run measured, and read its
// device peak for every MFU of the run; nothing for a nil plan.
func recordPlan(m *slurm.Meta, pl *plan.Plan) error {
	if pl == nil {
		return nil
	}
	b, err := json.Marshal(pl)
	if err != nil {
		return err
	}
	m.Plan = b
	return nil
}

// refuseUnfit is submit's error for a run that does not fit.
func refuseUnfit(p *submitPlan) error {
	return cli.Exit(p.plan.Refusal(p.suggest, "submit --force to submit it anyway"), 1)
}
