package slurm

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hpcrun/hpcrun/internal/rundir"
)

// TestFollowLog copies a log whose job is over, once, and says why a log
// is missing: the run was made elsewhere, or the file is simply not there.
func TestFollowLog(t *testing.T) {
	dir, err := rundir.New(t.TempDir(), time.Now())
	if err != nil {
		t.Fatal(err)
	}
	r := Run{Dir: dir, Meta: &Meta{ExecID: dir.ExecID(), JobID: "7", Final: &JobInfo{ID: "7", State: Completed}}}
	path := dir.Log("7", false)
	os.WriteFile(path, []byte("step 1\nstep 2\n"), 0o644)
	var b bytes.Buffer
	if err := r.FollowLog(context.Background(), path, &b); err != nil || b.String() != "step 1\nstep 2\n" {
		t.Errorf("FollowLog: %q, %v", b.String(), err)
	}
	missing := filepath.Join(dir.Path(), "slurm-8.out")
	if err := r.NoLog(context.Background(), missing); err == nil || !strings.HasPrefix(err.Error(), "no slurm-8.out in ") {
		t.Errorf("NoLog: %v", err)
	}
	r.Meta.Spec.RunDir, r.Meta.Host = "/elsewhere/run", "login2"
	if err := r.NoLog(context.Background(), missing); err == nil || !strings.Contains(err.Error(), "was made in /elsewhere/run on login2") {
		t.Errorf("NoLog of a moved run: %v", err)
	}
	r.Meta.Final = &JobInfo{ID: "7", State: Running}
	if err := r.NoLog(context.Background(), missing); err == nil || !strings.Contains(err.Error(), "is RUNNING: no output yet") {
		t.Errorf("NoLog of a running job: %v", err)
	}
}
