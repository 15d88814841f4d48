package nccl

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"strings"
	"testing"
	"time"
)

func newTestStore(t *testing.T, stall time.Duration) (*StoreServer, *Store) {
	t.Helper()
	srv, err := ServeStore("127.0.0.1:0", "secret", stall)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	st, err := DialStore(context.Background(), srv.Addr(), "secret", 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return srv, st
}

func TestStoreOps(t *testing.T) {
	srv, st := newTestStore(t, 0)
	if err := st.Set("a", []byte("1")); err != nil {
		t.Fatal(err)
	}
	if v, err := st.Get("a", 0); err != nil || string(v) != "1" {
		t.Fatalf("Get a = %q, %v", v, err)
	}
	for i, want := range []int64{3, 5, 2} {
		delta := []int64{3, 2, -3}[i]
		if n, err := st.Add("n", delta); err != nil || n != want {
			t.Fatalf("Add %d = %d, %v; want %d", delta, n, err, want)
		}
	}
	if v, err := st.SetIfAbsent("w", []byte("first")); err != nil || string(v) != "first" {
		t.Fatalf("SetIfAbsent = %q, %v", v, err)
	}
	if v, err := st.SetIfAbsent("w", []byte("second")); err != nil || string(v) != "first" {
		t.Fatalf("second SetIfAbsent = %q, %v; want first", v, err)
	}
	if _, err := st.Get("missing", 50*time.Millisecond); !errors.Is(err, ErrTimeout) {
		t.Fatalf("Get of a missing key: %v, want a timeout", err)
	}
	// A waiting Get returns when another client sets the key.
	other, err := DialStore(context.Background(), srv.Addr(), "secret", time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	go func() {
		time.Sleep(50 * time.Millisecond)
		other.Set("late", []byte("x"))
	}()
	if v, err := st.Get("late", 5*time.Second); err != nil || string(v) != "x" {
		t.Fatalf("waiting Get = %q, %v", v, err)
	}
}

func TestStoreRefusesStrangers(t *testing.T) {
	srv, st := newTestStore(t, 0)
	if _, err := DialStore(context.Background(), srv.Addr(), "guess", time.Second); !errors.Is(err, ErrBadToken) {
		t.Fatalf("wrong token: %v, want ErrBadToken", err)
	}
	// A raw client that skips the challenge cannot set a key.
	conn, err := net.Dial("tcp", srv.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(5 * time.Second))
	nonce := make([]byte, 32)
	io.ReadFull(conn, nonce)
	req := append(make([]byte, 64), opSet, 1, 0, 0, 0, 1, 0, 0, 0, 'k', 'v', 0, 0, 0, 0)
	conn.Write(req)
	var b [1]byte
	if _, err := io.ReadFull(conn, b[:]); err != nil || b[0] != 1 {
		t.Fatalf("stranger got status %v, %v; want refusal", b, err)
	}
	if _, err := io.ReadFull(conn, b[:]); err == nil {
		t.Fatal("connection still open after refusal")
	}
	if _, err := st.Get("k", 0); err == nil {
		t.Fatal("the stranger's key was stored")
	}
	if _, err := ServeStore("127.0.0.1:0", "", 0); err == nil {
		t.Fatal("ServeStore accepted an empty token")
	}
}

func TestStoreAbortOnLostRank(t *testing.T) {
	srv, st := newTestStore(t, 0)
	w, err := DialStore(context.Background(), srv.Addr(), "secret", time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Register(3, "node7"); err != nil {
		t.Fatal(err)
	}
	w.Close() // dies without Goodbye
	v, err := st.Get(AbortKey, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	pe := decodeAbort(v)
	if pe.Rank != 3 || pe.Host != "node7" || !strings.Contains(pe.Error(), "exited") {
		t.Fatalf("abort = %v", pe)
	}

	// A clean goodbye aborts nothing.
	srv2, st2 := newTestStore(t, 0)
	w2, _ := DialStore(context.Background(), srv2.Addr(), "secret", time.Second)
	w2.Register(1, "h")
	w2.Goodbye()
	w2.Close()
	if _, err := st2.Get(AbortKey, 200*time.Millisecond); !errors.Is(err, ErrTimeout) {
		t.Fatalf("abort after a goodbye: %v", err)
	}
}

func TestStoreAbortOnStall(t *testing.T) {
	srv, st := newTestStore(t, 200*time.Millisecond)
	w, err := DialStore(context.Background(), srv.Addr(), "secret", time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	if err := w.Register(2, "n2"); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	v, err := st.Get(AbortKey, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if pe := decodeAbort(v); pe.Rank != 2 || !strings.Contains(pe.Error(), "stalled") {
		t.Fatalf("abort = %v", pe)
	}
	if d := time.Since(start); d > 3*time.Second {
		t.Fatalf("stall noticed after %v", d)
	}
}

// impostor listens where a store or a peer is expected without knowing the
// token: it sends a nonce, takes whatever answer comes and says "accepted",
// followed by bytes that look like a proof. It reports what the client sent
// after the handshake.
func impostor(t *testing.T) (addr string, got <-chan []byte) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	ch := make(chan []byte, 1)
	go func() {
		conn, err := ln.Accept()
		if err != nil {
			return
		}
		defer conn.Close()
		conn.SetDeadline(time.Now().Add(3 * time.Second))
		conn.Write(make([]byte, 32))
		buf := make([]byte, 4096)
		conn.Read(buf)
		conn.Write(append([]byte{0}, make([]byte, 32)...))
		n, _ := conn.Read(buf)
		ch <- buf[:n]
	}()
	return ln.Addr().String(), ch
}

// A client proves the token only to a server that proves it back: a
// process that took the master's (or a peer's) port first learns nothing
// and is refused, for the store and for peer links.
func TestAuthRefusesImpostorServer(t *testing.T) {
	addr, got := impostor(t)
	st, err := DialStore(context.Background(), addr, "secret", 2*time.Second)
	if err == nil {
		st.Register(3, "victim")
		st.Close()
		t.Fatalf("DialStore accepted a server without the token; it sent %q", <-got)
	}
	if !errors.Is(err, ErrBadToken) || !strings.Contains(err.Error(), "does not know the job's token") {
		t.Fatalf("DialStore to an impostor: %v, want ErrBadToken naming the server", err)
	}
	addr, _ = impostor(t)
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if err := authDial(conn, "secret", "hpcrun-peer", time.Now().Add(2*time.Second)); !errors.Is(err, ErrBadToken) {
		t.Fatalf("peer link to an impostor: %v, want ErrBadToken", err)
	}
}

// The two sides' proofs differ: a server cannot answer a client with the
// client's own proof (reflection), and a proof made for the store does
// not open a peer link.
func TestAuthProofsAreBoundToSideAndPurpose(t *testing.T) {
	s, c := []byte("server-nonce"), []byte("client-nonce")
	client := authMAC("secret", "hpcrun-store/client", s, c)
	if bytes.Equal(client, authMAC("secret", "hpcrun-store/server", s, c)) ||
		bytes.Equal(client, authMAC("secret", "hpcrun-peer/client", s, c)) ||
		bytes.Equal(client, authMAC("secret", "hpcrun-store/client", c, s)) {
		t.Fatal("a proof is valid for another side, purpose or nonce order")
	}
}

// A store served on a listener bound beforehand (a launcher's) works, and
// its port was never free for another process to take.
func TestServeStoreOnHandedListener(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := net.Listen("tcp", ln.Addr().String()); err == nil {
		t.Fatal("the handed-over port could be bound twice")
	}
	srv, err := ServeStoreOn(ln, "secret", 0)
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	st, err := DialStore(context.Background(), ln.Addr().String(), "secret", 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if err := st.Set("k", []byte("v")); err != nil {
		t.Fatal(err)
	}
}
