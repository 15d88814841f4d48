package main

import (
	"cmp"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
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

// localRanks starts n processes of this hpcrun binary on this machine, with
// the variables torchrun would give them (RANK, WORLD_SIZE, MASTER_ADDR,
// ...), so that idrenv.Detect sees a world of n ranks. `hpcrun run` and
// `hpcrun check` launch their ranks through it.
type localRanks struct {
	n     int           // ranks
	args  []string      // hpcrun arguments of every rank
	runID string        // TORCHELASTIC_RUN_ID
	env   []string      // extra KEY=VALUE for every rank
	grace time.Duration // after the first failure, before the rest are killed
}

// rankExit is how one rank's process ended.
type rankExit struct {
	rank int
	err  error
}

// run starts the ranks and waits for all of them. When one fails, the
// others are given the grace period to fail on their own (their collectives
// name the culprit), then killed. Interrupts are passed on to every rank.
// It returns the ranks that failed, those killed by a signal first (the
// likely culprits), then in the order they ended.
func (l localRanks) run() (failed []rankExit, err error) {
	self, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("path of hpcrun: %w", err)
	}
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	threads := max(1, runtime.NumCPU()/l.n)
	cmds := make([]*exec.Cmd, l.n)
	done := make(chan rankExit, l.n)
	for r := range l.n {
		cmd := exec.Command(self, l.args...)
		cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
		cmd.Env = append(os.Environ(),
			"TORCHELASTIC_RUN_ID="+l.runID,
			"RANK="+strconv.Itoa(r), "WORLD_SIZE="+strconv.Itoa(l.n),
			"LOCAL_RANK="+strconv.Itoa(r), "LOCAL_WORLD_SIZE="+strconv.Itoa(l.n),
			"GROUP_RANK=0", "MASTER_ADDR=127.0.0.1", "MASTER_PORT="+strconv.Itoa(port),
		)
		cmd.Env = append(cmd.Env, l.env...)
		// n ranks share the machine's cores instead of each taking all.
		if os.Getenv("GOMAXPROCS") == "" {
			cmd.Env = append(cmd.Env, "GOMAXPROCS="+strconv.Itoa(threads))
		}
		if err := cmd.Start(); err != nil {
			for _, c := range cmds[:r] {
				c.Process.Kill()
			}
			return nil, fmt.Errorf("start rank %d: %w", r, err)
		}
		cmds[r] = cmd
		go func() { done <- rankExit{r, cmd.Wait()} }()
	}
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	defer signal.Stop(sigs)
	var deadline <-chan time.Time
	for left := l.n; left > 0; {
		select {
		case e := <-done:
			left--
			if e.err != nil {
				failed = append(failed, e)
				if deadline == nil {
					deadline = time.After(l.grace)
				}
			}
		case s := <-sigs:
			for _, c := range cmds {
				c.Process.Signal(s)
			}
		case <-deadline:
			for _, c := range cmds {
				c.Process.Kill()
			}
		}
	}
	slices.SortStableFunc(failed, func(a, b rankExit) int {
		return cmp.Compare(exitOrder(a.err), exitOrder(b.err))
	})
	return failed, nil
}

// exitOrder puts processes that died of a signal before those that exited.
func exitOrder(err error) int {
	var ee *exec.ExitError
	if errors.As(err, &ee) && ee.ExitCode() == -1 {
		return 0
	}
	return 1
}

// newToken is a random rendezvous token: 16 bytes in hex.
func newToken() (string, error) {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", err
	}
	return hex.EncodeToString(b[:]), nil
}

// freePort asks the kernel for a free TCP port on the loopback address.
func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("free port for the master: %w", err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}
