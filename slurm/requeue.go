package slurm

import (
	"context"
	"fmt"
	"os/exec"
	"strings"

	"github.com/hpcrun/hpcrun/internal/units"
)

// Requeue is what the task of rank 0 does when the job should start again
// from its last checkpoint: after every rank saved and stopped on the
// time-limit signal, or after a peer was lost with its node. In a Slurm job
// it requeues the job (scontrol requeue) unless restarts already reached
// maxRequeues. It returns a sentence for the task's last message, saying
// what happened and how to go on.
//
// It never runs scontrol outside a real Slurm job: tasks of the Local
// executor and of `hpcrun run` (HPCRUN_EXECUTOR local or run) have a
// SLURM_JOB_ID that is a process id on this machine, or the id of the
// allocation the launcher ran in, and requeueing that would touch a job that
// is not theirs.
func Requeue(ctx context.Context, getenv func(string) string, execID string, restarts, maxRequeues int) string {
	resume := "resume with: hpcrun submit --resume " + execID
	jobID := getenv("SLURM_JOB_ID")
	switch ex := getenv("HPCRUN_EXECUTOR"); {
	case ex == "run":
		return "not requeued (hpcrun run has no queue; it says how to resume)"
	case ex == "local":
		return fmt.Sprintf("not requeued (the %s executor has no queue): %s", ex, resume)
	case jobID == "":
		return resume
	case restarts >= maxRequeues:
		return fmt.Sprintf("the job was requeued %s already (max_requeues = %d): %s", units.Count(restarts, "time"), maxRequeues, resume)
	}
	out, err := exec.CommandContext(ctx, "scontrol", "requeue", jobID).CombinedOutput()
	if err != nil {
		return fmt.Sprintf("scontrol requeue %s failed (%v: %s): %s", jobID, err, strings.TrimSpace(string(out)), resume)
	}
	return fmt.Sprintf("requeued job %s (restart %d of at most %d), it resumes from the checkpoint", jobID, restarts+1, maxRequeues)
}
