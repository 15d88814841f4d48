package slurm

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// SrunCommand is the hidden hpcrun command the Local executor's srun runs:
// `hpcrun local-srun [-n N] PROGRAM ARGS...`. A program that starts Local
// jobs (hpcrun, or a test binary) must hand it to LocalSrun.
const SrunCommand = "local-srun"

// srunEnv names the program the Local executor's srun stand-in execs.
const srunEnv = "HPCRUN_LOCAL_SRUN"

// LocalSrun is srun for the Local executor: it starts SLURM_NTASKS (or -n)
// copies of a program on this machine, each with the variables real srun
// gives a task, and returns the exit status of the first task to fail after
// stopping the others (0 when all succeed). Options other than -n and
// --ntasks are accepted and ignored.
func LocalSrun(args []string) int {
	n, prog, err := parseSrunArgs(args, os.Getenv("SLURM_NTASKS"))
	if err != nil {
		fmt.Fprintf(os.Stderr, "srun: %v\n", err)
		return 2
	}
	path, err := exec.LookPath(prog[0])
	if err != nil {
		fmt.Fprintf(os.Stderr, "srun: %v\n", err)
		return 2
	}
	step := nextStep(os.Getenv("HPCRUN_LOCAL_DIR"))
	ns, st := strconv.Itoa(n), strconv.Itoa(step)
	gtids := make([]string, n)
	for i := range gtids {
		gtids[i] = strconv.Itoa(i)
	}
	common := []string{
		"SLURM_STEP_ID=" + st, "SLURM_STEPID=" + st, "SLURM_STEP_NUM_TASKS=" + ns, "SLURM_STEP_NUM_NODES=1",
		"SLURM_STEP_NODELIST=" + os.Getenv("SLURM_JOB_NODELIST"), "SLURM_STEP_TASKS_PER_NODE=" + ns,
		"SLURM_STEP_LAUNCHER_PORT=0", "SLURM_NTASKS=" + ns, "SLURM_NPROCS=" + ns, "SLURM_NNODES=1",
		"SLURM_NODEID=0", "SLURM_TASKS_PER_NODE=" + ns, "SLURM_NODELIST=" + os.Getenv("SLURM_JOB_NODELIST"),
		"SLURM_LAUNCH_NODE_IPADDR=127.0.0.1", "SLURM_SRUN_COMM_HOST=127.0.0.1", "SLURM_DISTRIBUTION=block",
		"SLURM_GTIDS=" + strings.Join(gtids, ","), fmt.Sprintf("SLURM_UMASK=%04o", umask()),
	}
	tasks := Tasks{N: n, Program: path, Args: prog[1:], Env: common,
		Vars: func(r int) []string {
			return []string{"SLURM_PROCID=" + strconv.Itoa(r), "SLURM_LOCALID=" + strconv.Itoa(r)}
		}}
	failed, err := tasks.Run(context.Background())
	if err != nil {
		fmt.Fprintf(os.Stderr, "srun: %v\n", err)
		return 1
	}
	if len(failed) == 0 {
		return 0
	}
	f := failed[0]
	fmt.Fprintf(os.Stderr, "srun: error: task %d: exited with status %d\n", f.Rank, f.ExitCode())
	return f.ExitCode()
}

// parseSrunArgs reads -n N, -nN, --ntasks=N and --ntasks N; def is the
// default task count.
func parseSrunArgs(args []string, def string) (int, []string, error) {
	n := def
	if n == "" {
		n = "1"
	}
	i := 0
	for ; i < len(args) && strings.HasPrefix(args[i], "-"); i++ {
		a := args[i]
		switch {
		case a == "--":
			i++
			goto done
		case a == "-n" || a == "--ntasks":
			if i+1 >= len(args) {
				return 0, nil, fmt.Errorf("%s needs a number of tasks", a)
			}
			n = args[i+1]
			i++
		case strings.HasPrefix(a, "--ntasks="):
			n = strings.TrimPrefix(a, "--ntasks=")
		case strings.HasPrefix(a, "-n") && !strings.HasPrefix(a, "--"):
			n = a[2:]
		}
	}
done:
	if i >= len(args) {
		return 0, nil, fmt.Errorf("no command to run")
	}
	v, err := strconv.Atoi(n)
	if err != nil || v < 1 {
		return 0, nil, fmt.Errorf("invalid number of tasks %q", n)
	}
	return v, args[i:], nil
}

// nextStep numbers the job's steps as Slurm does, from 0, keeping the count
// in the Local executor's folder.
func nextStep(localDir string) int {
	if localDir == "" {
		return 0
	}
	path := filepath.Join(localDir, "steps")
	b, _ := os.ReadFile(path)
	step, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	os.WriteFile(path, []byte(strconv.Itoa(step+1)+"\n"), 0o644)
	return step
}

func umask() int {
	m := syscall.Umask(0)
	syscall.Umask(m)
	return m
}
