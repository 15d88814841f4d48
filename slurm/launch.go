package slurm

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"runtime"
	"slices"
	"strconv"
	"syscall"
	"time"
)

// Tasks starts N copies of a program on this machine, each told its rank by
// Vars, and waits for all of them. It is hpcrun's one local launcher: the
// Local executor's srun and `hpcrun bench comm` start their ranks through
// it, `hpcrun run`, `check`, `generate` and `eval` through Torchrun.
type Tasks struct {
	N       int
	Program string
	Args    []string
	// Env is added to this process's environment for every task.
	Env []string
	// Vars gives the variables that tell task rank who it is (TorchrunVars,
	// or the Local executor's srun variables).
	Vars func(rank int) []string
	// Grace is how long the others may take to fail on their own once one
	// task failed (their collectives then name the culprit) before they are
	// stopped.
	Grace time.Duration
	// Stdout and Stderr of every task, except where Output says otherwise;
	// nil means this process's.
	Stdout, Stderr io.Writer
	// Output, when set, gives task rank's stdout and stderr.
	Output func(rank int) (stdout, stderr io.Writer)
	// Master, when set, is the Store's listener (ListenMaster): task 0
	// inherits it (MasterListener) and Run closes this process's copy.
	Master *net.TCPListener
}

// TaskExit is how one task that failed ended.
type TaskExit struct {
	Rank int
	Err  error
	// Stopped says the launcher had already signalled the tasks when this
	// one ended: its failure is likely a consequence, not the cause.
	Stopped bool
}

// ExitCode is the task's exit status as a shell reports it: 128+n for a
// task killed by signal n.
func (e TaskExit) ExitCode() int {
	var ee *exec.ExitError
	if !errors.As(e.Err, &ee) {
		return 1
	}
	if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return 128 + int(ws.Signal())
	}
	return ee.ExitCode()
}

// stopAfter is how long a task has between TERM and KILL, as Slurm's KillWait.
const stopAfter = 10 * time.Second

// Run starts the tasks and waits for every one. Each task runs in its own
// process group, so stopping it stops what it started. INT and TERM sent to
// this process, and ctx's end, are passed on to every task. When a task
// fails the others get Grace, then TERM, then KILL. Run returns the tasks
// that failed, the likely culprits first: those that ended before the
// launcher signalled anyone, among them those killed by a signal first, each
// group in the order they ended.
func (t Tasks) Run(ctx context.Context) ([]TaskExit, error) {
	if t.N < 1 {
		return nil, fmt.Errorf("launch: %d tasks: need at least 1", t.N)
	}
	threads := max(1, runtime.NumCPU()/t.N)
	// Pdeathsig follows the thread that started the task: keep the starts
	// on one thread, which the runtime keeps alive once unlocked.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	// A child's handlers are the defaults from fork until its runtime
	// starts: an early time-limit signal (USR1) would kill it. Ignored
	// here, it stays ignored through exec until the task's runtime takes
	// it over (and HoldSignals holds it).
	signal.Ignore(syscall.SIGUSR1, syscall.SIGUSR2)
	started := false
	defer func() {
		if !started {
			signal.Reset(syscall.SIGUSR1, syscall.SIGUSR2)
		}
	}()
	cmds := make([]*exec.Cmd, t.N)
	done := make(chan TaskExit, t.N)
	for r := range t.N {
		cmd := exec.Command(t.Program, t.Args...)
		cmd.Stdout, cmd.Stderr = orStd(t.Stdout, os.Stdout), orStd(t.Stderr, os.Stderr)
		if t.Output != nil {
			cmd.Stdout, cmd.Stderr = t.Output(r)
		}
		cmd.Env = append(os.Environ(), t.Env...)
		if t.Vars != nil {
			cmd.Env = append(cmd.Env, t.Vars(r)...)
		}
		// n tasks share the machine's cores instead of each taking all.
		if os.Getenv("GOMAXPROCS") == "" {
			cmd.Env = append(cmd.Env, "GOMAXPROCS="+strconv.Itoa(threads))
		}
		// A task whose launcher dies (kill -9) is stopped, not orphaned:
		// TERM lets it save and record its end.
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGTERM}
		var master *os.File
		if r == 0 && t.Master != nil {
			f, err := t.Master.File()
			if err != nil {
				return nil, fmt.Errorf("hand the master's listener to task 0: %w", err)
			}
			master = f
			cmd.ExtraFiles = []*os.File{f}
			cmd.Env = append(cmd.Env, MasterFDEnv+"=3")
		}
		err := cmd.Start()
		if master != nil {
			master.Close()
			t.Master.Close()
		}
		if err != nil {
			signalAll(cmds[:r], make([]bool, r), syscall.SIGKILL)
			for _, c := range cmds[:r] {
				c.Wait()
			}
			return nil, fmt.Errorf("start task %d: %w", r, err)
		}
		cmds[r] = cmd
		go func() { done <- TaskExit{Rank: r, Err: cmd.Wait()} }()
	}
	signal.Reset(syscall.SIGUSR1, syscall.SIGUSR2)
	started = true
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	defer signal.Stop(sigs)
	var failed []TaskExit
	ended := make([]bool, t.N) // only this goroutine reads and writes it
	signal := func(s syscall.Signal) { signalAll(cmds, ended, s) }
	var grace, kill <-chan time.Time
	ctxDone := ctx.Done()
	for left := t.N; left > 0; {
		select {
		case e := <-done:
			left--
			ended[e.Rank] = true
			e.Stopped = kill != nil
			if e.Err != nil {
				failed = append(failed, e)
				if grace == nil {
					grace = time.After(t.Grace)
				}
			}
		case s := <-sigs:
			signal(s.(syscall.Signal))
			kill = time.After(stopAfter)
		case <-ctxDone:
			ctxDone = nil
			signal(syscall.SIGTERM)
			kill = time.After(stopAfter)
		case <-grace:
			grace = nil
			signal(syscall.SIGTERM)
			kill = time.After(stopAfter)
		case <-kill:
			signal(syscall.SIGKILL)
		}
	}
	slices.SortStableFunc(failed, func(a, b TaskExit) int {
		return cmp.Or(cmp.Compare(b2i(a.Stopped), b2i(b.Stopped)), cmp.Compare(exitOrder(a.Err), exitOrder(b.Err)))
	})
	return failed, nil
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

