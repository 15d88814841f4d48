// Package failure names why a run ended badly: out of memory, time limit,
// preempted, node failure, comm timeout / lost rank, cancelled, data or
// config error, or unknown. It reads the evidence a run leaves (Slurm's state
// and reason for its job, the end lines of its ranks' metrics files, and the
// head and tail of the job's stderr and stdout) and returns the class with
// the one line that decided it.
//
// hpcrun queue, hpcrun metrics and the dashboard of hpcrun serve all call
// Classify, so a run has the same failure class everywhere. It sits under
// cmd/hpcrun because it joins what the scheduler says (slurm) with what the
// training wrote (train/metrics); neither of those knows the other.
package failure

import (
	"fmt"
	"regexp"
	"strings"

	"github.com/hpcrun/hpcrun/slurm"
	"github.com/hpcrun/hpcrun/train/metrics"
)

// Class is a failure class; the zero value None means the run did not fail
// (it completed, or has not ended).
type Class string

// The failure classes.
const (
	None        Class = ""
	OutOfMemory Class = "out of memory"
	TimeLimit   Class = "time limit"
	Preempted   Class = "preempted"
	NodeFailure Class = "node failure"
	CommLost    Class = "comm timeout / lost rank"
	Cancelled   Class = "cancelled"
	DataConfig  Class = "data or config error"
	Killed      Class = "killed"
	Unknown     Class = "unknown"
)

// Classes lists every class but None, in the order Classify tries them
// after Slurm's own state.
var Classes = []Class{OutOfMemory, TimeLimit, Preempted, NodeFailure, Cancelled, DataConfig, Killed, CommLost, Unknown}

// Evidence is what a run left behind about how it ended.
type Evidence struct {
	// Job is the scheduler's last word on the run's job; State is empty
	// when nothing is known.
	Job slurm.JobInfo
	// RunStatus is what the ranks' end lines say: metrics.StatusFailed when
	// one failed, metrics.StatusInterrupted when one was stopped,
	// metrics.StatusCompleted when all completed, "" without end lines.
	RunStatus string
	// RunError is the first failed (else interrupted) rank's error, "rank N: ...".
	RunError string
	// NoEnd are the ranks whose metrics file holds no end line: killed
	// before they could write one, when the job is over.
	NoEnd []int
	// Log is the head and tail of the job's stderr and stdout.
	Log string
}

// Verdict is a class and the evidence that decided it, one line.
type Verdict struct {
	Class Class  `json:"class,omitempty"`
	Why   string `json:"why,omitempty"`
}

// String is "class (why)", or "" for None.
func (v Verdict) String() string {
	if v.Class == None {
		return ""
	}
	if v.Why == "" {
		return string(v.Class)
	}
	return string(v.Class) + " (" + v.Why + ")"
}

// The patterns, tried on every line of the run's error and logs. Each is
// matched case-insensitively; the first class (in Classes' order) with a
// matching line wins, so a rank killed for memory whose peers then lost it
// is out of memory, not a lost rank.
var patterns = map[Class]*regexp.Regexp{
	// Go's runtime, the Linux OOM killer through slurmstepd's cgroup
	// watcher, CUDA and cuBLAS, C++ and the kernel's ENOMEM.
	OutOfMemory: regexp.MustCompile(`(?i)out of memory|oom[-_ ]kill|CUDA_ERROR_OUT_OF_MEMORY|CUBLAS_STATUS_ALLOC_FAILED|cannot allocate memory|std::bad_alloc|exceeded (job )?memory limit`),
	// slurmstepd: "*** JOB 15 ON vm CANCELLED AT ... DUE TO TIME LIMIT ***"
	TimeLimit:   regexp.MustCompile(`(?i)DUE TO TIME LIMIT|time limit (exceeded|reached)|time-limit signal`),
	Preempted:   regexp.MustCompile(`(?i)DUE TO PREEMPTION`),
	NodeFailure: regexp.MustCompile(`(?i)DUE TO NODE FAIL|node failure|Node \S+ not responding`),
	// slurmstepd's line for scancel (no "DUE TO"), and hpcrun's ranks
	// stopped by INT or TERM outside Slurm.
	Cancelled: regexp.MustCompile(`(?i)\bCANCELLED AT \S+( by \S+)? \*\*\*|stopped on request|stopped by SIG(INT|TERM) \(`),
	// The training's own checks of its config and data, and programs or
	// files the job script could not find.
	DataConfig: regexp.MustCompile(`(?i)(^|: )(data|training config|csv( header)?|tokenizer|vocab(ulary)?|config|line \d+)\b[^:]*:|unknown key|execve\(\)|no such file or directory`),
	// nccl's PeerError and store timeouts, broken TCP rings, NCCL's own.
	CommLost: regexp.MustCompile(`(?i)timed out|lost its connection|connection (reset|refused)|broken pipe|no answer within|did not answer|ncclRemoteError|ncclSystemError|NCCL (error|WARN)|rendezvous`),
}

