package nccl

import (
	"errors"
	"net"
	"slices"
	"sync"
	"time"
)

// maxUnauthenticated bounds the connections of a listener that have not yet
// proven the job's token: when one more comes, the oldest is closed, so
// that idle connections (or a flood of them) cannot take the process's
// file descriptors, while a rank that connects now, and proves the token
// within a round trip, gets in. Each is dropped after authWait in any case.
const maxUnauthenticated = 128

// acceptBackoff is the longest wait before accepting again after a failed
// Accept.
const acceptBackoff = time.Second

// acceptLoop accepts connections on ln until it is closed, giving each to
// handle in a goroutine of its own (started with wg). A failed Accept
// (EMFILE when the process is out of file descriptors, ECONNABORTED) waits
// 5 ms, doubling to acceptBackoff, and accepts again: the listener is never
// given up while it is open. handle must call authenticated once its
// connection has proven the token; until then the connection is one of at
// most maxUnauthenticated.
func acceptLoop(ln net.Listener, wg *sync.WaitGroup, handle func(conn net.Conn, authenticated func())) {
	var pending unproven
	var delay time.Duration
	for {
		conn, err := ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			delay = min(max(2*delay, 5*time.Millisecond), acceptBackoff)
			time.Sleep(delay)
			continue
		}
		delay = 0
		pending.add(conn)
		var once sync.Once
		authenticated := func() { once.Do(func() { pending.remove(conn) }) }
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer authenticated()
			handle(conn, authenticated)
		}()
	}
}

// unproven are a listener's connections that have not proven the token,
// oldest first.
type unproven struct {
	mu    sync.Mutex
	conns []net.Conn
}

// add counts conn, closing the oldest when there are maxUnauthenticated.
func (u *unproven) add(conn net.Conn) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if len(u.conns) >= maxUnauthenticated {
		u.conns[0].Close() // its handler fails and removes it
		u.conns = u.conns[1:]
	}
	u.conns = append(u.conns, conn)
}

// remove forgets conn (proven, or done).
func (u *unproven) remove(conn net.Conn) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if i := slices.Index(u.conns, conn); i >= 0 {
		u.conns = slices.Delete(u.conns, i, i+1)
	}
}
