package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"github.com/hpcrun/hpcrun/cmd/hpcrun/internal/progress"
	"github.com/hpcrun/hpcrun/internal/atomicfile"
	"github.com/hpcrun/hpcrun/internal/rundir"
	"github.com/hpcrun/hpcrun/internal/units"
	"github.com/hpcrun/hpcrun/parallel"
	"github.com/hpcrun/hpcrun/slurm"
	"github.com/hpcrun/hpcrun/train"
	"github.com/hpcrun/hpcrun/train/ckpt"
	trainconfig "github.com/hpcrun/hpcrun/train/config"
	"github.com/hpcrun/hpcrun/train/metrics"
	"github.com/hpcrun/hpcrun/train/plan"
	"github.com/urfave/cli/v2"
	"golang.org/x/term"
)

func submitCommand() *cli.Command {
	flags := []cli.Flag{
		&cli.BoolFlag{Name: "dry-run", Usage: "print the job script; create and submit nothing"},
		&cli.BoolFlag{Name: "wait", Usage: "follow the job with a progress bar and exit with its status"},
		&cli.StringFlag{Name: "executor", Usage: "slurm, local or auto (slurm when sbatch is on PATH); default: the profile's"},
		&cli.StringFlag{Name: "template", Usage: "sbatch template `FILE` (text/template; see templates/sbatch.tmpl); default: the profile's, else built-in"},
		&cli.StringFlag{Name: "name", Usage: "job name (default <model>-n<ntasks>-tp<tp>)"},
		&cli.StringFlag{Name: "check", Usage: "run the tensor-parallel equivalence checks `LAYER` (or all) as the job, at --tp, instead of training"},
		&cli.StringFlag{Name: "resume", Usage: "submit run `EXECID` again, in its run dir, with its job script and train.toml: it resumes from its latest checkpoint"},
		&cli.IntFlag{Name: "nodes", Aliases: []string{"N"}, Usage: "spread the tasks over `N` nodes, as many on each (default: from gpus_per_node)", Category: "job (override the profile)"},
		&cli.IntFlag{Name: "ntasks-per-node", Usage: "tasks on each node (default: from gpus_per_node, or ntasks / nodes)", Category: "job (override the profile)"},
		&cli.StringFlag{Name: "gpu", Usage: "plan for `GPU` (cpu, v100-16, v100-32, a100-40, a100-80, h100-80, h200); default: the profile's gpu key, else the CPU"},
		&cli.BoolFlag{Name: "force", Usage: "submit even when hpcrun plan predicts the run does not fit the device's memory"},
	}
	flags = append(flags, jobFlags()...)
	return &cli.Command{
		Name:  "submit",
		Usage: "write and submit the sbatch script for a training run",
		Description: "Checks the request, creates runs/<execid>/ with job.sbatch, train.toml and meta.json,\n" +
			"submits the script (sbatch --parsable, or the Local executor) and prints the execid and jobid.",
		Flags:  append(flags, trainFlags()...),
		Action: runSubmit,
	}
}

// submitPlan is everything checked before anything is written.
type submitPlan struct {
	exec      slurm.Executor
	spec      slurm.JobSpec
	tmpl      string
	train     trainconfig.Config
	runsDir   string
	binary    string
	execHint  string // execid used for the dry run
	check     string // parallel check to run instead of training; "" = train
	placement string // where the ranks go, in words
	gpu       string // the device hpcrun plan plans for (--gpu, else the profile's)
	readData  bool   // the data was read and checked (submit), not only the config (plan)

	plan     *plan.Plan        // the prediction; nil for checks, or an unnamed GPU (planNote says)
	suggest  []plan.Suggestion // what would fit, when the plan does not
	planNote string
}

