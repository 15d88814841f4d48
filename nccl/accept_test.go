package nccl

import (
	"context"
	"net"
	"sync"
	"syscall"
	"testing"
	"time"
)

// exhausted is a listener whose first Accepts fail as when the process is
// out of file descriptors.
type exhausted struct {
	net.Listener
	mu    sync.Mutex
	fails int
}

func (l *exhausted) Accept() (net.Conn, error) {
	l.mu.Lock()
	if l.fails > 0 {
		l.fails--
		l.mu.Unlock()
		return nil, &net.OpError{Op: "accept", Net: "tcp", Err: syscall.EMFILE}
	}
	l.mu.Unlock()
	return l.Listener.Accept()
}

// TestStoreAcceptsAgainAfterEMFILE: before, the store's accept loop
// returned on its first error, so after one EMFILE (1,100 idle connections
// under --nofile 1024) it never accepted again, rank 1 failed "no answer
// within 30s" and rank 0 blamed it.
func TestStoreAcceptsAgainAfterEMFILE(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv, err := ServeStoreOn(&exhausted{Listener: ln, fails: 5}, "secret", 0)
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	st, err := DialStore(context.Background(), srv.Addr(), "secret", 5*time.Second)
	if err != nil {
		t.Fatalf("dial after 5 failed accepts: %v", err)
	}
	defer st.Close()
	if err := st.Set("k", []byte("v")); err != nil {
		t.Fatal(err)
	}
}

// TestStoreBoundsIdleConnections: connections that never prove the token
// are at most maxUnauthenticated (the oldest are closed), and a rank that
// connects after a flood of them gets in at once.
func TestStoreBoundsIdleConnections(t *testing.T) {
	srv, err := ServeStore("127.0.0.1:0", "secret", 0)
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	var idle []net.Conn
	defer func() {
		for _, c := range idle {
			c.Close()
		}
	}()
	for range 3 * maxUnauthenticated {
		c, err := net.Dial("tcp", srv.Addr())
		if err != nil {
			t.Fatal(err)
		}
		idle = append(idle, c)
	}
	start := time.Now()
	st, err := DialStore(context.Background(), srv.Addr(), "secret", 5*time.Second)
	if err != nil {
		t.Fatalf("dial after %d idle connections: %v", len(idle), err)
	}
	defer st.Close()
	if err := st.Set("k", []byte("v")); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("a rank waited %v to get in past idle connections", d)
	}
	time.Sleep(100 * time.Millisecond) // the evicted handlers return
	srv.mu.Lock()
	open := len(srv.conns)
	srv.mu.Unlock()
	if open > maxUnauthenticated+1 {
		t.Errorf("%d connections held open by the store after %d idle ones, want at most %d", open, len(idle), maxUnauthenticated+1)
	}
}
