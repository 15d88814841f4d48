package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/hpcrun/hpcrun/idrenv"
	"github.com/hpcrun/hpcrun/internal/rundir"
	"github.com/hpcrun/hpcrun/internal/units"
	"github.com/hpcrun/hpcrun/nccl"
	"github.com/hpcrun/hpcrun/slurm"
	"github.com/hpcrun/hpcrun/train"
	trainconfig "github.com/hpcrun/hpcrun/train/config"
	"github.com/hpcrun/hpcrun/train/metrics"
	"github.com/urfave/cli/v2"
)

func trainCommand() *cli.Command {
	return &cli.Command{
		Name:  "train",
		Usage: "run one training task (what srun runs inside the job)",
		Description: "Reads DIR/train.toml, finds its rank, world and master from Slurm's (or torchrun's)\n" +
			"variables, joins the other tasks over TCP, trains, and appends its metrics to\n" +
			"DIR/metrics/rank-NNNNN.jsonl. Every task of the job runs it with the same DIR.",
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "run-dir", Usage: "the run directory (`DIR`) holding train.toml", Required: true},
		},
		Action: runTrainTask,
	}
}

func runTrainTask(c *cli.Context) error {
	start := time.Now()
	held := slurm.HoldSignals() // first of all: an early stop signal waits there

	path, err := filepath.Abs(c.String("run-dir"))
	if err != nil {
		return err
	}
	dir := rundir.Dir(path)
	cfg, err := trainconfig.ReadConfigFile(dir.Config())
	if err != nil {
		return cli.Exit(err.Error(), 2)
	}
	env, err := idrenv.Detect()
	if err != nil {
		return cli.Exit(err.Error(), 2)
	}
	if env.WorldSize != cfg.NTasks {
		return cli.Exit(fmt.Sprintf("the job step has %s but %s says ntasks = %d: run as many tasks as the config asks", units.Count(env.WorldSize, "task"), rundir.ConfigFile, cfg.NTasks), 2)
	}
	token, err := dir.ReadToken()
	if err != nil {
		return cli.Exit(fmt.Sprintf("rank %d: %v", env.Rank, err), 2)
	}
	env.LimitThreads() // the CPUs Slurm gave this task, not the node's
	ctx, cancel := context.WithCancel(c.Context)
	defer cancel()
	stop := slurm.StopOnSignals(held, cfg.StopSignal, env.Rank, cancel)
	// fail ends a task whose world did not form (or formed and failed
	// before train.Run opened its metrics file): the rank's file still
	// ends with why, as it would had training begun.
	fail := func(err error) error {
		metrics.AppendEnd(dir.Path(), env.Rank, ctx.Err() != nil, err, time.Since(start))
		return cli.Exit(fmt.Sprintf("rank %d: %v", env.Rank, err), 1)
	}
	backend, gpu, err := train.CommBackend(cfg, env.GPUOrdinal)
	if err != nil {
		return fail(err)
	}
	// Why a stop came is asked as it comes (scontrol answers before a
	// second TERM or the kill), not when the end line is written.
	reason := sync.OnceValue(func() string {
		if r := slurm.StopReason(context.Background(), stop.Signal()); r != "" {
			return r
		}
		return metrics.RelayedStop
	})
	// INT or TERM while the world forms ends the join at once: nothing
	// was trained, so there is nothing to save (before, the first TERM
	// waited for the world, up to the comm timeout).
	joinCtx, stopJoin := context.WithCancel(ctx)
	defer stopJoin()
	joined := make(chan struct{})
	go func() {
		select {
		case <-stop.C:
			// INT or TERM asks to stop now; the time-limit signal lets
			// the world form and train a step to save (HoldSignals).
			if s := stop.Signal(); s == syscall.SIGINT || s == syscall.SIGTERM {
				stopJoin()
			}
		case <-joined:
		}
	}()
	comm, err := joinWorld(joinCtx, env, nccl.Options{
		Token: token, Timeout: cfg.CommTimeoutDuration(),
		Backend: backend, Device: gpu, Log: os.Stderr,
	})
	close(joined)
	if joinCtx.Err() != nil && ctx.Err() == nil {
		// Stopped while joining (a world formed in that instant holds the
		// cancelled context for its connections: it is closed too).
		if comm != nil {
			closeWithin(comm, 2*time.Second)
		}
		err := fmt.Errorf("%w while joining the world, before step 1 (nothing to save)", train.ErrStopped)
		metrics.AppendEnd(dir.Path(), env.Rank, true, errors.New(strings.Replace(err.Error(), train.ErrStopped.Error(), reason(), 1)), time.Since(start))
		return stopped(ctx, dir, cfg, env, stop.Signal(), reason(), err)
	}
	if err != nil {
		return fail(err)
	}
	go func() {
		select {
		case <-stop.C:
			reason()
		case <-ctx.Done():
		}
	}()
	_, err = train.Run(ctx, cfg, comm, train.Options{RunDir: dir.Path(), Log: os.Stdout, Host: env.Node, Stop: stop.C, GPUOrdinal: env.GPUOrdinal, StopReason: reason, RanksPerNode: env.LocalWorldSize})
	if errors.Is(err, train.ErrStopped) {
		closeWithin(comm, 2*time.Second)
		return stopped(ctx, dir, cfg, env, stop.Signal(), reason(), err)
	}
	if err != nil {
		// This rank's own failure becomes the job's: the others stop now,
		// quoting it, instead of timing out on a healthy rank. A failed
		// world may wait on a dead peer to close; the error is what
		// matters, and exiting closes the sockets anyway.
		nccl.Abort(comm, err)
		closeWithin(comm, 2*time.Second)
		return lostPeer(ctx, dir, cfg, env, err)
	}
	if cerr := comm.Close(); cerr != nil && ctx.Err() == nil {
		return cli.Exit(fmt.Sprintf("rank %d: %v", env.Rank, cerr), 1)
	}
	return nil
}

