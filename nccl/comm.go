package nccl

import (
	"errors"
	"fmt"
	"math"
	"sync/atomic"
	"time"
)

// Op is the reduction applied by AllReduce and ReduceScatter.
type Op int

const (
	// Sum adds the contributions of all ranks.
	Sum Op = iota
	// Avg adds the contributions and divides by the group size.
	Avg
	// Max keeps the largest contribution.
	Max
	// SumBF16 is Sum of bfloat16 elements packed two to a float32 word
	// (the first in the low half): each pair added in float32 and rounded
	// to bfloat16 (to nearest even), rank after rank, as NCCL's bf16 sum
	// rounds each step. A host collective carries 2 bytes an element. (An
	// average scales each rank's elements by 1/n first, as NCCL's avg of
	// floating types does: parallel.Group does so.)
	SumBF16
)

// String returns the op's name ("sum", "avg", "max", "sum-bf16").
func (op Op) String() string {
	switch op {
	case Sum:
		return "sum"
	case Avg:
		return "avg"
	case Max:
		return "max"
	case SumBF16:
		return "sum-bf16"
	}
	return fmt.Sprintf("Op(%d)", int(op))
}

func (op Op) valid() error {
	if op < Sum || op > SumBF16 {
		return fmt.Errorf("unknown reduction %v: use nccl.Sum, nccl.Avg, nccl.Max or nccl.SumBF16", op)
	}
	return nil
}

// summing is the op that adds the contributions of an averaging op (whose
// division finish applies once at the end): Sum for Avg, else op.
func (op Op) summing() Op {
	if op == Avg {
		return Sum
	}
	return op
}

// packed says op reduces bfloat16 pairs packed in float32 words.
func (op Op) packed() bool { return op == SumBF16 }

// bf16Pair is a word's two packed bfloat16 elements as float32.
func bf16Pair(w float32) (lo, hi float32) {
	u := math.Float32bits(w)
	return math.Float32frombits(u << 16), math.Float32frombits(u & 0xffff0000)
}

// packBF16 rounds lo and hi to bfloat16 (to nearest, ties to even; a NaN
// stays a quiet NaN) and packs them into a word.
func packBF16(lo, hi float32) float32 {
	return math.Float32frombits(uint32(roundBF16(lo)) | uint32(roundBF16(hi))<<16)
}

func roundBF16(f float32) uint16 {
	u := math.Float32bits(f)
	if u&0x7fffffff > 0x7f800000 {
		return uint16(u>>16) | 0x40
	}
	return uint16((u + 0x7fff + (u>>16)&1) >> 16)
}

// Comm is a communicator: a group of ranks that run collectives together.
// Every member must call the same collectives in the same order with
// buffers of matching lengths. Ranks are numbered 0..Size()-1 within the
// group. A Comm is used by one goroutine at a time; different Comms (for
// example a tensor-parallel and a data-parallel group) are independent.
//
// Reductions are deterministic: every rank receives bit-identical results.
// A failed or stalled peer makes the call return an error (a *PeerError
// when the culprit is known) instead of blocking forever.
type Comm interface {
	// Rank is this process's rank in the group.
	Rank() int
	// Size is the number of ranks in the group.
	Size() int
	// AllReduce reduces buf element-wise over all ranks, in place.
	AllReduce(buf []float32, op Op) error
	// AllGather concatenates every rank's send, in rank order, into recv.
	// len(recv) must be Size()*len(send).
	AllGather(send, recv []float32) error
	// ReduceScatter reduces send element-wise over all ranks and leaves
	// block Rank() of the result in recv. len(send) must be Size()*len(recv).
	ReduceScatter(send, recv []float32, op Op) error
	// Broadcast copies root's buf into every other rank's buf.
	Broadcast(buf []float32, root int) error
	// Barrier returns once every rank has entered it.
	Barrier() error
	// Send sends buf to group rank to; the matching Recv must use the
	// same length.
	Send(buf []float32, to int) error
	// Recv fills buf with a message from group rank from.
	Recv(buf []float32, from int) error
	// Group makes a sub-communicator of the given ranks (numbered as in
	// this Comm, in the order given: ranks[i] becomes rank i). Every
	// listed rank must call Group with the same list; ranks not in the
	// list must not call it. Creating the same list twice gives two
	// independent communicators.
	Group(ranks []int) (Comm, error)
	// Stats is a snapshot of the calls, bytes and time spent in this
	// communicator's operations.
	Stats() Stats
	// Close releases the communicator. Groups made from it must be closed
	// first; the world communicator's Close also ends the rendezvous.
	Close() error
}

