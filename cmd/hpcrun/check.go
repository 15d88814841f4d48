package main

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/hpcrun/hpcrun/idrenv"
	"github.com/hpcrun/hpcrun/internal/rundir"
	"github.com/hpcrun/hpcrun/nccl"
	"github.com/hpcrun/hpcrun/parallel"
	"github.com/hpcrun/hpcrun/slurm"
	"github.com/hpcrun/hpcrun/tensor"
	"github.com/urfave/cli/v2"
)

// launcherTokenEnv carries the rendezvous secret from a local launcher
// (check, generate and eval start their ranks on this machine) to the
// ranks it starts; a rank that has it is no launcher. The variable's name
// is older than generate and eval.
const launcherTokenEnv = "HPCRUN_CHECK_TOKEN"

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
			"Layers: " + checkNames(),
		Flags: []cli.Flag{
			&cli.IntFlag{Name: "tp", Usage: "tensor-parallel degree (default: 2 locally, the job's task count under srun)"},
			&cli.DurationFlag{Name: "timeout", Value: nccl.DefaultTimeout, Usage: "give up on a rank that does not answer within this time"},
			&cli.StringFlag{Name: "run-dir", Usage: "the run directory (`DIR`) whose token the ranks share (hpcrun submit --check passes it)"},
		},
		Action: runCheck,
	}
}

func checkNames() string {
	s := "all"
	for _, c := range parallel.Checks() {
		s += ", " + c.Name
	}
	return s
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
	if env.Source == idrenv.Single && os.Getenv(launcherTokenEnv) == "" {
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
// machine through slurm.Torchrun, with a fresh token for their rendezvous,
// and waits. Once one fails, the others have timeout (their wait at a
// collective) and 5 s more before they are stopped; the ranks say why
// they failed.
func launchSelf(ctx context.Context, name string, n int, args []string, timeout time.Duration) error {
	token, err := randomToken()
	if err != nil {
		return err
	}
	self, err := os.Executable()
	if err != nil {
		return fmt.Errorf("path of hpcrun: %w", err)
	}
	ranks := slurm.Tasks{N: n, Program: self, Args: args, Env: []string{launcherTokenEnv + "=" + token}, Grace: timeout + 5*time.Second}
	failed, err := slurm.Torchrun(ctx, ranks, "hpcrun-"+name+"-"+token[:8])
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
	token, err := rankToken(env, o.runDir)
	if err != nil {
		return fail(err)
	}
	ctx, stop := signal.NotifyContext(c.Context, os.Interrupt, syscall.SIGTERM)
	defer stop()
	master, err := slurm.MasterListener()
	if err != nil {
		return fail(err)
	}
	world, err := nccl.Init(ctx, nccl.Options{
		Rank: env.Rank, Size: env.WorldSize,
		MasterAddr: env.MasterAddr, MasterPort: env.MasterPort, Listener: master,
		Token: token, Timeout: o.timeout,
	})
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
			if err := enc.Encode(checkJSON(results, mesh)); err != nil {
				return err
			}
		} else {
			writeCheckTable(os.Stdout, results, mesh)
		}
	}
	if !passed {
		return cli.Exit("", 1)
	}
	return nil
}

// rankToken is the rendezvous secret of a check, generate or eval rank:
// the run dir's token (a check submitted with hpcrun submit --check), else
// the local launcher's (hpcrun check, generate or eval on this machine). A bare `srun hpcrun check` has neither: its tasks share
// one derived from the job and step, which is no secret; a check holds no
// data of the user's, and submit --check is the way to a private one.
func rankToken(env idrenv.Env, runDir string) (string, error) {
	if runDir != "" {
		return rundir.Dir(runDir).ReadToken()
	}
	if t := os.Getenv(launcherTokenEnv); t != "" {
		return t, nil
	}
	sum := sha256.Sum256([]byte("hpcrun-check\x00" + env.JobID + "\x00" + env.StepID + "\x00" + env.MasterAddr))
	return hex.EncodeToString(sum[:16]), nil
}

// randomToken is 16 bytes from crypto/rand in hex.
func randomToken() (string, error) {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", err
	}
	return hex.EncodeToString(b[:]), nil
}

// checkColumns are the measures the table shows, one column each.
var checkColumns = []struct{ what, head string }{
	{"forward output", "FORWARD"},
	{"input gradient", "INPUT GRAD"},
	{"weight gradients", "WEIGHT GRADS"},
	{"weights after AdamW", "ADAMW STEP"},
}

func writeCheckTable(w io.Writer, results []*parallel.Result, mesh *parallel.Mesh) {
	fmt.Fprintf(w, "tensor-parallel checks: tp %d, %s; norm-relative error vs the unsharded layer, tolerance %.0e\n\n",
		mesh.TPSize(), nOf(mesh.DPSize(), "group"), parallel.Tolerance)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprint(tw, "LAYER\tTP")
	for _, col := range checkColumns {
		fmt.Fprint(tw, "\t", col.head)
	}
	fmt.Fprint(tw, "\tMAX\tRESULT\n")
	failed := 0
	for _, r := range results {
		fmt.Fprintf(tw, "%s\t%d", r.Check, r.TP)
		for _, col := range checkColumns {
			if e, ok := r.Max(col.what); ok {
				fmt.Fprintf(tw, "\t%.2g", e)
			} else {
				fmt.Fprint(tw, "\t-")
			}
		}
		verdict := "PASS"
		if !r.Pass() {
			verdict = "FAIL"
			failed++
		}
		fmt.Fprintf(tw, "\t%.2g\t%s\n", r.MaxErr(), verdict)
	}
	tw.Flush()
	for _, r := range results {
		for _, m := range r.Measures {
			switch {
			case known(m.What):
			case strings.HasSuffix(m.What, " calls"): // a count of collectives, no error
				fmt.Fprintf(w, "%s: %s\n", r.Check, m.What)
			default:
				fmt.Fprintf(w, "%s: %s: error %.2g\n", r.Check, m.What, m.Err)
			}
		}
		if r.Fail != "" {
			fmt.Fprintf(w, "%s FAILED: %s\n", r.Check, r.Fail)
		}
		if !r.Pass() {
			for _, m := range r.Measures {
				if m.Err > parallel.Tolerance {
					fmt.Fprintf(w, "%s FAILED: %s %s error %.3g\n", r.Check, m.What, m.Param, m.Err)
				}
			}
		}
	}
	if failed > 0 {
		fmt.Fprintf(w, "\n%d of %d checks FAILED\n", failed, len(results))
	} else {
		fmt.Fprintf(w, "\nall %d checks passed\n", len(results))
	}
}

func known(what string) bool {
	for _, col := range checkColumns {
		if col.what == what {
			return true
		}
	}
	return false
}

type checkJSONResult struct {
	Check    string             `json:"check"`
	TP       int                `json:"tp"`
	Pass     bool               `json:"pass"`
	MaxErr   float64            `json:"max_err"`
	Fail     string             `json:"fail,omitempty"`
	Measures []parallel.Measure `json:"measures"`
}

func checkJSON(results []*parallel.Result, mesh *parallel.Mesh) any {
	out := struct {
		TP        int               `json:"tp"`
		DP        int               `json:"dp"`
		Tolerance float64           `json:"tolerance"`
		Results   []checkJSONResult `json:"results"`
	}{TP: mesh.TPSize(), DP: mesh.DPSize(), Tolerance: parallel.Tolerance}
	for _, r := range results {
		out.Results = append(out.Results, checkJSONResult{r.Check, r.TP, r.Pass(), r.MaxErr(), r.Fail, r.Measures})
	}
	return out
}