// planSubmit checks a request and plans it; readData says whether to read
// the data as well (submit does, so that a bad file fails before the job;
// plan does not, to answer at once on any data).
func planSubmit(c *cli.Context, readData bool) (*submitPlan, error) {
	cfg, err := resolveConfig(c)
	if err != nil {
		return nil, err
	}
	tc := cfg.Train
	if err := applyTrainFlags(c, &tc); err != nil {
		return nil, err
	}
	if err := applyInitFrom(c, &tc); err != nil {
		return nil, err
	}
	checkName := c.String("check")
	if checkName != "" {
		if _, err := parallel.FindChecks(checkName); err != nil {
			return nil, err
		}
		if !c.IsSet("ntasks") {
			tc.NTasks = tc.TP // one tensor-parallel group
		}
	}
	// The job may start in another directory (a template's cd, a requeue).
	if err := tc.AbsPaths(); err != nil {
		return nil, err
	}
	// Config and data: bad input fails here, before a run dir
	// exists, not in the job's first minute.
	check := tc.Validate
	if readData {
		check = func() error { return train.CheckJob(tc) }
	}
	if err := check(); err != nil {
		return nil, err
	}
	p := &submitPlan{train: tc, check: checkName, readData: readData}
	prof := cfg.Profile
	if p.gpu = c.String("gpu"); p.gpu == "" {
		p.gpu = prof.GPU
	}
	if err := applyJobFlags(c, &prof.Resources); err != nil {
		return nil, err
	}
	name := c.String("executor")
	if name == "" {
		name = prof.Executor
	}
	if p.exec, err = slurm.New(name); err != nil {
		return nil, err
	}
	tmplFile := c.String("template")
	if tmplFile == "" {
		tmplFile = prof.Template
	}
	if tmplFile != "" {
		if p.tmpl, err = slurm.ReadTemplate(tmplFile); err != nil {
			return nil, err
		}
	}
	if p.runsDir, err = filepath.Abs(cfg.RunsDir); err != nil {
		return nil, err
	}
	if p.binary, err = slurm.Self(); err != nil {
		return nil, err
	}
	jobName := c.String("name")
	if jobName == "" {
		jobName = fmt.Sprintf("%s-n%d-tp%d", tc.Model, tc.NTasks, tc.TP)
		if p.check != "" {
			jobName = fmt.Sprintf("check-%s-n%d-tp%d", p.check, tc.NTasks, tc.TP)
		}
	}
	p.execHint = time.Now().Format("20060102-150405") + "-0000"
	p.spec = slurm.JobSpec{
		Name: jobName, NTasks: tc.NTasks, Resources: prof.Resources,
		Checkpoint: prof.Checkpoint, SignalSecs: prof.SignalSecs, Signal: tc.StopSignal, Modules: prof.Modules,
		Env: prof.Env, Extra: prof.SbatchExtra, Program: p.binary,
	}
	if p.spec.CPUsPerTask == 0 {
		p.spec.CPUsPerTask = 1
	}
	p.spec.Nodes, p.spec.TasksPerNode = c.Int("nodes"), c.Int("ntasks-per-node")
	lay, err := p.spec.Layout()
	if err != nil {
		return nil, err
	}
	if p.placement, err = parallel.Placement(lay.Nodes, lay.TasksPerNode, p.spec.NTasks, tc.TP, tc.PP); err != nil {
		return nil, err
	}
	if l, ok := p.exec.(*slurm.Local); ok {
		if err := l.Check(p.spec); err != nil {
			return nil, err
		}
	}
	if p.check == "" {
		if p.plan, p.suggest, p.planNote, err = predictRun(p); err != nil {
			return nil, err
		}
	}
	p.setRunDir(filepath.Join(p.runsDir, p.execHint))
	// Render once now so that a bad value or template fails before any write.
	if _, err := slurm.Script(p.spec, p.tmpl, version, p.execHint); err != nil {
		return nil, err
	}
	return p, nil
}

func (p *submitPlan) setRunDir(dir string) {
	p.spec.RunDir = dir
	p.spec.Args = []string{"train", "--run-dir", dir}
	if p.check != "" {
		p.spec.Args = []string{"check", p.check, "--tp", strconv.Itoa(p.train.TP), "--run-dir", dir}
	}
}