// killedLine is srun's or slurmstepd's word on a task killed by a signal.
var killedLine = regexp.MustCompile(`(?i)\bKilled\b|signal 9|terminated by signal`)

// srunKilled is bash's word, in the job's stderr, on the job script's srun
// killed by a signal.
var srunKilled = regexp.MustCompile(`\bKilled[ \t]+srun\b`)

// Classify names why a run ended badly, or None when it did not (still
// pending or running, or completed).
func Classify(e Evidence) Verdict {
	st := e.Job.State
	runBad := e.RunStatus == metrics.StatusFailed || e.RunStatus == metrics.StatusInterrupted
	switch {
	case st == slurm.Completed && e.RunStatus != metrics.StatusFailed:
		return Verdict{}
	case st == "" || st == slurm.Unknown:
		if !runBad {
			return Verdict{}
		}
	case !st.Done():
		return Verdict{}
	}
	why := "Slurm state " + string(st)
	if e.Job.Reason != "" && e.Job.Reason != "None" {
		why += ", reason " + e.Job.Reason
	}
	switch st {
	case "OUT_OF_MEMORY":
		return Verdict{OutOfMemory, why}
	case slurm.Timeout, "DEADLINE":
		return Verdict{TimeLimit, why}
	case "PREEMPTED":
		return Verdict{Preempted, why}
	case "NODE_FAIL", "BOOT_FAIL":
		return Verdict{NodeFailure, why}
	}
	if e.Job.Reason == slurm.ReasonLauncherDied || e.Job.Reason == slurm.ReasonSupervisorDied {
		return Verdict{Killed, e.Job.Reason}
	}
	if line := matchLine(srunKilled, e.Log); line != "" && st != slurm.Cancelled {
		// srun itself was killed: slurmd then stops the ranks with TERM,
		// which they record as a stop on request.
		return Verdict{Killed, line}
	}
	text := e.RunError + "\n" + e.Log
	for _, c := range Classes {
		if c == Cancelled && st == slurm.Cancelled {
			return Verdict{Cancelled, why}
		}
		killedLine := matchLine(killedLine, e.Log)
		if c == Killed && len(e.NoEnd) > 0 && (killedLine != "" || e.Log == "") {
			// Before CommLost: the peers of a killed rank fail for want
			// of it, and are not to blame. A rank stopped by srun after
			// its peers failed (no kill in the log) is not killed.
			v := Verdict{Killed, fmt.Sprintf("rank %d wrote no end line", e.NoEnd[0])}
			if len(e.NoEnd) > 1 {
				v.Why = fmt.Sprintf("%d ranks wrote no end line, the first rank %d", len(e.NoEnd), e.NoEnd[0])
			}
			if killedLine != "" {
				v.Why += ": " + killedLine
			}
			return v
		}
		re := patterns[c]
		if re == nil {
			continue
		}
		if line := matchLine(re, text); line != "" {
			return Verdict{c, line}
		}
	}
	if e.RunError != "" {
		return Verdict{Unknown, firstLine(e.RunError)}
	}
	return Verdict{Unknown, why}
}

// matchLine is the first line of text that re matches, trimmed to at most
// 160 characters.
func matchLine(re *regexp.Regexp, text string) string {
	loc := re.FindStringIndex(text)
	if loc == nil {
		return ""
	}
	start := strings.LastIndexByte(text[:loc[0]], '\n') + 1
	end := strings.IndexByte(text[loc[0]:], '\n')
	if end < 0 {
		end = len(text)
	} else {
		end += loc[0]
	}
	return clip(strings.TrimSpace(text[start:end]))
}

func firstLine(s string) string {
	s, _, _ = strings.Cut(s, "\n")
	return clip(strings.TrimSpace(s))
}

func clip(s string) string {
	const n = 160
	if len(s) <= n {
		return s
	}
	return s[:n-3] + "..."
}