// stopped ends a task that saved and stopped on a signal, as
// slurm.StopExit says.
func stopped(ctx context.Context, dir rundir.Dir, cfg trainconfig.Config, env idrenv.Env, sig os.Signal, reason string, err error) error {
	msg := fmt.Sprintf("rank %d: %s", env.Rank, strings.Replace(err.Error(), train.ErrStopped.Error(), reason, 1))
	return cli.Exit(slurm.StopExit(ctx, os.Getenv, sig, env.Rank, dir.ExecID(), env.RestartCount, cfg.Requeues(), msg))
}

// lostPeer ends a task whose training failed. When the failure is a lost
// peer (a rank that died, with its node or alone), the job was submitted
// with checkpointing (--requeue in its script) and this is rank 0, the job
// is requeued to resume from its last checkpoint on nodes that work;
// anything else fails the task as it is.
func lostPeer(ctx context.Context, dir rundir.Dir, cfg trainconfig.Config, env idrenv.Env, err error) error {
	msg := fmt.Sprintf("rank %d: %v", env.Rank, err)
	var pe *nccl.PeerError
	if env.Rank != 0 || !errors.As(err, &pe) || ctx.Err() != nil || cfg.CkptEvery < 0 {
		return cli.Exit(msg, 1)
	}
	if m, merr := slurm.ReadMeta(dir); merr != nil || !m.Spec.Checkpoint {
		return cli.Exit(msg, 1)
	}
	return cli.Exit(msg+"; "+slurm.Requeue(ctx, os.Getenv, dir.ExecID(), env.RestartCount, cfg.Requeues()), 1)
}

// closeWithin closes comm, giving up after d.
func closeWithin(comm nccl.Comm, d time.Duration) {
	done := make(chan struct{})
	go func() {
		comm.Close()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(d):
	}
}
