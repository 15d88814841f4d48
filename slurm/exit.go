package slurm

import (
	"fmt"
	"time"
)

// ExitStatus is how hpcrun ends once a run's job j is over: exit status 0
// when it completed, else the job's exit code (1 when it has none that a
// process can return) and a message saying how the job ended and where its
// errors are.
func (j JobInfo) ExitStatus(execID string) (int, string) {
	if j.State == Completed {
		return 0, ""
	}
	code := j.ExitCode
	if code <= 0 || code > 255 {
		code = 1
	}
	msg := fmt.Sprintf("run %s: job %s ended %s", execID, j.ID, j.State)
	if j.ExitCode != 0 {
		msg += fmt.Sprintf(" with exit code %d", j.ExitCode)
	}
	if j.Reason != "" && j.Reason != "NonZeroExitCode" {
		msg += " (" + j.Reason + ")"
	}
	return code, msg + "; see hpcrun logs --err " + execID
}

// TasksEnd is the final job state of a run whose tasks ran on this machine
// (hpcrun run) for took, as meta.json keeps it: completed; cancelled when
// a signal stopped every task cleanly (stoppedBy names it, StoppedBy); else
// failed, with the first failed task's exit code (err: the launcher's own
// failure).
func TasksEnd(m *Meta, failed []TaskExit, err error, took time.Duration) (final *JobInfo, stoppedBy string) {
	final = &JobInfo{ID: m.JobID, Name: m.Spec.Name, State: Completed, Elapsed: took.Round(time.Second), Nodes: 1, NodeList: m.Host, Source: "run"}
	stoppedBy = StoppedBy(failed)
	switch {
	case err == nil && len(failed) > 0 && stoppedBy != "":
		final.State, final.Reason, final.ExitCode = Cancelled, "stopped by "+stoppedBy, failed[0].ExitCode()
	case err != nil || len(failed) > 0:
		final.State, final.Reason, final.ExitCode = Failed, "NonZeroExitCode", 1
		if len(failed) > 0 {
			final.ExitCode = failed[0].ExitCode()
		}
	}
	return final, stoppedBy
}
