package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/BurntSushi/toml"
	"github.com/hpcrun/hpcrun/parallel"
	"github.com/hpcrun/hpcrun/slurm"
	"github.com/hpcrun/hpcrun/train"
	"github.com/hpcrun/hpcrun/train/ckpt"
	"github.com/urfave/cli/v2"
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
	exec     slurm.Executor
	spec     slurm.JobSpec
	tmpl     string
	train    train.Config
	runsDir  string
	binary   string
	execHint string // execid used for the dry run
	check    string // parallel check to run instead of training; "" = train
}

func planSubmit(c *cli.Context) (*submitPlan, error) {
	cfg, err := resolveConfig(c)
	if err != nil {
		return nil, err
	}
	tc := cfg.Train
	if err := applyTrainFlags(c, &tc); err != nil {
		return nil, err
	}
	check := c.String("check")
	if check != "" {
		if _, err := parallel.FindChecks(check); err != nil {
			return nil, err
		}
		if !c.IsSet("ntasks") {
			tc.NTasks = tc.TP // one tensor-parallel group
		}
	}
	// The job may start in another directory (a template's cd, a requeue):
	// file paths travel absolute.
	for _, path := range []*string{&tc.Data, &tc.VocabFile, &tc.ResumeFrom} {
		if *path != "" && *path != "synthetic" && !filepath.IsAbs(*path) {
			abs, err := filepath.Abs(*path)
			if err != nil {
				return nil, err
			}
			*path = abs
		}
	}
	// Config and data: bad input fails here, before a run dir
	// exists, not in the job's first minute.
	if err := train.CheckJob(tc); err != nil {
		return nil, err
	}
	p := &submitPlan{train: tc, check: check}
	prof := cfg.Profile
	applyJobFlags(c, &prof)
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
	if p.binary, err = os.Executable(); err != nil {
		return nil, fmt.Errorf("path of hpcrun: %w", err)
	}
	if p.binary, err = filepath.EvalSymlinks(p.binary); err != nil {
		return nil, fmt.Errorf("path of hpcrun: %w", err)
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
		Name: jobName, NTasks: tc.NTasks, GPUsPerNode: prof.GPUsPerNode, CPUsPerTask: prof.CPUsPerTask,
		Time: prof.Time, QOS: prof.QOS, Account: prof.Account, Partition: prof.Partition,
		Constraint: prof.Constraint, Exclusive: prof.Exclusive, Hint: prof.Hint,
		Checkpoint: prof.Checkpoint, SignalSecs: prof.SignalSecs, Signal: tc.StopSignal, Modules: prof.Modules,
		Env: prof.Env, Extra: prof.SbatchExtra, Program: p.binary,
	}
	if p.spec.CPUsPerTask == 0 {
		p.spec.CPUsPerTask = 1
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
		p.spec.Args = []string{"check", p.check, "--tp", strconv.Itoa(p.train.TP)}
	}
}

func runSubmit(c *cli.Context) error {
	if c.IsSet("resume") {
		return resumeSubmit(c)
	}
	p, err := planSubmit(c)
	if err != nil {
		return err
	}
	if c.Bool("dry-run") {
		script, _ := slurm.Script(p.spec, p.tmpl, version, p.execHint)
		_, err := os.Stdout.Write(script)
		return err
	}
	execID, dir, err := slurm.NewRun(p.runsDir, time.Now())
	if err != nil {
		return err
	}
	p.setRunDir(dir)
	meta, err := p.write(execID, dir)
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(c.Context, os.Interrupt, syscall.SIGTERM)
	defer stop()
	jobID, cluster, subErr := p.exec.Submit(ctx, slurm.Submission{Spec: p.spec, Script: filepath.Join(dir, "job.sbatch")})
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
		out, _ := json.Marshal(map[string]string{"execid": execID, "jobid": jobID, "executor": p.exec.Name(), "run_dir": dir})
		fmt.Println(string(out))
	} else {
		fmt.Printf("submitted run %s as %s job %s\nrun dir: %s\n", execID, p.exec.Name(), jobID, dir)
	}
	if !c.Bool("wait") {
		return nil
	}
	return followJob(ctx, slurm.Run{Dir: dir, Meta: meta}, p.train)
}

