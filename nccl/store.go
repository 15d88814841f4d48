package nccl

import (
	"bufio"
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"sync"
	"time"
)

// The Store is the rendezvous of a job: a small key-value server that rank 0
// runs at the master address, where ranks publish their listen addresses and
// NCCL unique ids, count arrivals, and learn that a peer failed. Every
// connection proves it knows the job's token (an HMAC-SHA256 challenge), so
// a stranger's connection is refused before it can read or write anything.
//
// Besides plain keys, the server watches the ranks: each rank keeps one
// "watch" connection open (Register) and pings it; if that connection drops
// without a goodbye, or stops pinging for longer than the stall timeout,
// the server publishes an abort record naming the rank under AbortKey,
// which every other rank is waiting on.

// AbortKey holds the first failure of the job, once there is one.
const AbortKey = "hpcrun/abort"

const (
	opSet byte = iota + 1
	opGet
	opAdd
	opSetIfAbsent
	opDelete
	opRegister
	opPing
	opBye
)

const (
	stOK byte = iota
	stTimeout
	stErr
)

const (
	maxKey   = 4096
	maxValue = 64 << 20
	authWait = 10 * time.Second
)

// ErrBadToken is returned when a peer presents the wrong token, or when the
// server dialed cannot prove that it knows the token.
var ErrBadToken = errors.New("wrong job token")

// authMAC is the proof of one side (purpose names the link and the side)
// over both sides' nonces.
func authMAC(token, purpose string, server, client []byte) []byte {
	m := hmac.New(sha256.New, []byte(token))
	m.Write([]byte(purpose))
	m.Write(server)
	m.Write(client)
	return m.Sum(nil)
}

// The handshake is a mutual challenge-response over two fresh nonces: the
// server sends its nonce, the client its own and its proof, the server a
// status byte and then its proof. Each proof is an HMAC of both nonces
// under the token, keyed to its side, so neither end can be impersonated by
// someone who lacks the token, and a proof can be neither replayed on
// another connection nor reflected back at its sender.

// authAccept challenges a new connection, checks its answer and proves the
// token in turn.
func authAccept(conn net.Conn, token, purpose string) error {
	conn.SetDeadline(time.Now().Add(authWait))
	defer conn.SetDeadline(time.Time{})
	nonce := make([]byte, 32)
	if _, err := rand.Read(nonce); err != nil {
		return err
	}
	if _, err := conn.Write(nonce); err != nil {
		return err
	}
	answer := make([]byte, 32+sha256.Size)
	if _, err := io.ReadFull(conn, answer); err != nil {
		return err
	}
	theirs := answer[:32]
	if !hmac.Equal(answer[32:], authMAC(token, purpose+"/client", nonce, theirs)) {
		conn.Write([]byte{1})
		return ErrBadToken
	}
	_, err := conn.Write(append([]byte{0}, authMAC(token, purpose+"/server", nonce, theirs)...))
	return err
}

// authDial answers the challenge of authAccept and checks the server's
// proof: a listener that does not know the token (one that took the port
// first) is refused before anything is sent over the connection.
func authDial(conn net.Conn, token, purpose string, deadline time.Time) error {
	conn.SetDeadline(deadline)
	defer conn.SetDeadline(time.Time{})
	theirs := make([]byte, 32)
	if _, err := io.ReadFull(conn, theirs); err != nil {
		return err
	}
	nonce := make([]byte, 32)
	if _, err := rand.Read(nonce); err != nil {
		return err
	}
	if _, err := conn.Write(append(nonce, authMAC(token, purpose+"/client", theirs, nonce)...)); err != nil {
		return err
	}
	var ok [1]byte
	if _, err := io.ReadFull(conn, ok[:]); err != nil {
		return err
	}
	if ok[0] != 0 {
		return ErrBadToken
	}
	proof := make([]byte, sha256.Size)
	if _, err := io.ReadFull(conn, proof); err != nil {
		return fmt.Errorf("%w: %s sent no proof of the token: %v", ErrBadToken, conn.RemoteAddr(), err)
	}
	if !hmac.Equal(proof, authMAC(token, purpose+"/server", theirs, nonce)) {
		return fmt.Errorf("%w: %s does not know the job's token (another process on its port?)", ErrBadToken, conn.RemoteAddr())
	}
	return nil
}

