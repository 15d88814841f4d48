package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/hpcrun/hpcrun/idrenv"
	"github.com/hpcrun/hpcrun/nccl"
	"github.com/hpcrun/hpcrun/parallel"
	"github.com/hpcrun/hpcrun/slurm"
	"github.com/hpcrun/hpcrun/tensor"
	"github.com/urfave/cli/v2"
)

func checkCommand() *cli.Command {
	return &cli.Command{
		Name:      "check",
		Usage:     "check tensor-parallel layers against the unsharded ones",
		ArgsUsage: "[LAYER|all]",
		Description: "Every rank builds the sharded layer and the unsharded one from the same seed, runs\n" +
			"both on the same random batch, and compares the forward output, the input gradient,\n" +
			"every weight gradient and every weight after one AdamW step (norm-relative error\n" +
			"< 1e-5). Outside a job it starts --tp processes of itself on this machine, joined\n" +
			"over TCP; inside one (srun hpcrun check all --tp 2) each task is one rank.\n\n" +
			"Layers: all, " + strings.Join(parallel.CheckNames(), ", "),
		Flags: []cli.Flag{
			&cli.IntFlag{Name: "tp", Usage: "tensor-parallel degree (default: 2 locally, the job's task count under srun)"},
			&cli.DurationFlag{Name: "timeout", Value: nccl.DefaultTimeout, Usage: "give up on a rank that does not answer within this time"},
			&cli.StringFlag{Name: "run-dir", Usage: "the run directory (`DIR`) whose token the ranks share (hpcrun submit --check passes it)"},
		},
		Action: runCheck,
	}
}

func runCheck(c *cli.Context) error {
	o, err := parseCheckArgs(c)
	if err != nil {
		return cli.Exit(err.Error(), 2)
	}
	checks, err := parallel.FindChecks(o.name)
	if err != nil {
		return cli.Exit(err.Error(), 2)
	}
	env, err := idrenv.Detect()
	if err != nil {
		return cli.Exit(err.Error(), 2)
	}
	if env.Source == idrenv.Single && !slurm.Launched() {
		if o.tp == 0 {
			o.tp = 2
		}
		return launchCheck(c, o)
	}
	if o.tp == 0 {
		o.tp = env.WorldSize
	}
	return checkRank(c, env, checks, o)
}

// checkOptions are the command's flags and its argument.
type checkOptions struct {
	name    string // a layer, or all
	tp      int    // 0: the default
	timeout time.Duration
	runDir  string // holds the token every rank reads; "" outside a submitted check
}

// parseCheckArgs reads the flags and the one argument; flags typed after
// it are already in front of it (interspersed).
func parseCheckArgs(c *cli.Context) (checkOptions, error) {
	o := checkOptions{name: "all", tp: c.Int("tp"), timeout: c.Duration("timeout"), runDir: c.String("run-dir")}
	if c.NArg() > 1 {
		return o, fmt.Errorf("check takes one layer name or all, got %q and %q", c.Args().Get(0), c.Args().Get(1))
	}
	if c.NArg() == 1 {
		o.name = c.Args().First()
	}
	if c.IsSet("tp") && o.tp < 1 {
		return o, fmt.Errorf("check: --tp %d: must be at least 1", o.tp)
	}
	return o, nil
}

// launchCheck starts tp ranks of `hpcrun check` on this machine, with the
// variables torchrun would set, and waits for them.
func launchCheck(c *cli.Context, o checkOptions) error {
	args := []string{"check", "--tp", strconv.Itoa(o.tp), "--timeout", o.timeout.String(), o.name}
	if c.Bool("json") {
		args = append([]string{"--json"}, args...)
	}
	return launchSelf(c.Context, "check", o.tp, args, o.timeout)
}

// launchSelf starts n ranks of `hpcrun args...` (command name) on this
// machine (slurm.LaunchSelf) and waits. Once one fails, the others have
// timeout (their wait at a collective) and 5 s more before they are
// stopped; the ranks say why they failed.
func launchSelf(ctx context.Context, name string, n int, args []string, timeout time.Duration) error {
	failed, err := slurm.LaunchSelf(ctx, name, n, args, timeout+5*time.Second)
	if err != nil {
		return err
	}
	if len(failed) > 0 {
		return cli.Exit("", 1) // the ranks said why
	}
	return nil
}

// checkRank is one rank of a check job: join the world, lay out the mesh,
// run the checks on this rank's tensor-parallel group; rank 0 prints.
func checkRank(c *cli.Context, env idrenv.Env, checks []parallel.Check, o checkOptions) error {
	fail := func(err error) error { return cli.Exit(fmt.Sprintf("check rank %d: %v", env.Rank, err), 1) }
	token, err := slurm.RankToken(env, o.runDir)
	if err != nil {
		return fail(err)
	}
	ctx, stop := signal.NotifyContext(c.Context, os.Interrupt, syscall.SIGTERM)
	defer stop()
	world, err := joinWorld(ctx, env, nccl.Options{Token: token, Timeout: o.timeout})
	if err != nil {
		return fail(err)
	}
	defer world.Close()
	mesh, err := parallel.NewMesh(world, o.tp)
	if err != nil {
		return cli.Exit(err.Error(), 2)
	}
	defer mesh.Close()
	dev := tensor.NewCPU()
	var results []*parallel.Result
	for _, ck := range checks {
		res, err := ck.Run(dev, mesh.TP)
		if err != nil {
			return fail(err)
		}
		results = append(results, res)
	}
	passed := true
	for _, r := range results {
		passed = passed && r.Pass()
	}
	if env.Rank == 0 {
		if c.Bool("json") {
			enc := json.NewEncoder(os.Stdout)
			enc.SetIndent("", "  ")
			if err := enc.Encode(parallel.NewCheckReport(results, mesh.TPSize(), mesh.DPSize())); err != nil {
				return err
			}
		} else {
			parallel.WriteChecks(os.Stdout, results, mesh.TPSize(), mesh.DPSize())
		}
	}
	if !passed {
		return cli.Exit("", 1)
	}
	return nil
}
