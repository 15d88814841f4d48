package nccl

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
	"time"
)

func freePort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// tcpWorld runs the ranks of a loopback world on goroutines of this
// process, each with its own Init (as separate processes would).
func tcpWorld(backend string) world {
	return func(t *testing.T, n int, fn func(c Comm) error) error {
		port := freePort(t)
		errs := make([]error, n)
		var wg sync.WaitGroup
		for r := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				c, err := Init(context.Background(), Options{Rank: r, Size: n, MasterAddr: "127.0.0.1",
					MasterPort: port, Token: "test-token", Timeout: 10 * time.Second, Backend: backend})
				if err != nil {
					errs[r] = fmt.Errorf("rank %d: init: %w", r, err)
					return
				}
				if err := fn(c); err != nil {
					errs[r] = fmt.Errorf("rank %d: %w", r, err)
				}
				if err := c.Close(); err != nil && errs[r] == nil {
					errs[r] = fmt.Errorf("rank %d: close: %w", r, err)
				}
			}()
		}
		wg.Wait()
		return errors.Join(errs...)
	}
}

func TestTCPCollectives(t *testing.T) {
	for _, n := range []int{1, 2, 3, 4, 8} {
		t.Run(fmt.Sprint(n), func(t *testing.T) { testCollectives(t, tcpWorld(BackendTCP), n, false) })
	}
}

func TestTCPGroups(t *testing.T) {
	for _, c := range []struct{ n, tp int }{{4, 2}, {8, 4}} {
		t.Run(fmt.Sprint(c.n, "x", c.tp), func(t *testing.T) { testGroups(t, tcpWorld(BackendTCP), c.n, c.tp, false) })
	}
}

