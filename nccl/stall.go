package nccl

import (
	"fmt"
	"strings"
	"sync"
	"time"
)

// A device wait (cuStreamSynchronize) on a stream where an NCCL operation
// waits for a live peer that never posts its call would never end: the
// heartbeat aborts NCCL only when a peer dies. The NCCL communicator
// therefore keeps, per stream, the operations posted since the host last
// saw the stream drained; a device that polls its stream (tensor/cuda's
// WatchWaits) reports a drained stream and, past WaitLimit, a stalled one:
// the job is then aborted (every NCCL communicator with ncclCommAbort) with
// a PeerError that names the operation and the peer it waited on.

// maxPostedKinds bounds the distinct operations kept per stream.
const maxPostedKinds = 8

// postedOp is one kind of NCCL operation posted on a stream: the call,
// its group and, for a point-to-point transfer, the peer (world rank).
type postedOp struct {
	what  string // "ncclAllReduce"
	group string // the group's id
	ranks []int  // world rank of each group rank
	me    int    // this rank's group rank
	peer  int    // world rank of the peer; -1 for a collective
	n     int    // times posted since the stream drained
}

// waiters are the world ranks the operation waits on.
func (op *postedOp) waiters() []int {
	if op.peer >= 0 {
		return []int{op.peer}
	}
	var w []int
	for i, r := range op.ranks {
		if i != op.me {
			w = append(w, r)
		}
	}
	return w
}

func (op *postedOp) String() string {
	s := fmt.Sprintf("%s of group %s (world ranks %s)", op.what, op.group, joinInts(op.ranks))
	if op.peer >= 0 {
		s = fmt.Sprintf("%s with rank %d of group %s", op.what, op.peer, op.group)
	}
	if op.n > 1 {
		s += fmt.Sprintf(" (%d times)", op.n)
	}
	return s
}

func joinInts(v []int) string {
	s := make([]string, len(v))
	for i, x := range v {
		s[i] = fmt.Sprint(x)
	}
	return strings.Join(s, ",")
}

// streamLog is the operations posted per stream since each last drained.
type streamLog struct {
	mu sync.Mutex
	m  map[uintptr][]*postedOp
}

// post records an operation posted on stream.
func (l *streamLog) post(stream uintptr, op postedOp) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.m == nil {
		l.m = map[uintptr][]*postedOp{}
	}
	ops := l.m[stream]
	for _, o := range ops {
		if o.what == op.what && o.group == op.group && o.peer == op.peer {
			o.n++
			return
		}
	}
	if len(ops) < maxPostedKinds {
		op.n = 1
		l.m[stream] = append(ops, &op)
	}
}

// drained forgets the operations of stream: the host saw them finish.
func (l *streamLog) drained(stream uintptr) {
	l.mu.Lock()
	delete(l.m, stream)
	l.mu.Unlock()
}

// pending are the operations of stream not known to be done, first posted
// first.
func (l *streamLog) pending(stream uintptr) []postedOp {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []postedOp
	for _, o := range l.m[stream] {
		out = append(out, *o)
	}
	return out
}

// stallError is the failure of a wait (where: "on the device", or "in the
// call" for a call that blocked the host) that passed limit with the
// operations pending: the first one's peer is the culprit (the operations
// run in order, and the first that has not finished holds the others
// back).
func stallError(self int, where string, waited time.Duration, pending []postedOp) *PeerError {
	if len(pending) == 0 {
		return &PeerError{Rank: self, Err: fmt.Errorf("%w: a device wait passed %v with no NCCL operation pending on its stream (a kernel that does not end?)", ErrTimeout, waited.Round(time.Millisecond))}
	}
	first := pending[0]
	w := first.waiters()
	who := fmt.Sprintf("rank %d", w[0])
	if len(w) > 1 {
		who = "one of ranks " + joinInts(w)
	}
	msg := fmt.Sprintf("%s waited %v %s for %s, which never posted its call", first.String(), waited.Round(time.Millisecond), where, who)
	if len(pending) > 1 {
		var rest []string
		for _, o := range pending[1:] {
			rest = append(rest, o.String())
		}
		msg += "; posted after it: " + strings.Join(rest, ", ")
	}
	return &PeerError{Rank: w[0], Err: fmt.Errorf("%w: %s", ErrTimeout, msg)}
}

// WaitLimit is how long a device wait on an NCCL stream may last: the
// job's comm timeout.
func (nc *ncclComm) WaitLimit() time.Duration { return nc.nd.o.Timeout }

// StreamDrained tells the job's NCCL communicators that the host saw
// stream finish everything posted on it so far.
func (nc *ncclComm) StreamDrained(stream uintptr) { nc.nd.streams.drained(stream) }

// StreamStalled aborts the job after a device wait on stream passed
// WaitLimit (waited): every NCCL communicator of the process is aborted
// and the error, the job's failure, names the first operation pending on
// the stream and the peer it waited on.
func (nc *ncclComm) StreamStalled(stream uintptr, waited time.Duration) error {
	nd := nc.nd
	return nd.fail(stallError(nd.o.Rank, "on the device", waited, nd.streams.pending(stream)))
}

// op describes operation what of this communicator (peer: a group rank,
// or -1 for a collective).
func (nc *ncclComm) op(what string, peer int) postedOp {
	op := postedOp{what: what, group: nc.id, ranks: nc.ranks, me: nc.rank, peer: -1, n: 1}
	if peer >= 0 {
		op.peer = nc.ranks[peer]
	}
	return op
}

// posted records a launched operation on stream for StreamStalled.
func (nc *ncclComm) posted(what string, stream uintptr, peer int) {
	nc.nd.streams.post(stream, nc.op(what, peer))
}

// bounded runs call, an NCCL call that may block the host (a
// point-to-point transfer connects to its peer on first use and waits for
// it, in the call or in ncclGroupEnd), and aborts the job when it has not
// returned within the comm timeout, naming it and the peer: the abort
// (ncclCommAbort) makes the call return.
func (nc *ncclComm) bounded(what string, peer int, call func() int32) int32 {
	start := time.Now()
	timer := time.AfterFunc(nc.nd.o.Timeout, func() {
		nc.nd.fail(stallError(nc.nd.o.Rank, "in the call", time.Since(start), []postedOp{nc.op(what, peer)}))
	})
	defer timer.Stop()
	return call()
}