func runSubmit(c *cli.Context) error {
	if c.IsSet("resume") {
		return resumeSubmit(c)
	}
	p, err := planSubmit(c, true)
	if err != nil {
		return err
	}
	if w := p.spec.SignalWarning(); w != "" {
		fmt.Fprintf(os.Stderr, "hpcrun: warning: %s\n", w)
	}
	if c.Bool("dry-run") && wantJSON(c) {
		script, _ := slurm.Script(p.spec, p.tmpl, version, p.execHint)
		return json.NewEncoder(os.Stdout).Encode(map[string]any{"placement": p.placement, "plan": p.plan, "plan_note": p.planNote,
			"suggestions": p.suggest, "executor": p.exec.Name(), "script": string(script)})
	}
	if c.Bool("dry-run") {
		fmt.Fprintln(os.Stderr, p.placement)
		if p.plan != nil {
			p.plan.WriteText(os.Stderr, p.suggest)
		} else if p.check == "" {
			fmt.Fprintln(os.Stderr, p.planNote)
		}
		script, _ := slurm.Script(p.spec, p.tmpl, version, p.execHint)
		_, err := os.Stdout.Write(script)
		return err
	}
	if p.plan != nil && !p.plan.Fits && !c.Bool("force") {
		return refuseUnfit(p)
	}
	dir, err := rundir.New(p.runsDir, time.Now())
	if err != nil {
		return err
	}
	execID := dir.ExecID()
	p.setRunDir(dir.Path())
	meta, err := p.write(dir)
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(c.Context, os.Interrupt, syscall.SIGTERM)
	defer stop()
	jobID, cluster, subErr := p.exec.Submit(ctx, slurm.Submission{Spec: p.spec, Script: dir.Script()})
	meta.JobID, meta.Cluster = jobID, cluster
	if subErr != nil {
		meta.SubmitError = subErr.Error()
	}
	if err := slurm.WriteMeta(dir, meta); err != nil {
		return err
	}
	if subErr != nil {
		return fmt.Errorf("submit %s: %w", execID, slurmErr(subErr))
	}
	if c.Bool("json") {
		out, _ := json.Marshal(map[string]string{"execid": execID, "jobid": jobID, "executor": p.exec.Name(), "run_dir": dir.Path()})
		fmt.Println(string(out))
	} else {
		fmt.Printf("submitted run %s as %s job %s\nrun dir: %s\n", execID, p.exec.Name(), jobID, dir)
	}
	if !c.Bool("wait") {
		return nil
	}
	return followJob(ctx, slurm.Run{Dir: dir, Meta: meta})
}

// write puts the rendezvous token, job.sbatch, train.toml and meta.json in
// the new run dir; on failure it removes the dir, so nothing half-written
// is left.
func (p *submitPlan) write(dir rundir.Dir) (m *slurm.Meta, err error) {
	defer func() {
		if err != nil {
			os.RemoveAll(dir.Path())
		}
	}()
	if err := dir.WriteToken(); err != nil {
		return nil, err
	}
	script, err := slurm.Script(p.spec, p.tmpl, version, dir.ExecID())
	if err != nil {
		return nil, err
	}
	if err := atomicfile.WriteFile(dir.Script(), script, 0o755); err != nil {
		return nil, err
	}
	if err := trainconfig.WriteConfigFile(dir.Config(), p.train, "Training config of run "+dir.ExecID()+", written by hpcrun submit; every task reads it."); err != nil {
		return nil, err
	}
	sum, err := slurm.BinarySHA256(p.binary)
	if err != nil {
		return nil, err
	}
	m = &slurm.Meta{
		ExecID: dir.ExecID(), Executor: p.exec.Name(), Host: slurm.Host(), Spec: p.spec, SubmitTime: time.Now().UTC(),
		Version: version, Binary: p.binary, BinarySHA256: sum,
	}
	if err := recordPlan(m, p.plan); err != nil {
		return nil, err
	}
	return m, slurm.WriteMeta(dir, m)
}

// followJob shows the run's progress until its job is over and returns
// the job's status as hpcrun's exit status.
func followJob(ctx context.Context, r slurm.Run) error {
	bar := progress.New(os.Stderr, r.Dir.Path(), term.IsTerminal(int(os.Stderr.Fd())))
	defer bar.Close()
	j, err := slurm.Wait(ctx, time.Second, func(ctx context.Context) (slurm.JobInfo, error) { return r.Status(ctx) },
		func(j slurm.JobInfo) error {
			_, _, err := bar.Update(fmt.Sprintf("%-9s ", j.State))
			return err
		})
	if errors.Is(err, slurm.ErrStoppedWaiting) {
		return cli.Exit(fmt.Sprintf("stopped following run %s; the job goes on (hpcrun queue, hpcrun cancel %s)", r.Meta.ExecID, r.Meta.ExecID), 130)
	}
	if err != nil {
		return slurmErr(err)
	}
	bar.Close()
	fmt.Fprintf(os.Stderr, "run %s: job %s %s after %s\n", r.Meta.ExecID, j.ID, j.State, slurm.FormatElapsed(j.Elapsed))
	return exitWith(j, r.Meta.ExecID)
}