// DeviceComm is implemented by communicators that can run collectives and
// point-to-point transfers on GPU memory (the NCCL backend). Pointers are
// device addresses, count is in elements, stream is a cudaStream_t (0 for
// the default stream). Calls are asynchronous with respect to the host, as
// in NCCL.
type DeviceComm interface {
	Comm
	AllReduceDevice(sendbuf, recvbuf uintptr, count int, dt DataType, op Op, stream uintptr) error
	AllGatherDevice(sendbuf, recvbuf uintptr, sendcount int, dt DataType, stream uintptr) error
	ReduceScatterDevice(sendbuf, recvbuf uintptr, recvcount int, dt DataType, op Op, stream uintptr) error
	BroadcastDevice(sendbuf, recvbuf uintptr, count int, dt DataType, root int, stream uintptr) error
	// SendDevice sends count elements at buf to group rank peer, which
	// must call RecvDevice with the same count and type. The transfer
	// holds the stream until the peer's receive runs: two ranks that
	// exchange in both directions must order their calls so that each
	// send meets a posted receive (one sends first, the other receives
	// first), or they deadlock.
	SendDevice(buf uintptr, count int, dt DataType, peer int, stream uintptr) error
	// RecvDevice receives count elements from group rank peer into buf.
	RecvDevice(buf uintptr, count int, dt DataType, peer int, stream uintptr) error
	// SendRecvDevice sends count elements of sendType at sendbuf to peer
	// and receives count of recvType from it into recvbuf, both at once
	// (one NCCL group): the way two ranks exchange without ordering their
	// calls (a pipeline stage's bfloat16 activations one way, its float32
	// gradients the other).
	SendRecvDevice(sendbuf, recvbuf uintptr, count int, sendType, recvType DataType, peer int, stream uintptr) error
}

// DataType is the element type of a device buffer.
type DataType int

const (
	// Float32 is IEEE binary32.
	Float32 DataType = iota
	// BFloat16 is the upper half of a binary32 (bf16).
	BFloat16
	// Float16 is IEEE binary16.
	Float16
)

// OpStats counts one kind of operation.
type OpStats struct {
	Calls int64         // completed or failed calls
	Bytes int64         // bytes of the caller's buffer (the reduced or gathered result)
	Time  time.Duration // wall time spent inside the calls
}

// Stats counts the operations of one communicator. The training loop reads
// Total().Time as its comm_s.
type Stats struct {
	AllReduce     OpStats
	AllGather     OpStats
	ReduceScatter OpStats
	Broadcast     OpStats
	Barrier       OpStats
	Send          OpStats
	Recv          OpStats
}

// Total sums all kinds of operations.
func (s Stats) Total() OpStats {
	var t OpStats
	for _, o := range []OpStats{s.AllReduce, s.AllGather, s.ReduceScatter, s.Broadcast, s.Barrier, s.Send, s.Recv} {
		t.Calls += o.Calls
		t.Bytes += o.Bytes
		t.Time += o.Time
	}
	return t
}

// Sub returns s minus an earlier snapshot.
func (s Stats) Sub(prev Stats) Stats {
	d := func(a, b OpStats) OpStats { return OpStats{a.Calls - b.Calls, a.Bytes - b.Bytes, a.Time - b.Time} }
	return Stats{
		AllReduce:     d(s.AllReduce, prev.AllReduce),
		AllGather:     d(s.AllGather, prev.AllGather),
		ReduceScatter: d(s.ReduceScatter, prev.ReduceScatter),
		Broadcast:     d(s.Broadcast, prev.Broadcast),
		Barrier:       d(s.Barrier, prev.Barrier),
		Send:          d(s.Send, prev.Send),
		Recv:          d(s.Recv, prev.Recv),
	}
}

type opKind int

const (
	kAllReduce opKind = iota
	kAllGather
	kReduceScatter
	kBroadcast
	kBarrier
	kSend
	kRecv
	numKinds
)

// counters is the lock-free accumulator behind Stats.
type counters struct {
	calls, bytes, nanos [numKinds]atomic.Int64
}

func (c *counters) add(k opKind, bytes int, start time.Time) {
	c.calls[k].Add(1)
	c.bytes[k].Add(int64(bytes))
	c.nanos[k].Add(int64(time.Since(start)))
}

func (c *counters) snapshot() Stats {
	g := func(k opKind) OpStats {
		return OpStats{c.calls[k].Load(), c.bytes[k].Load(), time.Duration(c.nanos[k].Load())}
	}
	return Stats{g(kAllReduce), g(kAllGather), g(kReduceScatter), g(kBroadcast), g(kBarrier), g(kSend), g(kRecv)}
}

// PeerError reports a collective that failed because of another rank.
type PeerError struct {
	Rank int    // the culprit's rank in the world communicator
	Host string // its host, when known
	Err  error  // what was observed
}

// Error names the culprit and what was observed.
func (e *PeerError) Error() string {
	if e.Host != "" {
		return fmt.Sprintf("rank %d (%s): %v", e.Rank, e.Host, e.Err)
	}
	return fmt.Sprintf("rank %d: %v", e.Rank, e.Err)
}

// Unwrap returns the observed error (for errors.Is(err, ErrTimeout)).
func (e *PeerError) Unwrap() error { return e.Err }

