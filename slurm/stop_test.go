package slurm

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// A task stopped by TERM says whether its job reached its time limit (as
// scontrol reports it), by Ctrl-C, or by scancel; not "stopped on request".
func TestStopReason(t *testing.T) {
	bin := t.TempDir()
	t.Setenv("PATH", bin+":"+os.Getenv("PATH"))
	scontrol := func(runTime string) {
		os.WriteFile(filepath.Join(bin, "scontrol"), []byte("#!/bin/sh\necho 'JobId=7 JobName=x TimeLimit=00:01:00 RunTime="+runTime+" Partition=debug'\n"), 0o755)
	}
	t.Setenv("SLURM_JOB_ID", "7")
	t.Setenv("HPCRUN_EXECUTOR", "slurm")
	ctx := context.Background()
	scontrol("00:01:02")
	if got := StopReason(ctx, syscall.SIGTERM); !strings.Contains(got, "time limit reached") {
		t.Errorf("TERM at the time limit: %q", got)
	}
	scontrol("00:00:20")
	if got := StopReason(ctx, syscall.SIGTERM); !strings.Contains(got, "scancel") {
		t.Errorf("TERM before the time limit: %q", got)
	}
	if got := StopReason(ctx, syscall.SIGINT); !strings.Contains(got, "Ctrl-C") {
		t.Errorf("INT: %q", got)
	}
	if got := StopReason(ctx, syscall.SIGUSR1); !strings.Contains(got, "time-limit signal") {
		t.Errorf("USR1: %q", got)
	}
	if got := StopReason(ctx, nil); got != "" {
		t.Errorf("no signal of the task's own (a relayed stop): %q, want \"\"", got)
	}
}

func TestStoppedBy(t *testing.T) {
	exit := func(code int) TaskExit {
		err := exec.Command("sh", "-c", "exit "+strconv.Itoa(code)).Run()
		return TaskExit{Err: err}
	}
	for _, c := range []struct {
		codes []int
		want  string
	}{
		{[]int{130, 75}, "SIGINT"},
		{[]int{143, 130}, "SIGINT"},
		{[]int{75, 143}, "SIGTERM"},
		{[]int{75, 75}, "the time-limit signal"},
		{[]int{143, 1}, ""},
		{nil, ""},
	} {
		var failed []TaskExit
		for _, code := range c.codes {
			failed = append(failed, exit(code))
		}
		if got := StoppedBy(failed); got != c.want {
			t.Errorf("StoppedBy(exits %v) = %q, want %q", c.codes, got, c.want)
		}
	}
}

// TestStopOnSignals feeds signals as HoldSignals would: the other USR
// signal, come early, is ignored; the time-limit signal asks to stop (C
// closes, Signal names it) without cancelling; a TERM after it cancels.
func TestStopOnSignals(t *testing.T) {
	sigs := make(chan os.Signal, 4)
	sigs <- syscall.SIGUSR1
	sigs <- syscall.SIGUSR2
	cancelled := make(chan struct{})
	s := StopOnSignals(sigs, "USR2", 1, func() { close(cancelled) })
	select {
	case <-s.C:
	case <-time.After(5 * time.Second):
		t.Fatal("the time-limit signal did not ask to stop")
	}
	if s.Signal() != syscall.SIGUSR2 {
		t.Errorf("stopped by %v, want USR2 (USR1 is not this task's stop signal)", s.Signal())
	}
	sigs <- syscall.SIGUSR2 // the limit again: no hurry
	sigs <- syscall.SIGTERM
	select {
	case <-cancelled:
	case <-time.After(5 * time.Second):
		t.Fatal("a TERM after the stop did not cancel")
	}
}

func TestStopExit(t *testing.T) {
	env := func(executor string) func(string) string {
		return func(k string) string {
			if k == "HPCRUN_EXECUTOR" {
				return executor
			}
			return ""
		}
	}
	ctx := context.Background()
	for _, c := range []struct {
		executor string
		sig      os.Signal
		rank     int
		msg      string
		code     int
	}{
		{"slurm", syscall.SIGTERM, 0, "m; resume with: hpcrun submit --resume e", 143},
		{"run", syscall.SIGINT, 0, "m", 130},
		{"slurm", syscall.SIGINT, 1, "", 130},
		{"local", syscall.SIGUSR1, 1, "", ExitStopped},
		{"local", syscall.SIGUSR1, 0, "m; not requeued (the local executor has no queue): resume with: hpcrun submit --resume e", ExitStopped},
		{"run", nil, 0, "m; not requeued (hpcrun run has no queue; it says how to resume)", ExitStopped},
	} {
		msg, code := StopExit(ctx, env(c.executor), c.sig, c.rank, "e", 0, 3, "m")
		if msg != c.msg || code != c.code {
			t.Errorf("%s %v rank %d: %q %d; want %q %d", c.executor, c.sig, c.rank, msg, code, c.msg, c.code)
		}
	}
}
