package slurm

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"
)

// NoLog says why the run has no log file at path yet, or not any more.
func (r Run) NoLog(ctx context.Context, path string) error {
	j, err := r.Status(ctx)
	if err == nil && !j.State.Done() {
		return fmt.Errorf("run %s (job %s) is %s: no output yet (use --follow to wait for it)", r.Meta.ExecID, j.ID, j.State)
	}
	if r.Meta.Spec.RunDir != "" && r.Meta.Spec.RunDir != r.Dir.Path() {
		return fmt.Errorf("no %s: run %s was made in %s on %s; its logs are there", filepath.Base(path), r.Meta.ExecID, r.Meta.Spec.RunDir, r.Meta.Host)
	}
	return fmt.Errorf("no %s in %s", filepath.Base(path), r.Dir)
}

// FollowLog copies the log file at path to w as it grows (hpcrun logs
// --follow) until the run's job is over, or ctx ends.
func (r Run) FollowLog(ctx context.Context, path string, w io.Writer) error {
	var off int64
	lastCheck := time.Time{}
	for {
		done := false
		if time.Since(lastCheck) > time.Second {
			j, err := r.Status(ctx)
			if err != nil {
				return err
			}
			done, lastCheck = j.State.Done(), time.Now()
		}
		if f, err := os.Open(path); err == nil {
			f.Seek(off, io.SeekStart)
			n, _ := io.Copy(w, f)
			off += n
			f.Close()
		}
		if done {
			return nil
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(200 * time.Millisecond):
		}
	}
}