// ErrClosed is returned by operations on a closed communicator.
var ErrClosed = errors.New("nccl: communicator closed")

// ErrTimeout is wrapped by errors of operations that ran past the timeout.
var ErrTimeout = errors.New("timed out")

// checkGroup validates a Group rank list against a parent of size n and
// returns the position of me in it (-1 if absent).
func checkGroup(ranks []int, n, me int) (int, error) {
	if len(ranks) == 0 {
		return -1, errors.New("nccl: Group of no ranks: list at least one rank")
	}
	seen := make(map[int]bool, len(ranks))
	pos := -1
	for i, r := range ranks {
		if r < 0 || r >= n {
			return -1, fmt.Errorf("nccl: Group rank %d out of range [0,%d)", r, n)
		}
		if seen[r] {
			return -1, fmt.Errorf("nccl: Group lists rank %d twice", r)
		}
		seen[r] = true
		if r == me {
			pos = i
		}
	}
	if pos < 0 {
		return -1, fmt.Errorf("nccl: rank %d called Group(%v) but is not in it", me, ranks)
	}
	return pos, nil
}

// checkAllGather and checkReduceScatter validate the buffer lengths.
func checkAllGather(send, recv []float32, n int) error {
	if len(recv) != n*len(send) {
		return fmt.Errorf("nccl: AllGather recv has %d elements, want %d (size %d x send %d)", len(recv), n*len(send), n, len(send))
	}
	return nil
}

func checkReduceScatter(send, recv []float32, n int) error {
	if len(send) != n*len(recv) {
		return fmt.Errorf("nccl: ReduceScatter send has %d elements, want %d (size %d x recv %d)", len(send), n*len(recv), n, len(recv))
	}
	return nil
}

func checkRank(what string, r, n int) error {
	if r < 0 || r >= n {
		return fmt.Errorf("nccl: %s rank %d out of range [0,%d)", what, r, n)
	}
	return nil
}

// reduceInto folds src into dst with op (Avg folds as Sum; the division is
// applied once at the end by finish).
func reduceInto(dst, src []float32, op Op) {
	if op.packed() {
		reducePacked(dst, src)
		return
	}
	src = src[:len(dst)]
	if op == Max {
		for i, v := range src {
			if v > dst[i] {
				dst[i] = v
			}
		}
		return
	}
	for i, v := range src {
		dst[i] += v
	}
}

// reducePacked folds src into dst as packed bfloat16 pairs (SumBF16):
// each half added in float32 and rounded.
func reducePacked(dst, src []float32) {
	src = src[:len(dst)]
	for i, v := range src {
		a0, a1 := bf16Pair(dst[i])
		b0, b1 := bf16Pair(v)
		dst[i] = packBF16(a0+b0, a1+b1)
	}
}

// finish applies the Avg division.
func finish(buf []float32, op Op, n int) {
	if op != Avg || n == 1 {
		return
	}
	d := float32(n)
	for i := range buf {
		buf[i] /= d
	}
}

// reduceSlots sets out to srcs[0] op srcs[1] op ... op srcs[k-1], folded
// left to right (so the bits equal a serial loop over ranks), reading each
// source once and writing out in as few passes as possible.
func reduceSlots(out []float32, srcs [][]float32, op Op) {
	n := len(out)
	if len(srcs) == 0 {
		return
	}
	if op.packed() {
		copy(out, srcs[0][:n])
		for _, src := range srcs[1:] {
			reducePacked(out, src[:n])
		}
		return
	}
	first := true
	for len(srcs) > 0 {
		k := min(len(srcs), 3)
		if first {
			k = min(len(srcs), 4)
		}
		s := srcs[:k]
		srcs = srcs[k:]
		if op == Max {
			if first {
				copy(out, s[0][:n])
				s = s[1:]
			}
			for _, src := range s {
				reduceInto(out, src[:n], op)
			}
			first = false
			continue
		}
		switch {
		case first && k == 1:
			copy(out, s[0][:n])
		case first && k == 2:
			a, b := s[0][:n], s[1][:n]
			for i := range out {
				out[i] = a[i] + b[i]
			}
		case first && k == 3:
			a, b, c := s[0][:n], s[1][:n], s[2][:n]
			for i := range out {
				out[i] = a[i] + b[i] + c[i]
			}
		case first && k == 4:
			a, b, c, d := s[0][:n], s[1][:n], s[2][:n], s[3][:n]
			for i := range out {
				out[i] = a[i] + b[i] + c[i] + d[i]
			}
		case k == 1:
			a := s[0][:n]
			for i := range out {
				out[i] += a[i]
			}
		case k == 2:
			a, b := s[0][:n], s[1][:n]
			for i := range out {
				out[i] = out[i] + a[i] + b[i]
			}
		default:
			a, b, c := s[0][:n], s[1][:n], s[2][:n]
			for i := range out {
				out[i] = out[i] + a[i] + b[i] + c[i]
			}
		}
		first = false
	}
}