// StoreServer serves a Store. Rank 0 runs it.
type StoreServer struct {
	ln    net.Listener
	token string
	stall time.Duration

	mu      sync.Mutex
	data    map[string][]byte
	changed chan struct{} // closed and replaced on every write
	ranks   map[int]*watched
	closed  bool
	conns   map[net.Conn]bool
	wg      sync.WaitGroup
	// abortWaiting counts connections blocked on AbortKey whose answer is
	// not yet written, so that rank 0 can make sure that the others hear
	// of an abort before its process exits and takes the Store along.
	abortWaiting int
}

type watched struct {
	host string
	last time.Time
	bye  bool // said goodbye
	gone bool // its watch connection closed
}

// ServeStore listens on addr (host:port) and serves a Store to clients
// that know token. A rank registered with Register that neither pings nor
// says goodbye within stall is declared stalled (0 disables).
func ServeStore(addr, token string, stall time.Duration) (*StoreServer, error) {
	if token == "" {
		return nil, errors.New("store: empty job token: pass the job's token")
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("store: listen %s: %w", addr, err)
	}
	return ServeStoreOn(ln, token, stall)
}

// ServeStoreOn is ServeStore on a listener that is already bound, such as
// one a launcher bound and handed over, so that no other process can take
// the port in between. The server closes ln when it closes.
func ServeStoreOn(ln net.Listener, token string, stall time.Duration) (*StoreServer, error) {
	if token == "" {
		ln.Close()
		return nil, errors.New("store: empty job token: pass the job's token")
	}
	s := &StoreServer{ln: ln, token: token, stall: stall, data: map[string][]byte{},
		changed: make(chan struct{}), ranks: map[int]*watched{}, conns: map[net.Conn]bool{}}
	s.wg.Add(1)
	go s.accept()
	if stall > 0 {
		s.wg.Add(1)
		go s.watchStalls()
	}
	return s, nil
}

// Addr is the address the server listens on.
func (s *StoreServer) Addr() string { return s.ln.Addr().String() }

// Close stops the server and drops its connections.
func (s *StoreServer) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	close(s.changed)
	s.changed = make(chan struct{})
	for c := range s.conns {
		c.Close()
	}
	s.mu.Unlock()
	err := s.ln.Close()
	s.wg.Wait()
	return err
}

// WaitGoodbyes waits until every registered rank has said goodbye or lost
// its watch connection, or until timeout.
func (s *StoreServer) WaitGoodbyes(timeout time.Duration) {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		s.mu.Lock()
		done := true
		for _, w := range s.ranks {
			if !w.bye && !w.gone {
				done = false
			}
		}
		ch := s.changed
		s.mu.Unlock()
		if done {
			return
		}
		select {
		case <-ch:
		case <-time.After(time.Until(deadline)):
		}
	}
}

func (s *StoreServer) accept() {
	defer s.wg.Done()
	acceptLoop(s.ln, &s.wg, func(conn net.Conn, authenticated func()) {
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			conn.Close()
			return
		}
		s.conns[conn] = true
		s.mu.Unlock()
		s.serve(conn, authenticated)
		s.mu.Lock()
		delete(s.conns, conn)
		s.mu.Unlock()
		conn.Close()
	})
}

// publish stores v under k and wakes waiters; caller holds s.mu.
func (s *StoreServer) publish(k string, v []byte) {
	s.data[k] = v
	close(s.changed)
	s.changed = make(chan struct{})
}

// abort records the first failure; caller holds s.mu.
func (s *StoreServer) abort(rank int, host, msg string) {
	if _, ok := s.data[AbortKey]; ok || s.closed {
		return
	}
	s.publish(AbortKey, encodeAbort(&PeerError{Rank: rank, Host: host, Err: errors.New(msg)}))
}

