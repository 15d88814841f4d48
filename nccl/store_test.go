package nccl

import (
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
	req := append(make([]byte, 32), opSet, 1, 0, 0, 0, 1, 0, 0, 0, 'k', 'v', 0, 0, 0, 0)
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
