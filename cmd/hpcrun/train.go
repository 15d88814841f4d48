package main

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"time"

	"github.com/hpcrun/hpcrun/idrenv"
	"github.com/hpcrun/hpcrun/nccl"
	"github.com/hpcrun/hpcrun/train"
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
	dir, err := filepath.Abs(c.String("run-dir"))
	if err != nil {
		return err
	}
	cfg, err := train.ReadConfigFile(filepath.Join(dir, train.ConfigFile))
	if err != nil {
		return cli.Exit(err.Error(), 2)
	}
	env, err := idrenv.Detect()
	if err != nil {
		return cli.Exit(err.Error(), 2)
	}
	if env.WorldSize != cfg.NTasks {
		return cli.Exit(fmt.Sprintf("the job step has %d tasks but %s says ntasks = %d: run as many tasks as the config asks", env.WorldSize, train.ConfigFile, cfg.NTasks), 2)
	}
	// The engine's threads follow the CPUs Slurm gave this task (as
	// OMP_NUM_THREADS would), unless GOMAXPROCS says otherwise: tasks
	// sharing a node must not each take all its cores.
	if env.CPUsPerTask > 0 && os.Getenv("GOMAXPROCS") == "" {
		runtime.GOMAXPROCS(min(env.CPUsPerTask, runtime.NumCPU()))
	}
	// Before anything slow: the stop signal's default action kills.
	stopCh := stopOnSignal(cfg.StopSignal, env.Rank)
	ctx, stop := signal.NotifyContext(c.Context, os.Interrupt, syscall.SIGTERM)
	defer stop()
	fail := func(err error) error {
		return cli.Exit(fmt.Sprintf("rank %d: %v", env.Rank, err), 1)
	}
	comm, err := nccl.Init(ctx, nccl.Options{
		Rank: env.Rank, Size: env.WorldSize,
		MasterAddr: env.MasterAddr, MasterPort: env.MasterPort,
		Token: runToken(dir, env.JobID),
	})
	if err != nil {
		return fail(err)
	}
	_, err = train.Run(ctx, cfg, comm, train.Options{RunDir: dir, Log: os.Stdout, Host: env.Node, Stop: stopCh, GPUOrdinal: env.GPUOrdinal})
	if errors.Is(err, train.ErrStopped) {
		closeWithin(comm, 2*time.Second)
		return stopped(dir, cfg, env, err)
	}
	if err != nil {
		// A failed world may wait on a dead peer to close; the error is
		// what matters, and exiting closes the sockets anyway.
		closeWithin(comm, 2*time.Second)
		return fail(err)
	}
	if cerr := comm.Close(); cerr != nil && ctx.Err() == nil {
		return fail(cerr)
	}
	return nil
}

// ExitStopped is the exit status of a task that stopped on the time-limit
// signal after saving a checkpoint (EX_TEMPFAIL: try again later).
const ExitStopped = 75

// stopOnSignal returns a channel closed when the process receives the
// stop signal (SIGUSR1, or SIGUSR2 when name says so): Slurm's
// --signal=USR1@<secs> before the time limit, or scancel --signal.
func stopOnSignal(name string, rank int) <-chan struct{} {
	sig := syscall.SIGUSR1
	if name == "USR2" {
		sig = syscall.SIGUSR2
	}
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, sig)
	stop := make(chan struct{})
	go func() {
		s := <-sigs
		signal.Stop(sigs)
		if rank == 0 {
			fmt.Fprintf(os.Stderr, "hpcrun: received %v: saving a checkpoint after this step, then stopping\n", s)
		}
		close(stop)
	}()
	return stop
}

// stopped ends a task that saved and stopped on the stop signal: rank 0 of
// a Slurm job requeues the job (scontrol requeue), which resumes from the
// checkpoint when it starts again, up to max_requeues times; every task
// exits with ExitStopped.
func stopped(dir string, cfg train.Config, env idrenv.Env, err error) error {
	msg := fmt.Sprintf("rank %d: %v", env.Rank, err)
	if env.Rank != 0 {
		return cli.Exit(msg, ExitStopped)
	}
	jobID := os.Getenv("SLURM_JOB_ID")
	resume := fmt.Sprintf("resume with: hpcrun submit --resume %s", filepath.Base(dir))
	switch {
	case jobID == "":
		msg += "; " + resume
	case env.RestartCount >= cfg.Requeues():
		msg += fmt.Sprintf("; the job was requeued %d times already (max_requeues = %d): %s", env.RestartCount, cfg.Requeues(), resume)
	default:
		out, rerr := exec.Command("scontrol", "requeue", jobID).CombinedOutput()
		if rerr != nil {
			msg += fmt.Sprintf("; scontrol requeue %s failed (%v: %s): %s", jobID, rerr, strings.TrimSpace(string(out)), resume)
		} else {
			msg += fmt.Sprintf("; requeued job %s (restart %d of at most %d), it resumes from the checkpoint", jobID, env.RestartCount+1, cfg.Requeues())
		}
	}
	return cli.Exit(msg, ExitStopped)
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

// runToken is the secret every task of a run presents to the rendezvous
// Store: the run dir's token file (hpcrun run writes one), else a "token"
// in meta.json, else one derived from the job id and the run dir, which
// every task of one job shares and another job does not.
func runToken(dir, jobID string) string {
	if b, err := os.ReadFile(filepath.Join(dir, "token")); err == nil {
		if s := strings.TrimSpace(string(b)); s != "" {
			return s
		}
	}
	if b, err := os.ReadFile(filepath.Join(dir, "meta.json")); err == nil {
		var m struct {
			Token string `json:"token"`
		}
		if json.Unmarshal(b, &m) == nil && m.Token != "" {
			return m.Token
		}
	}
	sum := sha256.Sum256([]byte("hpcrun\x00" + jobID + "\x00" + dir))
	return hex.EncodeToString(sum[:16])
}