func TestTCPMismatchIsAnError(t *testing.T) {
	err := tcpWorld(BackendTCP)(t, 2, func(c Comm) error {
		err := c.Barrier() // everyone is past Init (a rank still in it may see the mismatch there)
		if err == nil {
			err = c.AllReduce(make([]float32, 10+c.Rank()), Sum)
		}
		if err == nil || !strings.Contains(err.Error(), "elements") {
			return fmt.Errorf("mismatched AllReduce: %v, want a length error", err)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

func TestInitRefusesWrongToken(t *testing.T) {
	port := freePort(t)
	done := make(chan error, 1)
	go func() {
		c, err := Init(context.Background(), Options{Rank: 0, Size: 2, MasterAddr: "127.0.0.1", MasterPort: port,
			Token: "right", Timeout: 2 * time.Second})
		if err == nil {
			c.Close()
		}
		done <- err
	}()
	_, err := Init(context.Background(), Options{Rank: 1, Size: 2, MasterAddr: "127.0.0.1", MasterPort: port,
		Token: "wrong", Timeout: 2 * time.Second})
	if !errors.Is(err, ErrBadToken) {
		t.Fatalf("rank with the wrong token: %v, want ErrBadToken", err)
	}
	if err := <-done; err == nil || !strings.Contains(err.Error(), "rank 1 did not join") {
		t.Fatalf("rank 0: %v, want rank 1 not joining", err)
	}
}

func TestInitOptions(t *testing.T) {
	for _, o := range []Options{
		{Rank: 0, Size: 0},
		{Rank: 2, Size: 2, MasterAddr: "x", MasterPort: 1, Token: "t"},
		{Rank: 0, Size: 2, MasterPort: 1, Token: "t"},
		{Rank: 0, Size: 2, MasterAddr: "x", MasterPort: 0, Token: "t"},
		{Rank: 0, Size: 2, MasterAddr: "x", MasterPort: 1},
		{Rank: 0, Size: 2, MasterAddr: "x", MasterPort: 1, Token: "t", Backend: "mpi"},
	} {
		if _, err := Init(context.Background(), o); err == nil {
			t.Errorf("Init(%+v) succeeded", o)
		}
	}
}

func TestShmCollectives(t *testing.T) {
	for _, n := range []int{2, 3, 4, 8} {
		t.Run(fmt.Sprint(n), func(t *testing.T) { testCollectives(t, tcpWorld(BackendAuto), n, true) })
	}
}

func TestShmGroups(t *testing.T) {
	for _, c := range []struct{ n, tp int }{{4, 2}, {8, 4}} {
		t.Run(fmt.Sprint(c.n, "x", c.tp), func(t *testing.T) { testGroups(t, tcpWorld(BackendAuto), c.n, c.tp, true) })
	}
}

func TestShmMismatchIsAnError(t *testing.T) {
	err := tcpWorld(BackendAuto)(t, 3, func(c Comm) error {
		err := c.AllReduce(make([]float32, c.Rank()), Sum)
		if err == nil || !strings.Contains(err.Error(), "elements") {
			return fmt.Errorf("mismatched AllReduce: %v, want a length error", err)
		}
		// The group is still usable after a mismatch.
		buf := []float32{1}
		if err := c.AllReduce(buf, Sum); err != nil || buf[0] != 3 {
			return fmt.Errorf("AllReduce after a mismatch: %v, %v", buf, err)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// A stranger without the job token cannot open a data connection to a rank.
func TestPeerListenerRefusesStrangers(t *testing.T) {
	err := tcpWorld(BackendTCP)(t, 2, func(c Comm) error {
		if c.Rank() == 0 {
			addr := c.(*tcpComm).nd.self.addr
			conn, err := net.Dial("tcp", addr)
			if err != nil {
				return err
			}
			defer conn.Close()
			if err := authDial(conn, "not-the-token", "hpcrun-peer", time.Now().Add(5*time.Second)); !errors.Is(err, ErrBadToken) {
				return fmt.Errorf("stranger on the data port: %v, want ErrBadToken", err)
			}
		}
		// The world still works.
		buf := []float32{1}
		if err := c.AllReduce(buf, Sum); err != nil || buf[0] != 2 {
			return fmt.Errorf("AllReduce after a stranger: %v %v", buf, err)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// Ranks that disagree on the collective fail together, not by timeout. A
// rank still finishing the Barrier when the others' mismatch aborts the
// job fails there, with the same error (pending operations fail once the
// job has).
func TestTCPMismatchFailsEveryRank(t *testing.T) {
	start := time.Now()
	err := tcpWorld(BackendTCP)(t, 4, func(c Comm) error {
		err := c.Barrier() // everyone is past Init
		switch {
		case err != nil:
		case c.Rank() == 2:
			err = c.Broadcast(make([]float32, 100), 0)
		default:
			err = c.AllReduce(make([]float32, 100), Sum)
		}
		if err == nil || !strings.Contains(err.Error(), "called") {
			return fmt.Errorf("mismatched collectives: %v, want a mismatch error", err)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("mismatch noticed after %v", d)
	}
}

// Buffers of several shared-memory chunks, back to back with different
// collectives, so that chunks rotate through the slot sets across calls.
func TestShmManyChunks(t *testing.T) {
	testManyPieces(t, BackendAuto, []int{2*slotElems + 7, slotElems, 3*slotElems + 1, 5})
}

// The same for the TCP ring's pieces.
func TestTCPManyPieces(t *testing.T) {
	testManyPieces(t, BackendTCP, []int{7*pieceElems + 7, 3 * pieceElems, 5})
}

func testManyPieces(t *testing.T, backend string, sizes []int) {
	const n = 3
	err := tcpWorld(backend)(t, n, func(c Comm) error {
		if (c.(*tcpComm).shm != nil) != (backend == BackendAuto) {
			return fmt.Errorf("backend %s: shared memory %v", backend, c.(*tcpComm).shm != nil)
		}
		r := c.Rank()
		exact := backend == BackendAuto
		for i, size := range sizes {
			seed := uint64(100 + i)
			buf := rankData(seed, r, size)
			if err := c.AllReduce(buf, Sum); err != nil {
				return err
			}
			if err := closeTo(buf, serialReduce(seed, n, size, Sum), n, exact); err != nil {
				return fmt.Errorf("AllReduce %d: %w", size, err)
			}
			block := size/2 + 1
			send := rankData(seed+50, r, block*n)
			recv := make([]float32, block)
			if err := c.ReduceScatter(send, recv, Max); err != nil {
				return err
			}
			if err := closeTo(recv, serialReduce(seed+50, n, block*n, Max)[r*block:(r+1)*block], n, true); err != nil {
				return fmt.Errorf("ReduceScatter %d: %w", block, err)
			}
			all := make([]float32, block*n)
			if err := c.AllGather(recv, all); err != nil {
				return err
			}
			if err := closeTo(all, serialReduce(seed+50, n, block*n, Max), n, true); err != nil {
				return fmt.Errorf("AllGather %d: %w", block, err)
			}
			b := rankData(seed+70, r, size)
			if err := c.Broadcast(b, i%n); err != nil {
				return err
			}
			if err := closeTo(b, rankData(seed+70, i%n, size), n, true); err != nil {
				return fmt.Errorf("Broadcast %d: %w", size, err)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

func TestInitHonoursContext(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := Init(ctx, Options{Rank: 0, Size: 2, MasterAddr: "127.0.0.1", MasterPort: freePort(t), Token: "t", Timeout: 20 * time.Second})
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Init with an ended context: %v", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("Init returned %v after its context ended", d)
	}
}

// Ranks on three pretend hosts (3 + 2 + 1): all-reduce goes host-local,
// then between hosts.
func TestHierarchicalHosts(t *testing.T) {
	testHostID = func(rank int) string { return []string{"a", "a", "a", "b", "b", "c"}[rank] }
	t.Cleanup(func() { testHostID = nil })
	t.Run("collectives", func(t *testing.T) { testCollectives(t, tcpWorld(BackendAuto), 6, false) })
	t.Run("groups", func(t *testing.T) { testGroups(t, tcpWorld(BackendAuto), 6, 3, false) })
	err := tcpWorld(BackendAuto)(t, 6, func(c Comm) error {
		tc := c.(*tcpComm)
		if tc.local == nil || tc.shm != nil || (tc.leaders != nil) != (c.Rank() == 0 || c.Rank() == 3 || c.Rank() == 5) {
			return fmt.Errorf("rank %d: local %v leaders %v shm %v", c.Rank(), tc.local != nil, tc.leaders != nil, tc.shm != nil)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// A rank that gives up on an error of its own (its metrics file cannot be
// written) publishes it: the others stop within moments, each naming that
// rank and quoting its error, instead of timing out on whoever they were
// waiting for. Rank 0 and another rank are tried as the culprit.
func TestAbortPublishesARanksOwnError(t *testing.T) {
	for _, culprit := range []int{2, 0} {
		t.Run(fmt.Sprint("rank", culprit), func(t *testing.T) {
			start := time.Now()
			err := tcpWorld(BackendTCP)(t, 3, func(c Comm) error {
				err := c.Barrier() // a rank still in it may see the abort there
				if c.Rank() == culprit {
					if err != nil {
						return err
					}
					own := errors.New("metrics: open rank file: disk quota exceeded")
					var pe *PeerError
					if err := Abort(c, own); !errors.As(err, &pe) || pe.Rank != culprit || !strings.Contains(err.Error(), own.Error()) {
						return fmt.Errorf("Abort = %v, want the job's failure naming rank %d", err, culprit)
					}
					return nil
				}
				if err == nil {
					err = c.AllReduce([]float32{1}, Sum)
				}
				var pe *PeerError
				if !errors.As(err, &pe) || pe.Rank != culprit || !strings.Contains(err.Error(), "disk quota exceeded") {
					return fmt.Errorf("AllReduce after rank %d's own failure: %v, want its error", culprit, err)
				}
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
			if d := time.Since(start); d > 5*time.Second {
				t.Errorf("the others took %v to stop", d)
			}
		})
	}
}

// TestAbortBetweenMessages aborts a rank between two messages of a
// collective, as the Store's delivery of a peer's failure may, and checks
// that its next read or write, which sets its own deadline, fails at once
// with the job's failure instead of waiting out the timeout for a peer
// that never answers.
func TestAbortBetweenMessages(t *testing.T) {
	peerDone := make(chan struct{})
	err := tcpWorld(BackendTCP)(t, 2, func(c Comm) error {
		if err := c.Barrier(); err != nil {
			return err
		}
		if c.Rank() == 1 { // the stalled peer: sends nothing, reads nothing
			<-peerDone
			return nil
		}
		defer close(peerDone)
		tc := c.(*tcpComm)
		why := &PeerError{Rank: 1, Host: "elsewhere", Err: errors.New("out of memory")}
		tc.nd.abortLocal(why)
		big := make([]float32, 16<<20) // more than the sockets hold
		steps := []struct {
			name string
			do   func() error
		}{
			{"read", func() error { return tc.read(tc.prev, 1, make([]byte, 16)) }},
			{"readSpin", func() error { return tc.readSpin(tc.prev, 1, make([]byte, 16)) }},
			{"write", func() error { return tc.write(tc.next, 1, asBytes(big)) }},
			{"writeSpans", func() error {
				return tc.writeSpans(tc.next, 1, big, []span{{0, len(big)}}, header('R', Sum, len(big)))
			}},
		}
		for _, s := range steps {
			start := time.Now()
			err := s.do()
			if d := time.Since(start); d > 2*time.Second {
				return fmt.Errorf("%s after the abort took %v (the timeout is 10 s)", s.name, d)
			}
			if !errors.Is(err, why) && (err == nil || !strings.Contains(err.Error(), "out of memory")) {
				return fmt.Errorf("%s after the abort: %v, want the job's failure", s.name, err)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
