package slurm

import (
	"bufio"
	"bytes"
	"context"
	_ "embed"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/hpcrun/hpcrun/internal/atomicfile"
	"github.com/hpcrun/hpcrun/internal/rundir"
)

// Local is the Executor for a machine without Slurm: it runs the same job
// script, detached, with an srun stand-in that starts the tasks on this
// machine with the variables real srun sets. The job id is the id of the
// supervising process; the job's state lives in <run dir>/.local/state.
type Local struct{}

var (
	//go:embed local/srun
	srunStandIn []byte
	//go:embed local/job
	jobSupervisor []byte
)

// Name is "local".
func (*Local) Name() string { return "local" }

// Submit starts the job's supervisor in its own session and returns at once.
// A run dir that held an earlier Local job (a resubmission) is first cleared
// of that job's state, so its end cannot pass for the new job's. The srun
// of the job runs this program's SrunCommand.
func (l *Local) Submit(ctx context.Context, sub Submission) (string, string, error) {
	s := sub.Spec
	if err := l.Check(s); err != nil {
		return "", "", err
	}
	lay, _ := s.Layout()
	self, err := os.Executable()
	if err != nil {
		return "", "", fmt.Errorf("local executor: path of this program: %w", err)
	}
	dir := rundir.Dir(s.RunDir).Local()
	if err := os.MkdirAll(filepath.Join(dir, "bin"), 0o755); err != nil {
		return "", "", fmt.Errorf("local executor: %w", err)
	}
	for _, f := range []string{"state", "cancel", "steps"} {
		if err := os.Remove(filepath.Join(dir, f)); err != nil && !errors.Is(err, os.ErrNotExist) {
			return "", "", fmt.Errorf("local executor: clear the previous job: %w", err)
		}
	}
	if err := atomicfile.WriteFile(filepath.Join(dir, "bin", "srun"), srunStandIn, 0o755); err != nil {
		return "", "", err
	}
	if err := atomicfile.WriteFile(filepath.Join(dir, "job"), jobSupervisor, 0o755); err != nil {
		return "", "", err
	}
	host, _ := os.Hostname()
	host, _, _ = strings.Cut(host, ".")
	n := strconv.Itoa(s.NTasks)
	cmd := exec.Command("bash", filepath.Join(dir, "job"), sub.Script)
	cmd.Dir = s.RunDir
	cmd.Env = append(os.Environ(),
		"HPCRUN_LOCAL_DIR="+dir, srunEnv+"="+self,
		"HPCRUN_EXECUTOR=local",
		"SLURM_SUBMIT_DIR="+s.RunDir, "SLURM_SUBMIT_HOST="+host,
		"SLURM_JOB_NAME="+s.Name, "SLURM_CLUSTER_NAME=local", "SLURM_JOB_PARTITION=local",
		"SLURM_NTASKS="+n, "SLURM_NPROCS="+n, "SLURM_JOB_NUM_NODES=1", "SLURM_NNODES=1",
		"SLURM_JOB_NODELIST="+host, "SLURM_NODELIST="+host, "SLURMD_NODENAME="+host, "SLURM_NODEID=0",
		"SLURM_TASKS_PER_NODE="+n, "SLURM_NTASKS_PER_NODE="+n,
		"SLURM_CPUS_PER_TASK="+strconv.Itoa(s.CPUsPerTask),
		"SLURM_JOB_CPUS_PER_NODE="+strconv.Itoa(s.CPUsPerTask*s.NTasks),
		"SLURM_GPUS_ON_NODE="+strconv.Itoa(lay.GPUsPerNode),
	)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return "", "", fmt.Errorf("local executor: start %s: %w", sub.Script, err)
	}
	// Reap the supervisor if this process outlives it; otherwise it is
	// inherited by init when hpcrun exits.
	go cmd.Wait()
	return strconv.Itoa(cmd.Process.Pid), "", nil
}

// Check says why the Local executor cannot run s: a bad layout, or an
// explicit request for several nodes (--nodes, --ntasks-per-node): it runs
// every task on this machine. Nodes that only come from sizing by a
// profile's gpus_per_node are run here as one.
func (*Local) Check(s JobSpec) error {
	lay, err := s.Layout()
	if err != nil {
		return err
	}
	if lay.Nodes > 1 && (s.Nodes > 0 || s.TasksPerNode > 0) {
		return fmt.Errorf("local executor: the job asks for %d nodes, but it runs every task on this machine: submit to Slurm (--executor slurm), or drop --nodes", lay.Nodes)
	}
	return nil
}

// Queue returns nothing: local jobs are found through their run dirs.
func (*Local) Queue(context.Context, bool) ([]JobInfo, error) { return nil, nil }

