package dashboard

import (
	"testing"

	"github.com/hpcrun/hpcrun/cmd/hpcrun/internal/failure"
	"github.com/hpcrun/hpcrun/slurm"
	"github.com/hpcrun/hpcrun/train/metrics"
)

// TestRunRowSaysItOnce: a cancelled run's row reads CANCELLED, not
// "CANCELLED interrupted cancelled"; a killed one keeps its class, and a
// rejected submission reads NOT_SUBMITTED alone.
func TestRunRowSaysItOnce(t *testing.T) {
	for _, tc := range []struct {
		state          slurm.State
		status         string
		class          failure.Class
		note, failNote string
	}{
		{slurm.Cancelled, metrics.StatusInterrupted, failure.Cancelled, "", ""},
		{slurm.Failed, metrics.StatusFailed, failure.Killed, "", "killed"},
		{slurm.NotSubmitted, metrics.StatusNotSubmitted, failure.None, "", ""},
		{slurm.Failed, metrics.StatusInterrupted, failure.Killed, "interrupted", "killed"},
	} {
		r := runRow{HasJob: true, Job: Job{Info: slurm.JobInfo{State: tc.state}, Failure: tc.class}, Sum: metrics.Summary{Status: tc.status}}
		if got := r.StatusNote(); got != tc.note {
			t.Errorf("%s, status %s: note %q, want %q", tc.state, tc.status, got, tc.note)
		}
		if got := r.FailureNote(); got != tc.failNote {
			t.Errorf("%s, class %s: failure %q, want %q", tc.state, tc.class, got, tc.failNote)
		}
	}
}
