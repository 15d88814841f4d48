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
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/hpcrun/hpcrun/slurm"
	"github.com/hpcrun/hpcrun/train"
	"github.com/hpcrun/hpcrun/train/metrics"
	"github.com/urfave/cli/v2"
)

func runCommand() *cli.Command {
	return &cli.Command{
		Name:      "run",
		Usage:     "run all ranks of a training locally, without Slurm",
		ArgsUsage: " ",
		Description: "Starts --nproc copies of `hpcrun train` on this machine (torchrun-style variables,\n" +
			"master on 127.0.0.1), in a new run directory under --runs-dir, and prints the\n" +
			"metrics summary when they finish. Example: hpcrun run --nproc 4 --tp 2",
		Flags: append([]cli.Flag{
			&cli.IntFlag{Name: "nproc", Usage: "processes (ranks) to start; the same as --ntasks"},
		}, trainFlags()...),
		Action: runLocal,
	}
}

func runLocal(c *cli.Context) error {
	if c.NArg() > 0 {
		return cli.Exit(fmt.Sprintf("run takes no arguments, got %q: training options are flags (hpcrun run --help)", c.Args().First()), 2)
	}
	rc, err := resolveConfig(c)
	if err != nil {
		return err
	}
	cfg := rc.Train
	if err := applyTrainFlags(c, &cfg); err != nil {
		return cli.Exit(err.Error(), 2)
	}
	if c.IsSet("nproc") {
		cfg.NTasks = c.Int("nproc")
	}
	// Every check, the data included, happens before any rank starts.
	if err := train.Check(cfg); err != nil {
		return cli.Exit(err.Error(), 2)
	}
	runsDir, err := filepath.Abs(rc.RunsDir)
	if err != nil {
		return err
	}
	execID, dir, err := slurm.NewRun(runsDir, time.Now())
	if err != nil {
		return err
	}
	if err := train.WriteConfigFile(filepath.Join(dir, train.ConfigFile), cfg, "Training config of run "+execID+", written by hpcrun run."); err != nil {
		return err
	}
	token, err := newToken()
	if err != nil {
		return err
	}
	if err := slurm.WriteFileAtomic(filepath.Join(dir, "token"), []byte(token+"\n"), 0o600); err != nil {
		return err
	}
	port, err := freePort()
	if err != nil {
		return err
	}
	self, err := os.Executable()
	if err != nil {
		return fmt.Errorf("path of hpcrun: %w", err)
	}
	fmt.Fprintf(os.Stderr, "run %s: %d ranks (tp %d x dp %d) on this machine\nrun dir: %s\n", execID, cfg.NTasks, cfg.TP, cfg.DP(), dir)

	start := time.Now()
	failed, err := spawnRanks(self, dir, execID, cfg.NTasks, port)
	if err != nil {
		return err
	}
	if run, rerr := metrics.ReadRun(dir); rerr == nil {
		s, _ := metrics.Summarize(run)
		metrics.WriteSummary(os.Stdout, s)
	}
	if len(failed) > 0 {
		var parts []string
		for _, f := range failed {
			parts = append(parts, fmt.Sprintf("rank %d (%v)", f.rank, f.err))
		}
		return cli.Exit(fmt.Sprintf("run %s failed: %s; errors above, metrics in %s", execID, strings.Join(parts, ", "), filepath.Join(dir, "metrics")), 1)
	}
	fmt.Fprintf(os.Stderr, "run %s completed in %s\n", execID, time.Since(start).Round(time.Millisecond))
	return nil
}

// rankExit is how one rank's process ended.
type rankExit struct {
	rank int
	err  error
}

// spawnRanks starts n `hpcrun train` processes and waits for them. When one
// fails, the others are given time to fail on their own (their collectives
// name the culprit), then killed. It returns the ranks that failed, those
// killed by a signal first (the likely culprits), then in the order they
// ended.
func spawnRanks(self, dir, execID string, n, port int) (failed []rankExit, err error) {
	threads := max(1, runtime.NumCPU()/n)
	cmds := make([]*exec.Cmd, n)
	done := make(chan rankExit, n)
	for r := 0; r < n; r++ {
		cmd := exec.Command(self, "train", "--run-dir", dir)
		cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
		cmd.Env = append(os.Environ(),
			"TORCHELASTIC_RUN_ID="+execID,
			"RANK="+strconv.Itoa(r), "WORLD_SIZE="+strconv.Itoa(n),
			"LOCAL_RANK="+strconv.Itoa(r), "LOCAL_WORLD_SIZE="+strconv.Itoa(n),
			"GROUP_RANK=0", "MASTER_ADDR=127.0.0.1", "MASTER_PORT="+strconv.Itoa(port),
		)
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
	for left := n; left > 0; {
		select {
		case e := <-done:
			left--
			if e.err != nil {
				failed = append(failed, e)
				if deadline == nil {
					deadline = time.After(15 * time.Second)
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
