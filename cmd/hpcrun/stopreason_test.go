package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
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
	if got := stopReason(ctx, syscall.SIGTERM); !strings.Contains(got, "time limit reached") {
		t.Errorf("TERM at the time limit: %q", got)
	}
	scontrol("00:00:20")
	if got := stopReason(ctx, syscall.SIGTERM); !strings.Contains(got, "scancel") {
		t.Errorf("TERM before the time limit: %q", got)
	}
	if got := stopReason(ctx, syscall.SIGINT); !strings.Contains(got, "Ctrl-C") {
		t.Errorf("INT: %q", got)
	}
	if got := stopReason(ctx, syscall.SIGUSR1); !strings.Contains(got, "time-limit signal") {
		t.Errorf("USR1: %q", got)
	}
}