func (s *StoreServer) watchStalls() {
	defer s.wg.Done()
	tick := time.NewTicker(s.stall / 4)
	defer tick.Stop()
	for {
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			return
		}
		ch := s.changed
		for r, w := range s.ranks {
			if !w.bye && time.Since(w.last) > s.stall {
				s.abort(r, w.host, fmt.Sprintf("stalled: no heartbeat for %v", time.Since(w.last).Round(time.Millisecond)))
			}
		}
		s.mu.Unlock()
		select {
		case <-tick.C:
		case <-ch:
		}
	}
}

func (s *StoreServer) serve(conn net.Conn, authenticated func()) {
	if err := authAccept(conn, s.token, "hpcrun-store"); err != nil {
		return
	}
	authenticated()
	r := bufio.NewReader(conn)
	w := bufio.NewWriter(conn)
	rank := -1 // set when this is a rank's watch connection
	defer func() {
		if rank < 0 {
			return
		}
		s.mu.Lock()
		if wt := s.ranks[rank]; wt != nil {
			if !wt.bye {
				s.abort(rank, wt.host, "process exited or lost its connection to the rendezvous store")
			}
			wt.gone = true
			close(s.changed)
			s.changed = make(chan struct{})
		}
		s.mu.Unlock()
	}()
	for {
		op, key, val, wait, err := readRequest(r)
		if err != nil {
			return
		}
		watching := op == opGet && key == AbortKey
		if watching {
			s.mu.Lock()
			s.abortWaiting++
			s.mu.Unlock()
		}
		st, out := s.do(op, key, val, wait, &rank)
		err = writeFrame(w, st, out)
		if err == nil {
			err = w.Flush()
		}
		if watching {
			s.mu.Lock()
			s.abortWaiting--
			close(s.changed)
			s.changed = make(chan struct{})
			s.mu.Unlock()
		}
		if err != nil {
			return
		}
	}
}

// waitAbortDelivered waits until every connection that was waiting on
// AbortKey has been answered, or until timeout.
func (s *StoreServer) waitAbortDelivered(timeout time.Duration) {
	deadline := time.Now().Add(timeout)
	for {
		s.mu.Lock()
		n, ch := s.abortWaiting, s.changed
		s.mu.Unlock()
		if n == 0 || time.Now().After(deadline) {
			return
		}
		select {
		case <-ch:
		case <-time.After(time.Until(deadline)):
		}
	}
}

func (s *StoreServer) do(op byte, key string, val []byte, wait time.Duration, rank *int) (byte, []byte) {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch op {
	case opSet:
		s.publish(key, val)
		return stOK, nil
	case opSetIfAbsent:
		if v, ok := s.data[key]; ok {
			return stOK, v
		}
		s.publish(key, val)
		return stOK, val
	case opDelete:
		delete(s.data, key)
		return stOK, nil
	case opAdd:
		if len(val) != 8 {
			return stErr, []byte("add: bad delta")
		}
		cur := int64(0)
		if v, ok := s.data[key]; ok {
			n, err := strconv.ParseInt(string(v), 10, 64)
			if err != nil {
				return stErr, []byte(fmt.Sprintf("add %s: value %q is not an integer", key, v))
			}
			cur = n
		}
		cur += int64(binary.LittleEndian.Uint64(val))
		s.publish(key, []byte(strconv.FormatInt(cur, 10)))
		return stOK, []byte(strconv.FormatInt(cur, 10))
	case opGet:
		deadline := time.Now().Add(wait)
		for {
			if v, ok := s.data[key]; ok {
				return stOK, v
			}
			if s.closed {
				return stErr, []byte("store closed")
			}
			left := time.Until(deadline)
			if left <= 0 {
				return stTimeout, nil
			}
			ch := s.changed
			s.mu.Unlock()
			t := time.NewTimer(left)
			select {
			case <-ch:
			case <-t.C:
			}
			t.Stop()
			s.mu.Lock()
		}
	case opRegister:
		r, err := strconv.Atoi(key)
		if err != nil || r < 0 {
			return stErr, []byte("register: bad rank")
		}
		*rank = r
		s.ranks[r] = &watched{host: string(val), last: time.Now()}
		close(s.changed)
		s.changed = make(chan struct{})
		return stOK, nil
	case opPing:
		if wt := s.ranks[*rank]; wt != nil {
			wt.last = time.Now()
		}
		return stOK, nil
	case opBye:
		if wt := s.ranks[*rank]; wt != nil {
			wt.bye = true
		}
		close(s.changed)
		s.changed = make(chan struct{})
		return stOK, nil
	}
	return stErr, []byte(fmt.Sprintf("unknown op %d", op))
}