// Status reads <run dir>/.local/state and checks that the supervisor lives.
func (*Local) Status(_ context.Context, ref JobRef) (JobInfo, error) {
	j := JobInfo{ID: ref.ID, Nodes: 1, Source: "local"}
	statePath := filepath.Join(rundir.Dir(ref.RunDir).Local(), "state")
	st, err := readLocalState(statePath)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return j, err
	}
	alive := pidAlive(ref.ID, ref.RunDir, st != nil)
	if !alive {
		// The supervisor records its end before it exits, so the state
		// read after its death is final; the one read before may predate
		// its end.
		if st, err = readLocalState(statePath); err != nil && !errors.Is(err, os.ErrNotExist) {
			return j, err
		}
	}
	if host := shortHost(); st["host"] != "" && st["host"] != host {
		return j, fmt.Errorf("run %s was started by the local executor on %s; its state can only be read there (this is %s)",
			filepath.Base(ref.RunDir), st["host"], host)
	}
	if !alive && (st == nil || State(st["state"]) == Running) && fileExists(filepath.Join(rundir.Dir(ref.RunDir).Local(), "cancel")) {
		// Cancelled before the supervisor could record it.
		j.State, j.NodeList = Cancelled, st["host"]
		return j, nil
	}
	if st == nil {
		if alive {
			j.State = Pending
			return j, nil
		}
		j.State, j.Reason = Failed, "the local job never started"
		return j, nil
	}
	j.State = State(st["state"])
	j.NodeList = st["host"]
	start, _ := strconv.ParseInt(st["start"], 10, 64)
	end, _ := strconv.ParseInt(st["end"], 10, 64)
	j.ExitCode, _ = strconv.Atoi(st["exit"])
	if j.State == Running {
		if !alive {
			j.State, j.Reason = Failed, ReasonSupervisorDied
			fi, err := os.Stat(statePath)
			if err == nil {
				end = fi.ModTime().Unix()
			}
		} else {
			end = time.Now().Unix()
		}
	}
	if j.State == Failed && j.Reason == "" {
		j.Reason = "NonZeroExitCode"
	}
	if start > 0 && end >= start {
		j.Elapsed = time.Duration(end-start) * time.Second
	}
	return j, nil
}

// Cancel sends TERM to the job's process group, then KILL after 10 s,
// and returns once every process of the group has exited (a rank that
// outlives the launcher, saving its checkpoint, still writes into the
// run dir).
func (l *Local) Cancel(ctx context.Context, ref JobRef) error {
	j, err := l.Status(ctx, ref)
	if err != nil {
		return err
	}
	if j.State.Done() {
		return fmt.Errorf("job %s is already over (%s)", ref.ID, j.State)
	}
	if err := atomicfile.WriteFile(filepath.Join(rundir.Dir(ref.RunDir).Local(), "cancel"), []byte(time.Now().UTC().Format(time.RFC3339)+"\n"), 0o644); err != nil {
		return fmt.Errorf("cancel local job %s: %w", ref.ID, err)
	}
	pid, _ := strconv.Atoi(ref.ID)
	if err := syscall.Kill(-pid, syscall.SIGTERM); err != nil {
		return fmt.Errorf("cancel local job %s: %w", ref.ID, err)
	}
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if !pidAlive(ref.ID, ref.RunDir, true) && !groupAlive(pid) {
			return nil
		}
	}
	syscall.Kill(-pid, syscall.SIGKILL)
	for deadline := time.Now().Add(5 * time.Second); groupAlive(pid) && time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
	}
	return nil
}

// groupAlive says whether process group pgid still has a process that
// is not a zombie (which a container's init may never reap).
func groupAlive(pgid int) bool {
	if syscall.Kill(-pgid, 0) != nil {
		return false
	}
	procs, _ := os.ReadDir("/proc")
	for _, p := range procs {
		if _, err := strconv.Atoi(p.Name()); err != nil {
			continue
		}
		stat, err := os.ReadFile(filepath.Join("/proc", p.Name(), "stat"))
		if err != nil {
			continue
		}
		// pid (comm) state ppid pgrp ...: comm may hold spaces and ')'.
		i := bytes.LastIndexByte(stat, ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(string(stat[i+1:]))
		if len(f) > 2 && f[0] != "Z" && f[2] == strconv.Itoa(pgid) {
			return true
		}
	}
	return false
}

func fileExists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

func shortHost() string {
	h, _ := os.Hostname()
	h, _, _ = strings.Cut(h, ".")
	return h
}

// pidAlive reports whether the process lives (and is not a zombie); when
// started is set, it must also be the Local job supervisor of runDir (by
// its execid: the path may differ through links), not a recycled pid. Before the supervisor
// writes its state it may not have exec'd bash yet.
func pidAlive(id, runDir string, started bool) bool {
	pid, err := strconv.Atoi(id)
	if err != nil || pid <= 0 {
		return false
	}
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	if i := bytes.LastIndexByte(stat, ')'); i > 0 && i+2 < len(stat) && stat[i+2] == 'Z' {
		return false
	}
	if !started {
		return true
	}
	cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	return err == nil && bytes.Contains(cmdline, []byte(filepath.Join(filepath.Base(runDir), rundir.LocalDir, "job")+"\x00"))
}

func readLocalState(path string) (map[string]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	st := map[string]string{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if k, v, ok := strings.Cut(sc.Text(), "="); ok {
			st[k] = v
		}
	}
	return st, sc.Err()
}