// resumeSubmit submits an existing run's job script again, in the same run
// dir: its tasks find ckpt/latest and resume from it. It refuses while the
// run's job is still queued or running (two jobs would write one run dir)
// and checks the checkpoint first, so a broken one fails here.
func resumeSubmit(c *cli.Context) error {
	for _, f := range trainFlags() {
		if name := f.Names()[0]; c.IsSet(name) {
			return cli.Exit(fmt.Sprintf("--resume takes no training flags (--%s): the run's train.toml is reused as it is", name), 2)
		}
	}
	if c.NArg() > 0 {
		return cli.Exit(fmt.Sprintf("submit takes no arguments, got %q", c.Args().First()), 2)
	}
	dir, err := runsDir(c)
	if err != nil {
		return err
	}
	r, err := openRun(dir, c.String("resume"))
	if err != nil {
		return err
	}
	if r.Meta.Executor == "run" {
		return cli.Exit(fmt.Sprintf("run %s was started by hpcrun run, on this machine: resume it with hpcrun run --resume %s", r.Meta.ExecID, r.Meta.ExecID), 2)
	}
	ctx, stop := signal.NotifyContext(c.Context, os.Interrupt, syscall.SIGTERM)
	defer stop()
	// From the liveness check to the record of the new job id, one resume
	// at a time: a second one sees the first's job, or is refused.
	unlock, err := r.Dir.Lock()
	if err != nil {
		return cli.Exit(err.Error(), 1)
	}
	defer unlock()
	if r, err = slurm.OpenRun(dir, r.Meta.ExecID); err != nil { // as it is now, under the lock
		return err
	}
	if r.Meta.JobID != "" {
		j, err := r.Status(ctx)
		if err != nil {
			return slurmErr(err)
		}
		if !j.State.Done() {
			return cli.Exit(fmt.Sprintf("run %s: job %s is %s: wait for it or cancel it (hpcrun cancel %s) before resuming", r.Meta.ExecID, j.ID, j.State, r.Meta.ExecID), 1)
		}
	}
	if err := refuseCompleted(r); err != nil {
		return err
	}
	from, err := ckpt.ResumePoint(r.Dir.Ckpt())
	if err != nil {
		return err
	}
	ex, err := r.Executor()
	if err != nil {
		return err
	}
	jobID, cluster, subErr := ex.Submit(ctx, slurm.Submission{Spec: r.Meta.Spec, Script: r.Dir.Script()})
	if subErr != nil {
		return fmt.Errorf("submit %s again: %w", r.Meta.ExecID, slurmErr(subErr))
	}
	m := r.Meta
	m.NewJob(jobID)
	m.Cluster = cluster
	if err := slurm.WriteMeta(r.Dir, m); err != nil {
		return err
	}
	unlock()
	if c.Bool("json") {
		out, _ := json.Marshal(map[string]string{"execid": m.ExecID, "jobid": jobID, "executor": ex.Name(), "run_dir": r.Dir.Path(), "resume_from": from})
		fmt.Println(string(out))
	} else {
		fmt.Printf("submitted run %s again as %s job %s; it resumes from %s\nrun dir: %s\n", m.ExecID, ex.Name(), jobID, from, r.Dir)
	}
	if !c.Bool("wait") {
		return nil
	}
	return followJob(ctx, slurm.Run{Dir: r.Dir, Meta: m})
}

// refuseCompleted refuses to resume a run every rank of which completed
// its steps and whose latest checkpoint is at its last step: its job would
// take an allocation to train nothing. A checkpoint before the end (a run
// rolled back to an earlier one) trains again from there.
func refuseCompleted(r slurm.Run) error {
	s, _, err := metrics.ReadSummary(r.Dir.Path(), metrics.NoCurves)
	if err != nil || s.Status != metrics.StatusCompleted {
		return nil
	}
	var at int
	if dir, err := ckpt.Latest(r.Dir.Ckpt()); err == nil && dir != "" {
		fmt.Sscanf(filepath.Base(dir), "step-%d", &at)
	}
	if s.TotalSteps > 0 && at < s.TotalSteps && at > 0 {
		return nil
	}
	return cli.Exit(fmt.Sprintf("run %s completed all its %s: there is nothing to resume (hpcrun metrics %s shows it; submit a new run to train more)", r.Meta.ExecID, units.Count(s.Step, "step"), r.Meta.ExecID), 2)
}