// Request: op u8, key (u32 len + bytes), value (u32 len + bytes), wait ms u32.
func readRequest(r *bufio.Reader) (op byte, key string, val []byte, wait time.Duration, err error) {
	var hdr [9]byte
	if _, err = io.ReadFull(r, hdr[:]); err != nil {
		return
	}
	op = hdr[0]
	kl, vl := binary.LittleEndian.Uint32(hdr[1:]), binary.LittleEndian.Uint32(hdr[5:])
	if kl > maxKey || vl > maxValue {
		return 0, "", nil, 0, errors.New("request too large")
	}
	buf := make([]byte, int(kl)+int(vl)+4)
	if _, err = io.ReadFull(r, buf); err != nil {
		return
	}
	key = string(buf[:kl])
	val = buf[kl : kl+vl]
	wait = time.Duration(binary.LittleEndian.Uint32(buf[kl+vl:])) * time.Millisecond
	return
}

func writeFrame(w io.Writer, st byte, payload []byte) error {
	var hdr [5]byte
	hdr[0] = st
	binary.LittleEndian.PutUint32(hdr[1:], uint32(len(payload)))
	if _, err := w.Write(hdr[:]); err != nil {
		return err
	}
	_, err := w.Write(payload)
	return err
}

// Store is a client of a StoreServer. Its methods are safe for concurrent
// use; requests on one Store are served one at a time.
type Store struct {
	addr    string
	timeout time.Duration
	mu      sync.Mutex
	conn    net.Conn
	r       *bufio.Reader
}

// DialStore connects to the Store at addr and proves the token, retrying
// refused connections (rank 0 may not listen yet) until ctx ends or timeout
// passes. timeout also bounds every later request that does not wait.
func DialStore(ctx context.Context, addr, token string, timeout time.Duration) (*Store, error) {
	if token == "" {
		return nil, errors.New("store: empty job token: pass the job's token")
	}
	if timeout <= 0 {
		timeout = DefaultTimeout
	}
	deadline := time.Now().Add(timeout)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	var last error
	for backoff := 10 * time.Millisecond; ; backoff = min(2*backoff, 500*time.Millisecond) {
		d := net.Dialer{Deadline: deadline}
		conn, err := d.DialContext(ctx, "tcp", addr)
		if err == nil {
			if err = authDial(conn, token, "hpcrun-store", deadline); err == nil {
				return &Store{addr: addr, timeout: timeout, conn: conn, r: bufio.NewReader(conn)}, nil
			}
			conn.Close()
			if errors.Is(err, ErrBadToken) {
				return nil, fmt.Errorf("store %s: refused: %w", addr, err)
			}
			if errors.Is(err, io.EOF) {
				return nil, fmt.Errorf("store %s: refused: %w", addr, ErrBadToken)
			}
		}
		last = err
		if ctx.Err() != nil {
			return nil, fmt.Errorf("store %s: dialing stopped: %w", addr, context.Cause(ctx))
		}
		if time.Now().Add(backoff).After(deadline) {
			return nil, fmt.Errorf("store %s: no answer within %v: %w", addr, timeout, last)
		}
		select {
		case <-time.After(backoff):
		case <-ctx.Done():
		}
	}
}

// Close closes the connection.
func (s *Store) Close() error { return s.conn.Close() }

