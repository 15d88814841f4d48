package slurm

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strconv"
	"strings"
	"time"
)

// State is a job state in Slurm's words (PENDING, RUNNING, COMPLETED, ...).
// The Local executor uses the same words.
type State string

// Job states hpcrun branches on; Slurm has more, kept as they come.
const (
	Pending   State = "PENDING"
	Running   State = "RUNNING"
	Completed State = "COMPLETED"
	Failed    State = "FAILED"
	Cancelled State = "CANCELLED"
	Timeout   State = "TIMEOUT"
	Unknown   State = "UNKNOWN" // finished, but nothing remembers how
	// NotSubmitted is hpcrun's state of a run whose submission failed: no
	// job exists, and none will.
	NotSubmitted State = "NOT_SUBMITTED"
)

// Done reports whether the job will not run again (by itself).
func (s State) Done() bool {
	switch s {
	case Completed, Failed, Cancelled, Timeout, Unknown, "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED",
		"BOOT_FAIL", "DEADLINE", "REVOKED", "SPECIAL_EXIT":
		return true
	}
	return false
}

// JobInfo is what a scheduler says about one job.
type JobInfo struct {
	ID        string        `json:"jobid"`
	Name      string        `json:"name,omitempty"`
	State     State         `json:"state"`
	Reason    string        `json:"reason,omitempty"` // why pending or how it ended; "" for none
	Elapsed   time.Duration `json:"elapsed_ns"`
	Nodes     int           `json:"nodes,omitempty"`
	NodeList  string        `json:"nodelist,omitempty"`
	Partition string        `json:"partition,omitempty"`
	TimeLimit string        `json:"time_limit,omitempty"`
	ExitCode  int           `json:"exit_code"`          // the batch script's exit status; 128+n when killed by signal n
	Restarts  int           `json:"restarts,omitempty"` // times the job was requeued (scontrol)
	Source    string        `json:"source,omitempty"`   // squeue, scontrol, sacct, local
	// WorkDir, Comment and SubmitTime tell a job from another that got
	// the same id (Run.CheckOwner); empty where the source does not say.
	WorkDir    string    `json:"work_dir,omitempty"`
	Comment    string    `json:"comment,omitempty"`
	SubmitTime time.Time `json:"submit_time,omitzero"`
}

// JobRef names a job to an executor: its id and the run directory holding it.
type JobRef struct {
	ID     string
	RunDir string
}

// Submission is what Executor.Submit starts.
type Submission struct {
	Spec   JobSpec
	Script string // path of the rendered job script, inside Spec.RunDir
}

// Executor starts job scripts and answers for their state.
type Executor interface {
	// Name is "slurm" or "local", as recorded in meta.json.
	Name() string
	// Submit starts the job and returns its id without waiting for it.
	Submit(ctx context.Context, sub Submission) (jobID, cluster string, err error)
	// Queue lists the jobs the scheduler holds for this user now; all adds
	// the finished ones it still remembers.
	Queue(ctx context.Context, all bool) ([]JobInfo, error)
	// Status says what became of one job, finished jobs included. A job that
	// nothing remembers has State Unknown.
	Status(ctx context.Context, ref JobRef) (JobInfo, error)
	// Cancel stops a job, pending or running.
	Cancel(ctx context.Context, ref JobRef) error
}

// ErrNoSlurm means the Slurm commands are missing or the controller does not answer.
var ErrNoSlurm = errors.New("slurm is not reachable")

// New returns the executor called name: "slurm", "local", or "auto" (Slurm
// when sbatch is on PATH and the controller answers, else Local).
func New(name string) (Executor, error) {
	switch name {
	case "slurm":
		if _, err := exec.LookPath("sbatch"); err != nil {
			return nil, fmt.Errorf("executor slurm: sbatch is not on PATH (%w); use --executor local to run on this machine", ErrNoSlurm)
		}
		return &Slurm{}, nil
	case "local":
		return &Local{}, nil
	case "auto", "":
		if _, err := exec.LookPath("sbatch"); err == nil && controllerUp() {
			return &Slurm{}, nil
		}
		return &Local{}, nil
	}
	return nil, fmt.Errorf("executor %q: use slurm, local or auto", name)
}

// parseElapsed reads Slurm's [D-][HH:]MM:SS durations.
func parseElapsed(s string) time.Duration {
	var days int
	if d, rest, ok := strings.Cut(s, "-"); ok {
		days, _ = strconv.Atoi(d)
		s = rest
	}
	var secs int
	for _, p := range strings.Split(s, ":") {
		n, err := strconv.Atoi(p)
		if err != nil {
			return 0
		}
		secs = secs*60 + n
	}
	return time.Duration(days*86400+secs) * time.Second
}

// FormatElapsed writes d as Slurm does: [D-]HH:MM:SS, or M:SS under an hour.
func FormatElapsed(d time.Duration) string {
	s := int(d / time.Second)
	days, h, m, sec := s/86400, s/3600%24, s/60%60, s%60
	switch {
	case days > 0:
		return fmt.Sprintf("%d-%02d:%02d:%02d", days, h, m, sec)
	case h > 0:
		return fmt.Sprintf("%d:%02d:%02d", h, m, sec)
	}
	return fmt.Sprintf("%d:%02d", m, sec)
}

// exitCode reads Slurm's "status:signal" exit code.
func exitCode(s string) int {
	st, sig, _ := strings.Cut(s, ":")
	a, _ := strconv.Atoi(st)
	b, _ := strconv.Atoi(sig)
	if a == 0 && b != 0 {
		return 128 + b
	}
	return a
}

// controllerUp reports whether slurmctld answers `scontrol ping` within a
// few seconds: Slurm's client packages without a running controller (a
// laptop, a CI machine) should not make "auto" choose a queue nobody serves.
func controllerUp() bool {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return exec.CommandContext(ctx, "scontrol", "ping").Run() == nil
}
