package slurm

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strconv"
	"strings"
	"time"
)

// Slurm is the Executor of a real cluster: sbatch, squeue, scontrol, sacct
// and scancel found on PATH.
type Slurm struct{}

// Name is "slurm".
func (*Slurm) Name() string { return "slurm" }

// SqueueFormat is the fixed squeue --format hpcrun reads: the fields that
// hold free text (work dir, comment, name) come last, split by the unit
// separator, which a path or name does not hold; the job name comes last so
// that anything inside it stays in the name.
const SqueueFormat = "%i|%T|%M|%D|%P|%l|%V|%R\x1f%Z\x1f%k\x1f%j"

// run runs a Slurm command and returns its stdout; its error carries the
// command's own stderr, as the user would have seen it.
func run(ctx context.Context, dir, name string, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = dir
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	if err != nil {
		if errors.Is(err, exec.ErrNotFound) {
			return nil, fmt.Errorf("%s: not on PATH: %w", name, ErrNoSlurm)
		}
		msg := strings.TrimSpace(stderr.String())
		if msg == "" { // scontrol says "Job 9_1 not found" on stdout
			msg = strings.TrimSpace(stdout.String())
		}
		if msg == "" {
			msg = err.Error()
		}
		return stdout.Bytes(), &CommandError{Cmd: name, Msg: msg, Err: err}
	}
	return stdout.Bytes(), nil
}

// CommandError is a Slurm command that failed; Msg is its stderr as is.
type CommandError struct {
	Cmd string
	Msg string
	Err error
}

// Error is the command's own message.
func (e *CommandError) Error() string { return e.Msg }

// Unwrap gives the exec error underneath.
func (e *CommandError) Unwrap() error { return e.Err }

// unreachable reports whether a command's error means the controller is down.
func unreachable(err error) error {
	var ce *CommandError
	if errors.As(err, &ce) && (strings.Contains(ce.Msg, "Unable to contact slurm controller") ||
		strings.Contains(ce.Msg, "Could not establish a configuration source") ||
		strings.Contains(ce.Msg, "Connection refused")) {
		return fmt.Errorf("%s: %s: %w", ce.Cmd, firstLine(ce.Msg), ErrNoSlurm)
	}
	return err
}

func firstLine(s string) string {
	s, _, _ = strings.Cut(s, "\n")
	return s
}

// Submit runs sbatch --parsable on the script from the run directory,
// with JobTag as the job's comment (a user template cannot drop it).
func (*Slurm) Submit(ctx context.Context, sub Submission) (string, string, error) {
	out, err := run(ctx, sub.Spec.RunDir, "sbatch", "--parsable", "--comment="+JobTag(sub.Spec.RunDir), sub.Script)
	if err != nil {
		return "", "", unreachable(err)
	}
	return ParseSbatch(out)
}

// ParseSbatch reads sbatch --parsable's "jobid[;cluster]".
func ParseSbatch(out []byte) (jobID, cluster string, err error) {
	line := strings.TrimSpace(string(out))
	if i := strings.LastIndexByte(line, '\n'); i >= 0 {
		line = line[i+1:] // sbatch may print warnings before the id
	}
	jobID, cluster, _ = strings.Cut(line, ";")
	if _, err := strconv.ParseUint(jobID, 10, 64); err != nil {
		return "", "", fmt.Errorf("sbatch --parsable printed %q, not a job id", line)
	}
	return jobID, cluster, nil
}

// Queue runs squeue --me with SqueueFormat.
func (*Slurm) Queue(ctx context.Context, all bool) ([]JobInfo, error) {
	args := []string{"--me", "--noheader", "--format=" + SqueueFormat}
	if all {
		args = append(args, "--states=all")
	}
	out, err := run(ctx, "", "squeue", args...)
	if err != nil {
		return nil, unreachable(err)
	}
	return ParseSqueue(out)
}

