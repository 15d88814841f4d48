package nccl

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestMain doubles as the helper process of the fault tests: with
// NCCL_TEST_HELPER set, the test binary is one rank of a world that
// all-reduces until it fails.
func TestMain(m *testing.M) {
	if os.Getenv("NCCL_TEST_HELPER") != "" {
		os.Exit(helperRank())
	}
	os.Exit(m.Run())
}

func helperRank() int {
	env := func(k string) int { v, _ := strconv.Atoi(os.Getenv(k)); return v }
	c, err := Init(context.Background(), Options{Rank: env("H_RANK"), Size: env("H_SIZE"), MasterAddr: "127.0.0.1",
		MasterPort: env("H_PORT"), Token: "fault-token", Timeout: 4 * time.Second, Backend: os.Getenv("H_BACKEND")})
	if err != nil {
		fmt.Println("ERR", err)
		return 3
	}
	buf := make([]float32, env("H_ELEMS"))
	for i := 0; ; i++ {
		if err := c.AllReduce(buf, Sum); err != nil {
			fmt.Println("ERR", err)
			start := time.Now()
			c.Close()
			fmt.Println("CLOSED", time.Since(start).Milliseconds())
			return 3
		}
		if i == 3 {
			fmt.Println("READY")
		}
	}
}

type helper struct {
	cmd   *exec.Cmd
	lines chan string
}

func startHelpers(t *testing.T, n int, backend string, elems int) []*helper {
	t.Helper()
	port := freePort(t)
	hs := make([]*helper, n)
	for r := range n {
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), "NCCL_TEST_HELPER=1", fmt.Sprint("H_RANK=", r), fmt.Sprint("H_SIZE=", n),
			fmt.Sprint("H_PORT=", port), "H_BACKEND="+backend, fmt.Sprint("H_ELEMS=", elems))
		out, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		cmd.Stderr = os.Stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		h := &helper{cmd: cmd, lines: make(chan string, 16)}
		go func() {
			sc := bufio.NewScanner(out)
			for sc.Scan() {
				h.lines <- sc.Text()
			}
			close(h.lines)
		}()
		hs[r] = h
		t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	}
	for r, h := range hs {
		select {
		case l := <-h.lines:
			if l != "READY" {
				t.Fatalf("rank %d: %s", r, l)
			}
		case <-time.After(20 * time.Second):
			t.Fatalf("rank %d never got ready", r)
		}
	}
	return hs
}

// testFault breaks one rank of a running world that all-reduces buffers of
// elems elements and checks that every other rank fails quickly with an
// error that names it.
func testFault(t *testing.T, backend string, victim int, stop bool, elems int) {
	const n = 4
	hs := startHelpers(t, n, backend, elems)
	start := time.Now()
	if stop {
		hs[victim].cmd.Process.Signal(syscall.SIGSTOP)
	} else {
		hs[victim].cmd.Process.Kill()
	}
	want := fmt.Sprintf("rank %d ", victim)
	for r, h := range hs {
		if r == victim {
			continue
		}
		select {
		case l := <-h.lines:
			if !strings.HasPrefix(l, "ERR") || !strings.Contains(l, want) {
				t.Errorf("rank %d: %q, want an error naming %q", r, l, want)
			} else {
				t.Logf("rank %d after %v: %s", r, time.Since(start).Round(time.Millisecond), l)
			}
		case <-time.After(15 * time.Second):
			t.Errorf("rank %d still running 15s after rank %d failed", r, victim)
			continue
		}
		// Closing a failed world does not wait for the dead.
		select {
		case l := <-h.lines:
			var ms int
			if _, err := fmt.Sscanf(l, "CLOSED %d", &ms); err != nil || ms > 3000 {
				t.Errorf("rank %d: %q, want CLOSED within 3000 ms", r, l)
			}
		case <-time.After(10 * time.Second):
			t.Errorf("rank %d: Close still blocked 10s after the failure", r)
		}
	}
	if stop {
		hs[victim].cmd.Process.Kill()
	}
}

// Ring and two-phase shared memory (1 MiB), direct exchange and one phase
// (256 B).
func TestFaultKillTCP(t *testing.T)   { testFault(t, BackendTCP, 2, false, 1<<18) }
func TestFaultKillRank0(t *testing.T) { testFault(t, BackendTCP, 0, false, 1<<18) }
func TestFaultStallTCP(t *testing.T)  { testFault(t, BackendTCP, 1, true, 1<<18) }

func TestFaultKillExchange(t *testing.T)  { testFault(t, BackendTCP, 2, false, 64) }
func TestFaultStallExchange(t *testing.T) { testFault(t, BackendTCP, 1, true, 64) }

func TestFaultKillShm(t *testing.T)          { testFault(t, BackendAuto, 3, false, 1<<18) }
func TestFaultStallShm(t *testing.T)         { testFault(t, BackendAuto, 2, true, 1<<18) }
func TestFaultStallRank0(t *testing.T)       { testFault(t, BackendAuto, 0, true, 1<<18) }
func TestFaultStallShmOnePhase(t *testing.T) { testFault(t, BackendAuto, 2, true, 64) }