// write puts job.sbatch, train.toml, meta.json and the rendezvous token
// (mode 0600: the secret every task presents to the Store) in the new run
// dir; on failure it removes the dir, so nothing half-written is left.
func (p *submitPlan) write(execID, dir string) (m *slurm.Meta, err error) {
	defer func() {
		if err != nil {
			os.RemoveAll(dir)
		}
	}()
	token, err := newToken()
	if err != nil {
		return nil, fmt.Errorf("rendezvous token: %w", err)
	}
	if err := slurm.WriteFileAtomic(filepath.Join(dir, "token"), []byte(token+"\n"), 0o600); err != nil {
		return nil, err
	}
	script, err := slurm.Script(p.spec, p.tmpl, version, execID)
	if err != nil {
		return nil, err
	}
	if err := slurm.WriteFileAtomic(filepath.Join(dir, "job.sbatch"), script, 0o755); err != nil {
		return nil, err
	}
	var tbuf bytes.Buffer
	fmt.Fprintf(&tbuf, "# Training config of run %s, written by hpcrun submit; every task reads it.\n", execID)
	if err := toml.NewEncoder(&tbuf).Encode(p.train); err != nil {
		return nil, fmt.Errorf("train.toml: %w", err)
	}
	if err := slurm.WriteFileAtomic(filepath.Join(dir, "train.toml"), tbuf.Bytes(), 0o644); err != nil {
		return nil, err
	}
	sum, err := binarySum(p.binary)
	if err != nil {
		return nil, err
	}
	host, _ := os.Hostname()
	host, _, _ = strings.Cut(host, ".")
	m = &slurm.Meta{
		ExecID: execID, Executor: p.exec.Name(), Host: host, Spec: p.spec, SubmitTime: time.Now().UTC(),
		Version: version, Binary: p.binary, BinarySHA256: sum,
	}
	return m, slurm.WriteMeta(dir, m)
}

// followJob shows a progress bar until the run's job is over and returns
// the job's status as hpcrun's exit status.
func followJob(ctx context.Context, r slurm.Run, tc train.Config) error {
	bar := newStepBar(r, tc)
	defer bar.close()
	for {
		j, err := runStatus(ctx, r)
		if err != nil {
			return slurmErr(err)
		}
		bar.update(j)
		if j.State.Done() {
			bar.close()
			fmt.Fprintf(os.Stderr, "run %s: job %s %s after %s\n", r.Meta.ExecID, j.ID, j.State, slurm.FormatElapsed(j.Elapsed))
			return exitWith(j, r.Meta.ExecID)
		}
		select {
		case <-ctx.Done():
			return cli.Exit(fmt.Sprintf("stopped following run %s; the job goes on (hpcrun queue, hpcrun cancel %s)", r.Meta.ExecID, r.Meta.ExecID), 130)
		case <-time.After(time.Second):
		}
	}
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
	r, err := slurm.FindRun(dir, c.String("resume"))
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(c.Context, os.Interrupt, syscall.SIGTERM)
	defer stop()
	if r.Meta.JobID != "" {
		j, err := runStatus(ctx, r)
		if err != nil {
			return slurmErr(err)
		}
		if !j.State.Done() {
			return cli.Exit(fmt.Sprintf("run %s: job %s is %s: wait for it or cancel it (hpcrun cancel %s) before resuming", r.Meta.ExecID, j.ID, j.State, r.Meta.ExecID), 1)
		}
	}
	tc, err := train.ReadConfigFile(filepath.Join(r.Dir, train.ConfigFile))
	if err != nil {
		return err
	}
	from := "the start (no checkpoint yet)"
	if step, err := ckpt.Latest(train.CkptDir(r.Dir)); err != nil {
		return err
	} else if step != "" {
		ck, err := ckpt.Open(step, true)
		if err != nil {
			return err
		}
		from = fmt.Sprintf("step %d of %s", ck.State.Step, step)
	}
	ex, err := executorOf(r)
	if err != nil {
		return err
	}
	if ex.Name() == "local" {
		// The previous job's final state must not pass for the new one's.
		for _, f := range []string{"state", "cancel"} {
			if err := os.Remove(filepath.Join(r.Dir, slurm.LocalDir, f)); err != nil && !errors.Is(err, os.ErrNotExist) {
				return err
			}
		}
	}
	jobID, cluster, subErr := ex.Submit(ctx, slurm.Submission{Spec: r.Meta.Spec, Script: filepath.Join(r.Dir, "job.sbatch")})
	if subErr != nil {
		return fmt.Errorf("submit %s again: %w", r.Meta.ExecID, slurmErr(subErr))
	}
	m := r.Meta
	m.JobID, m.Cluster, m.Final, m.SubmitError = jobID, cluster, nil, ""
	if err := slurm.WriteMeta(r.Dir, m); err != nil {
		return err
	}
	if c.Bool("json") {
		out, _ := json.Marshal(map[string]string{"execid": m.ExecID, "jobid": jobID, "executor": ex.Name(), "run_dir": r.Dir, "resume_from": from})
		fmt.Println(string(out))
	} else {
		fmt.Printf("submitted run %s again as %s job %s; it resumes from %s\nrun dir: %s\n", m.ExecID, ex.Name(), jobID, from, r.Dir)
	}
	if !c.Bool("wait") {
		return nil
	}
	return followJob(ctx, slurm.Run{Dir: r.Dir, Meta: m}, tc)
}
