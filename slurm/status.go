package slurm

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Host is this machine's name without its domain, as a run's meta.json
// records where it was submitted or started.
func Host() string { return shortHost() }

// Executor is the executor that ran r: Slurm or Local. A run of hpcrun run
// (executor "run") has none: its ranks were started in the foreground.
func (r Run) Executor() (Executor, error) {
	switch r.Meta.Executor {
	case "slurm", "local":
		return New(r.Meta.Executor)
	case "run":
		return nil, fmt.Errorf("run %s was started by hpcrun run in the foreground: it has no job to ask about or cancel", r.Meta.ExecID)
	}
	return nil, fmt.Errorf("run %s: unknown executor %q in %s", r.Meta.ExecID, r.Meta.Executor, r.Dir.Meta())
}

// Status is the state of r's job: the final state cached in meta.json
// when there is one, else its executor's answer, cached in meta.json once
// the job is over so that it survives slurmctld forgetting the job. A run
// of hpcrun run is going on while its launcher lives (on this machine); a
// run never submitted is NotSubmitted, with sbatch's words as the reason.
func (r Run) Status(ctx context.Context) (JobInfo, error) {
	if r.Meta.Final != nil {
		return *r.Meta.Final, nil
	}
	if r.Meta.Executor == "run" {
		j := foregroundStatus(r, Host())
		if j.State == Failed {
			// The launcher records its end before it exits; r's meta may
			// have been read before that.
			if m, err := ReadMeta(r.Dir); err == nil && m.Final != nil {
				return *m.Final, nil
			}
		}
		return j, nil
	}
	if r.Meta.JobID == "" {
		return JobInfo{State: NotSubmitted, Reason: r.Meta.SubmitError}, nil
	}
	ex, err := r.Executor()
	if err != nil {
		return JobInfo{}, err
	}
	j, err := ex.Status(ctx, JobRef{ID: r.Meta.JobID, RunDir: r.Dir.Path()})
	if err != nil {
		return j, fmt.Errorf("run %s (job %s): %w", r.Meta.ExecID, r.Meta.JobID, err)
	}
	if r.Meta.Executor == "slurm" {
		if err := r.CheckOwner(j); err != nil {
			// The run's job is over and forgotten; its id now names another.
			return JobInfo{ID: r.Meta.JobID, Name: r.Meta.Spec.Name, State: Unknown, Reason: err.Error(), Source: j.Source}, nil
		}
	}
	if j.Name == "" {
		j.Name = r.Meta.Spec.Name
	}
	if j.State.Done() && j.State != Unknown {
		cached := j
		r.Meta.Final = &cached
		// A read-only runs dir still gets an answer; the cache is a convenience.
		_ = WriteMeta(r.Dir, r.Meta)
	}
	return j, nil
}

// foregroundStatus is the state, seen from the machine host, of a run of
// hpcrun run that has not written its Final yet: going on while its
// launcher (JobID is its pid) lives, failed once it is gone without saying
// how it ended, unknown from another machine than the one it started on.
func foregroundStatus(r Run, host string) JobInfo {
	j := JobInfo{ID: r.Meta.JobID, Name: r.Meta.Spec.Name, State: Running, Nodes: 1, NodeList: r.Meta.Host, Source: "run"}
	j.Elapsed = time.Since(r.Meta.SubmitTime).Round(time.Second)
	if r.Meta.Host != host {
		j.State, j.Reason = Unknown, "started by hpcrun run on "+r.Meta.Host
		return j
	}
	if pid, _ := strconv.Atoi(r.Meta.JobID); !processLives(pid) || !r.Meta.SubmitTime.IsZero() && startedAfter(pid, r.Meta.SubmitTime.Add(launcherSkew)) {
		j.State, j.Reason = Failed, ReasonLauncherDied
	}
	return j
}

// The reasons of a job whose own process was killed before it could record
// its end: hpcrun run's launcher, or the Local executor's supervisor.
const (
	ReasonLauncherDied   = "the hpcrun run launcher died"
	ReasonSupervisorDied = "the local job's supervisor died"
)

// launcherSkew is how long after its start hpcrun run may record its
// submit time; a process of the launcher's pid started later is another.
const launcherSkew = 10 * time.Second

// startedAfter reports whether process pid started after t, as Linux's
// /proc says (its start in clock ticks after boot): false when unknown.
func startedAfter(pid int, t time.Time) bool {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	i := bytes.LastIndexByte(stat, ')')
	if i < 0 {
		return false
	}
	f := strings.Fields(string(stat[i+1:])) // f[0] is field 3 (state); starttime is field 22
	if len(f) < 20 {
		return false
	}
	ticks, err := strconv.ParseInt(f[19], 10, 64)
	boot := bootTime()
	if err != nil || boot.IsZero() {
		return false
	}
	const clockTicks = 100 // USER_HZ: 100 on every Linux architecture Go runs on
	return boot.Add(time.Duration(ticks) * time.Second / clockTicks).After(t)
}

// bootTime is when this machine booted (/proc/stat's btime).
func bootTime() time.Time {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return time.Time{}
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "btime "); ok {
			if s, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64); err == nil {
				return time.Unix(s, 0)
			}
		}
	}
	return time.Time{}
}

// processLives reports whether a process of this id exists and this user
// may signal it.
func processLives(pid int) bool {
	return pid > 0 && syscall.Kill(pid, 0) == nil
}