func (s *Store) call(op byte, key string, val []byte, wait time.Duration) ([]byte, error) {
	if len(key) > maxKey || len(val) > maxValue {
		return nil, fmt.Errorf("store: key or value too large (%d, %d bytes)", len(key), len(val))
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	req := make([]byte, 9, 13+len(key)+len(val))
	req[0] = op
	binary.LittleEndian.PutUint32(req[1:], uint32(len(key)))
	binary.LittleEndian.PutUint32(req[5:], uint32(len(val)))
	req = append(req, key...)
	req = append(req, val...)
	req = binary.LittleEndian.AppendUint32(req, uint32(wait/time.Millisecond))
	s.conn.SetDeadline(time.Now().Add(wait + s.timeout))
	if _, err := s.conn.Write(req); err != nil {
		return nil, fmt.Errorf("store %s: %w", s.addr, err)
	}
	var hdr [5]byte
	if _, err := io.ReadFull(s.r, hdr[:]); err != nil {
		return nil, fmt.Errorf("store %s: %w", s.addr, err)
	}
	out := make([]byte, binary.LittleEndian.Uint32(hdr[1:]))
	if _, err := io.ReadFull(s.r, out); err != nil {
		return nil, fmt.Errorf("store %s: %w", s.addr, err)
	}
	switch hdr[0] {
	case stOK:
		return out, nil
	case stTimeout:
		return nil, fmt.Errorf("store: key %q: %w after %v", key, ErrTimeout, wait)
	}
	return nil, fmt.Errorf("store: %s", out)
}

// Set stores value under key.
func (s *Store) Set(key string, value []byte) error {
	_, err := s.call(opSet, key, value, 0)
	return err
}

// Get returns the value of key, waiting up to wait for it to be set.
func (s *Store) Get(key string, wait time.Duration) ([]byte, error) {
	return s.call(opGet, key, nil, wait)
}

// Add adds delta to the integer under key (0 when absent) and returns the
// new value.
func (s *Store) Add(key string, delta int64) (int64, error) {
	out, err := s.call(opAdd, key, binary.LittleEndian.AppendUint64(nil, uint64(delta)), 0)
	if err != nil {
		return 0, err
	}
	return strconv.ParseInt(string(out), 10, 64)
}

// SetIfAbsent stores value under key unless the key exists, and returns
// the value now stored (the first writer's).
func (s *Store) SetIfAbsent(key string, value []byte) ([]byte, error) {
	return s.call(opSetIfAbsent, key, value, 0)
}

// Delete removes key.
func (s *Store) Delete(key string) error {
	_, err := s.call(opDelete, key, nil, 0)
	return err
}

// Register makes this connection the watch connection of rank: from now
// on, losing it without Goodbye, or not calling Ping within the server's
// stall timeout, aborts the job naming rank and host.
func (s *Store) Register(rank int, host string) error {
	_, err := s.call(opRegister, strconv.Itoa(rank), []byte(host), 0)
	return err
}

// Ping is the heartbeat of a registered rank.
func (s *Store) Ping() error {
	_, err := s.call(opPing, "", nil, 0)
	return err
}

// Goodbye tells the server that the registered rank leaves cleanly.
func (s *Store) Goodbye() error {
	_, err := s.call(opBye, "", nil, 0)
	return err
}

// encodeAbort and decodeAbort carry a *PeerError through the Store.
func encodeAbort(e *PeerError) []byte {
	return []byte(fmt.Sprintf("%d\x00%s\x00%s", e.Rank, e.Host, e.Err))
}

func decodeAbort(b []byte) *PeerError {
	parts := splitN(string(b), 3)
	r, err := strconv.Atoi(parts[0])
	if err != nil {
		r = -1
	}
	return &PeerError{Rank: r, Host: parts[1], Err: errors.New(parts[2])}
}

func splitN(s string, n int) []string {
	out := make([]string, 0, n)
	for len(out) < n-1 {
		i := 0
		for i < len(s) && s[i] != 0 {
			i++
		}
		out = append(out, s[:i])
		if i < len(s) {
			i++
		}
		s = s[i:]
	}
	return append(out, s)
}