func orStd(w io.Writer, std *os.File) io.Writer {
	if w != nil {
		return w
	}
	return std
}

// signalAll signals the process group of every task that has not ended.
func signalAll(cmds []*exec.Cmd, ended []bool, s syscall.Signal) {
	for i, c := range cmds {
		if c != nil && c.Process != nil && !ended[i] {
			syscall.Kill(-c.Process.Pid, s)
		}
	}
}

// exitOrder puts processes that died of a signal before those that exited.
func exitOrder(err error) int {
	var ee *exec.ExitError
	if errors.As(err, &ee) && ee.ExitCode() == -1 {
		return 0
	}
	return 1
}

// Torchrun runs t's N tasks on this machine as torchrun would: it binds
// the Store's port (ListenMaster) and hands its listener to task 0, tells
// every task its place with TorchrunVars (run id runID, executor "run"),
// which replace t.Vars, and waits for them all (Tasks.Run). hpcrun run,
// check, generate and eval start their ranks through it.
func Torchrun(ctx context.Context, t Tasks, runID string) ([]TaskExit, error) {
	master, port, err := ListenMaster()
	if err != nil {
		return nil, err
	}
	defer master.Close() // Run closes it once task 0 holds it; not when it starts none
	t.Master, t.Vars = master, TorchrunVars(t.N, port, runID, "run")
	return t.Run(ctx)
}

// TorchrunVars gives n tasks on this machine the variables torchrun would
// (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, ...), with the master on
// 127.0.0.1:port, so that idrenv.Detect sees a world of n ranks. executor
// is recorded as HPCRUN_EXECUTOR, which tells a task it is not in a Slurm
// job even when the launcher runs inside one.
func TorchrunVars(n, port int, runID, executor string) func(rank int) []string {
	return func(r int) []string {
		return []string{
			"TORCHELASTIC_RUN_ID=" + runID, "HPCRUN_EXECUTOR=" + executor,
			"RANK=" + strconv.Itoa(r), "WORLD_SIZE=" + strconv.Itoa(n),
			"LOCAL_RANK=" + strconv.Itoa(r), "LOCAL_WORLD_SIZE=" + strconv.Itoa(n),
			"GROUP_RANK=0", "MASTER_ADDR=127.0.0.1", "MASTER_PORT=" + strconv.Itoa(port),
		}
	}
}

// MasterFDEnv names the file descriptor of the Store's listener that Tasks
// hands to task 0.
const MasterFDEnv = "HPCRUN_MASTER_FD"

// ListenMaster binds a free TCP port on the loopback address for the Store
// of tasks started by Tasks, and returns the listener and its port. Pass
// it as Tasks.Master: task 0 serves on it (MasterListener) instead of
// binding the port again, so the port is never free for another process to
// take in between.
func ListenMaster() (*net.TCPListener, int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, 0, fmt.Errorf("listen for the master: %w", err)
	}
	return ln.(*net.TCPListener), ln.Addr().(*net.TCPAddr).Port, nil
}

// MasterListener is the Store listener this task inherited from Tasks
// (task 0 only), or nil when it inherited none.
func MasterListener() (net.Listener, error) {
	v := os.Getenv(MasterFDEnv)
	if v == "" {
		return nil, nil
	}
	os.Unsetenv(MasterFDEnv) // not for this task's children
	fd, err := strconv.Atoi(v)
	if err != nil || fd < 3 {
		return nil, fmt.Errorf("%s=%q: not an inherited file descriptor", MasterFDEnv, v)
	}
	f := os.NewFile(uintptr(fd), "master listener")
	defer f.Close()
	ln, err := net.FileListener(f)
	if err != nil {
		return nil, fmt.Errorf("%s=%d: %w", MasterFDEnv, fd, err)
	}
	return ln, nil
}
