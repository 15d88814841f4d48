package main

import (
	"context"
	"os"
	"os/exec"
	"regexp"
	"syscall"
	"time"

	"github.com/hpcrun/hpcrun/slurm"
)

// stopReason says in words why a task stopped on sig, for its last line:
// Ctrl-C, scancel or hpcrun cancel, the time-limit signal, or the time
// limit itself (Slurm sends TERM when a job reaches it; the job's run time
// tells the two TERMs apart).
func stopReason(ctx context.Context, sig os.Signal) string {
	switch sig {
	case syscall.SIGINT:
		return "stopped by SIGINT (Ctrl-C)"
	case syscall.SIGTERM:
		if slurmTimeLimitReached(ctx, os.Getenv) {
			return "stopped by SIGTERM: the job's time limit reached"
		}
		return "stopped by SIGTERM (scancel or hpcrun cancel)"
	case syscall.SIGUSR1, syscall.SIGUSR2:
		return "stopped by the time-limit signal (" + sig.String() + ") before the job's time limit"
	}
	return "stopped with the other ranks (another rank got the signal)"
}

var (
	timeLimitRe = regexp.MustCompile(`\bTimeLimit=(\S+)`)
	runTimeRe   = regexp.MustCompile(`\bRunTime=(\S+)`)
)

// slurmTimeLimitReached reports whether this task's Slurm job has run for
// its whole time limit, as scontrol says; false outside a real Slurm job.
func slurmTimeLimitReached(ctx context.Context, getenv func(string) string) bool {
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
	limit, err := slurm.ParseTime(string(lim[1]))
	if err != nil {
		return false // UNLIMITED
	}
	used, err := slurm.ParseTime(string(run[1]))
	return err == nil && used >= limit
}