// ParseSqueue reads squeue output in SqueueFormat.
func ParseSqueue(out []byte) ([]JobInfo, error) {
	var jobs []JobInfo
	for _, line := range strings.Split(string(out), "\n") {
		if strings.TrimSpace(line) == "" {
			continue
		}
		text := strings.SplitN(line, "\x1f", 4)
		f := strings.Split(text[0], "|")
		if len(text) != 4 || len(f) != 8 {
			return nil, fmt.Errorf("squeue: unexpected line %q", line)
		}
		j := JobInfo{ID: f[0], State: State(f[1]), Elapsed: parseElapsed(f[2]), Partition: f[4],
			TimeLimit: f[5], SubmitTime: parseSlurmTime(f[6]), WorkDir: text[1], Comment: text[2], Name: text[3], Source: "squeue"}
		j.Nodes, _ = strconv.Atoi(f[3])
		if r := f[7]; strings.HasPrefix(r, "(") && strings.HasSuffix(r, ")") {
			j.Reason = strings.TrimSuffix(strings.TrimPrefix(r, "("), ")")
			if j.Reason == "None" {
				j.Reason = ""
			}
		} else {
			j.NodeList = r
		}
		jobs = append(jobs, j)
	}
	return jobs, nil
}

// Status asks scontrol, then sacct (when accounting is on); a job neither
// remembers is Unknown.
func (*Slurm) Status(ctx context.Context, ref JobRef) (JobInfo, error) {
	out, err := run(ctx, "", "scontrol", "show", "job", "--oneliner", ref.ID)
	if err == nil {
		return ParseScontrol(out)
	}
	var ce *CommandError
	if !errors.As(err, &ce) || !strings.Contains(ce.Msg, "Invalid job id") && !strings.Contains(ce.Msg, "not found") {
		return JobInfo{}, unreachable(err)
	}
	if j, ok := arrayTaskStatus(ctx, ref.ID); ok {
		return j, nil
	}
	out, err = run(ctx, "", "sacct", "--parsable2", "--noheader", "--allocations", "--jobs", ref.ID,
		"--format=JobID,JobName,State,Elapsed,NNodes,NodeList,Partition,Timelimit,ExitCode,Reason")
	if err != nil {
		if errors.As(err, &ce) && strings.Contains(ce.Msg, "accounting storage is disabled") {
			return JobInfo{ID: ref.ID, State: Unknown, Reason: "no longer in slurmctld and accounting is off", Source: "scontrol"}, nil
		}
		return JobInfo{}, unreachable(err)
	}
	jobs, err := ParseSacct(out)
	if err != nil {
		return JobInfo{}, err
	}
	for _, j := range jobs {
		if j.ID == ref.ID {
			return j, nil
		}
	}
	return JobInfo{ID: ref.ID, State: Unknown, Reason: "neither slurmctld nor sacct knows it", Source: "sacct"}, nil
}

// arrayTaskStatus answers for an array task (A_a) that scontrol does not
// know by its own id: a task still pending, or cancelled before it left
// the array's record, is described by the record of the array A whose
// ArrayTaskId covers a (the array's own, once it is over).
func arrayTaskStatus(ctx context.Context, id string) (JobInfo, bool) {
	arr, task, ok := strings.Cut(id, "_")
	if !ok {
		return JobInfo{}, false
	}
	out, err := run(ctx, "", "scontrol", "show", "job", "--oneliner", arr)
	if err != nil {
		return JobInfo{}, false
	}
	for _, line := range strings.Split(string(out), "\n") {
		kv := scontrolFields(line)
		if kv["ArrayJobId"] != arr || !(taskInRange(kv["ArrayTaskId"], task) || kv["JobId"] == arr && State(kv["JobState"]).Done()) {
			continue
		}
		j, err := ParseScontrol([]byte(line))
		if err != nil {
			return JobInfo{}, false
		}
		j.ID = id
		return j, true
	}
	return JobInfo{}, false
}

// taskInRange reports whether array task index task is in Slurm's
// ArrayTaskId list (3, 0-7, 1,4-5, with an optional %N limit).
func taskInRange(list, task string) bool {
	n, err := strconv.Atoi(task)
	if err != nil {
		return false
	}
	list, _, _ = strings.Cut(list, "%")
	for _, part := range strings.Split(list, ",") {
		lo, hi, isRange := strings.Cut(part, "-")
		if !isRange {
			hi = lo
		}
		a, errA := strconv.Atoi(lo)
		b, errB := strconv.Atoi(hi)
		if errA == nil && errB == nil && a <= n && n <= b {
			return true
		}
	}
	return false
}

