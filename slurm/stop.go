package slurm

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"regexp"
	"sync/atomic"
	"syscall"
	"time"
)

// ExitStopped is the exit status of a task that stopped on the time-limit
// signal after saving a checkpoint (EX_TEMPFAIL: try again later).
const ExitStopped = 75

// Stop is a request to stop: C is closed when a signal asks the task to.
type Stop struct {
	C   chan struct{}
	got atomic.Value // the os.Signal that closed C
}

// Signal is the signal that asked to stop; nil before one did.
func (s *Stop) Signal() os.Signal {
	sig, _ := s.got.Load().(os.Signal)
	return sig
}

// HoldSignals catches the signals that ask a task to stop before the task
// knows which one is its time-limit signal; they wait in the channel until
// StopOnSignals reads them. A task calls it first of all: a stop signal
// that comes right after a requeue, or with a time limit shorter than the
// signal's lead, is held until the task can honour it, instead of being
// lost (Go ignores an unhandled USR1, and Slurm sends it once) or killing
// it.
func HoldSignals() chan os.Signal {
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, syscall.SIGUSR1, syscall.SIGUSR2, os.Interrupt, syscall.SIGTERM)
	return sigs
}

// StopOnSignals turns the time-limit signal (SIGUSR1, or SIGUSR2 when name
// says so: Slurm's --signal=USR1@<secs>, or scancel --signal), SIGINT and
// SIGTERM (Ctrl-C, scancel, hpcrun cancel), as they arrive on sigs from
// HoldSignals (those that came early first), into one request: every rank
// stops after the same step and saves, whichever rank got the signal, so no
// rank dies under the others. A second INT or TERM cancels at once. The
// other USR signal gets its default action back (one that came early is
// ignored, with a word). Rank 0 alone says what it received: a launcher
// (srun, scancel, hpcrun run) signals every rank, and n ranks saying it
// made n lines.
func StopOnSignals(sigs chan os.Signal, name string, rank int, cancel context.CancelFunc) *Stop {
	limit, other := syscall.SIGUSR1, syscall.SIGUSR2
	if name == "USR2" {
		limit, other = other, limit
	}
	signal.Reset(other)
	s := &Stop{C: make(chan struct{})}
	go func() {
		first := <-sigs
		for first == other {
			fmt.Fprintf(os.Stderr, "hpcrun: rank %d ignored %v that came before it knew its stop signal (%v)\n", rank, first, limit)
			first = <-sigs
		}
		s.got.Store(first)
		if rank == 0 {
			fmt.Fprintf(os.Stderr, "hpcrun: rank %d received %v: every rank stops after this step and saves a checkpoint (again to stop at once)\n", rank, first)
		}
		close(s.C)
		for sig := range sigs {
			if sig != limit {
				if rank == 0 {
					fmt.Fprintf(os.Stderr, "hpcrun: rank %d received %v again: stopping now\n", rank, sig)
				}
				cancel()
				signal.Stop(sigs)
				return
			}
		}
	}()
	return s
}

// StoppedBy names what stopped every failed task cleanly, each having
// saved at the same step: SIGINT or SIGTERM (a task exits 128+signal), or
// the time-limit signal (ExitStopped, also the exit of a task stopped by
// another's signal); "" when some task failed otherwise.
func StoppedBy(failed []TaskExit) string {
	name := ""
	for _, f := range failed {
		switch f.ExitCode() {
		case 128 + int(syscall.SIGINT):
			name = "SIGINT"
		case 128 + int(syscall.SIGTERM):
			if name != "SIGINT" {
				name = "SIGTERM"
			}
		case ExitStopped:
			if name == "" {
				name = "the time-limit signal"
			}
		default:
			return ""
		}
	}
	return name
}

// StopReason says in words why a task stopped on sig, for its last line:
// Ctrl-C, scancel or hpcrun cancel, the time-limit signal, or the time
// limit itself (Slurm sends TERM when a job reaches it; the job's run time
// tells the two TERMs apart); "" for a task that stopped without a signal
// of its own (another rank got it and relayed the stop).
func StopReason(ctx context.Context, sig os.Signal) string {
	switch sig {
	case syscall.SIGINT:
		return "stopped by SIGINT (Ctrl-C)"
	case syscall.SIGTERM:
		if timeLimitReached(ctx, os.Getenv) {
			return "stopped by SIGTERM: the job's time limit reached"
		}
		return "stopped by SIGTERM (scancel or hpcrun cancel)"
	case syscall.SIGUSR1, syscall.SIGUSR2:
		return "stopped by the time-limit signal (" + sig.String() + ") before the job's time limit"
	}
	return ""
}

var (
	timeLimitRe = regexp.MustCompile(`\bTimeLimit=(\S+)`)
	runTimeRe   = regexp.MustCompile(`\bRunTime=(\S+)`)
)

// timeLimitReached reports whether this task's Slurm job has run for
// its whole time limit, as scontrol says; false outside a real Slurm job.
func timeLimitReached(ctx context.Context, getenv func(string) string) bool {
	id := getenv("SLURM_JOB_ID")
	if id == "" || getenv("HPCRUN_EXECUTOR") == "local" || getenv("HPCRUN_EXECUTOR") == "run" {
		return false
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, "scontrol", "show", "job", "-o", id).Output()
	if err != nil {
		return false
	}
	lim, run := timeLimitRe.FindSubmatch(out), runTimeRe.FindSubmatch(out)
	if lim == nil || run == nil {
		return false
	}
	limit, err := ParseTime(string(lim[1]))
	if err != nil {
		return false // UNLIMITED
	}
	used, err := ParseTime(string(run[1]))
	return err == nil && used >= limit
}

// StopExit is how a task of rank that saved and stopped on sig ends, msg
// its last words, which rank 0 alone says (the others return ""). After
// the time-limit signal, rank 0 lets slurm requeue the job when it is a
// real Slurm job (Requeue, execID's restarts of at most maxRequeues), and
// every task exits with ExitStopped; after INT or TERM every task exits
// 128+signal, as a killed one would, and rank 0 says so with the way to
// resume (hpcrun run's launcher says it itself, once). getenv is
// os.Getenv.
func StopExit(ctx context.Context, getenv func(string) string, sig os.Signal, rank int, execID string, restarts, maxRequeues int, msg string) (string, int) {
	if s, ok := sig.(syscall.Signal); ok && (s == syscall.SIGINT || s == syscall.SIGTERM) {
		switch {
		case rank != 0:
			msg = ""
		case getenv("HPCRUN_EXECUTOR") != "run":
			msg += "; resume with: hpcrun submit --resume " + execID
		}
		return msg, 128 + int(s)
	}
	if rank != 0 {
		return "", ExitStopped
	}
	return msg + "; " + Requeue(ctx, getenv, execID, restarts, maxRequeues), ExitStopped
}
