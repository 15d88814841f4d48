package main

import (
	"bytes"
	"context"
	"io"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/hpcrun/hpcrun/internal/rundir"
	"github.com/hpcrun/hpcrun/slurm"
	"github.com/hpcrun/hpcrun/train/metrics"
)

// A rank that fails on its own error (its metrics file cannot be opened)
// makes it the job's: the other ranks stop within seconds, each quoting
// that rank, its host and its message, and their end lines say so;
// nobody waits out the collective timeout to blame a healthy rank.
func TestOwnFailureStopsThePeersQuotingIt(t *testing.T) {
	if testing.Short() {
		t.Skip("trains")
	}
	e := newEnv(t)
	e.mustRun("run", "--nproc", "4", "--tp", "2", "--steps", "1")
	dir := rundir.Dir(e.onlyRun())
	bad := dir.RankMetrics(2)
	if err := os.Remove(bad); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(bad, 0o755); err != nil { // opening it for appending fails
		t.Fatal(err)
	}
	ln, port, err := slurm.ListenMaster()
	if err != nil {
		t.Fatal(err)
	}
	stderr := make([]bytes.Buffer, 4)
	tasks := slurm.Tasks{N: 4, Program: e.bin, Args: []string{"train", "--run-dir", dir.Path()}, Master: ln,
		Vars: slurm.TorchrunVars(4, port, dir.ExecID(), "run"), Grace: time.Minute,
		Output: func(r int) (_, _ io.Writer) { return io.Discard, &stderr[r] }}
	start := time.Now()
	failed, err := tasks.Run(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	took := time.Since(start)
	if len(failed) != 4 {
		t.Fatalf("%d ranks failed, want all 4", len(failed))
	}
	host := shortHostname()
	for r := range 4 {
		msg := stderr[r].String()
		if r == 2 {
			if !strings.Contains(msg, "rank 2: metrics:") || !strings.Contains(msg, "is a directory") {
				t.Errorf("rank 2 says %q: want its own error", msg)
			}
			continue
		}
		if !strings.Contains(msg, "rank 2 ("+host+"): metrics:") || !strings.Contains(msg, "is a directory") {
			t.Errorf("rank %d says %q: want rank 2 on %s and its error", r, msg, host)
		}
		l, err := metrics.ReadRank(dir.RankMetrics(r))
		if err != nil {
			t.Fatal(err)
		}
		if l.End == nil || l.End.Status != metrics.StatusFailed || !strings.Contains(l.End.Error, "rank 2 (") || !strings.Contains(l.End.Error, "is a directory") {
			t.Errorf("rank %d's end line %+v: want failed, quoting rank 2", r, l.End)
		}
	}
	if took > 15*time.Second {
		t.Errorf("the ranks took %v to stop: they waited for rank 2 instead of hearing of its failure", took)
	}
}