// ParseScontrol reads one job of scontrol show job --oneliner: Key=Value
// pairs split by spaces, where a word without '=' belongs to the value
// before it (a job name may hold spaces).
func ParseScontrol(out []byte) (JobInfo, error) {
	kv := scontrolFields(string(out))
	if kv["JobId"] == "" {
		return JobInfo{}, fmt.Errorf("scontrol: no JobId in %q", firstLine(string(out)))
	}
	j := JobInfo{ID: kv["JobId"], Name: kv["JobName"], State: State(kv["JobState"]),
		Elapsed: parseElapsed(kv["RunTime"]), NodeList: kv["NodeList"], Partition: kv["Partition"],
		TimeLimit: kv["TimeLimit"], ExitCode: exitCode(kv["ExitCode"]), Source: "scontrol",
		WorkDir: kv["WorkDir"], Comment: kv["Comment"], SubmitTime: parseSlurmTime(kv["SubmitTime"])}
	j.Nodes, _ = strconv.Atoi(kv["NumNodes"])
	j.Restarts, _ = strconv.Atoi(kv["Restarts"])
	if r := kv["Reason"]; r != "None" {
		j.Reason = r
	}
	if j.NodeList == "(null)" {
		j.NodeList = ""
	}
	return j, nil
}

func scontrolFields(s string) map[string]string {
	kv := map[string]string{}
	s, _, _ = strings.Cut(strings.TrimSpace(s), "\n")
	last := ""
	for _, w := range strings.Fields(s) {
		k, v, ok := strings.Cut(w, "=")
		if !ok || k == "" || last == "JobName" && !knownScontrolKey(k) {
			if last != "" {
				kv[last] += " " + w
			}
			continue
		}
		kv[k], last = v, k
	}
	return kv
}

func knownScontrolKey(k string) bool { return k == "UserId" }

// parseSlurmTime reads Slurm's timestamps (2026-11-21T04:38:25, in the
// controller's local time); the zero time for "Unknown", "N/A" or "".
func parseSlurmTime(s string) time.Time {
	t, err := time.ParseInLocation("2006-01-02T15:04:05", s, time.Local)
	if err != nil {
		return time.Time{}
	}
	return t
}

// ParseSacct reads sacct --parsable2 --noheader with the fields
// JobID,JobName,State,Elapsed,NNodes,NodeList,Partition,Timelimit,ExitCode,Reason.
func ParseSacct(out []byte) ([]JobInfo, error) {
	var jobs []JobInfo
	for _, line := range strings.Split(string(out), "\n") {
		if strings.TrimSpace(line) == "" {
			continue
		}
		f := strings.Split(line, "|")
		if len(f) < 10 {
			return nil, fmt.Errorf("sacct: unexpected line %q", line)
		}
		// A name holding '|' shifts the fields after it: rejoin it.
		n := len(f) - 10
		name := strings.Join(f[1:2+n], "|")
		f = append([]string{f[0], name}, f[2+n:]...)
		state, _, _ := strings.Cut(f[2], " ") // "CANCELLED by 1234"
		j := JobInfo{ID: f[0], Name: f[1], State: State(state), Elapsed: parseElapsed(f[3]),
			NodeList: f[5], Partition: f[6], TimeLimit: f[7], ExitCode: exitCode(f[8]), Source: "sacct"}
		j.Nodes, _ = strconv.Atoi(f[4])
		if f[9] != "None" {
			j.Reason = f[9]
		}
		if j.NodeList == "None assigned" {
			j.NodeList = ""
		}
		jobs = append(jobs, j)
	}
	return jobs, nil
}

// Cancel runs scancel.
func (*Slurm) Cancel(ctx context.Context, ref JobRef) error {
	_, err := run(ctx, "", "scancel", ref.ID)
	return unreachable(err)
}
