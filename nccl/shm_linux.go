package nccl

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"strconv"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"
)

// The shared-memory path serves groups whose ranks all run on one host. The
// group's rank 0 creates a file in /dev/shm that every member maps (and
// rank 0 unlinks as soon as all have it, so nothing is left behind even
// if the job dies). Each rank owns a slot of slotElems floats in each of
// three slot sets; a collective moves data in chunks of at most a slot:
// each rank copies its chunk into its slot, then every rank reduces or
// gathers straight out of the others' slots. Ranks meet at phases: a rank
// arrives by storing its phase number, and waits until every rank's number
// is at least its own, spinning briefly (yielding the CPU) and then
// sleeping on a futex.
//
// Chunks rotate through the sets, and every chunk has at least one phase
// after its copy-in, which every rank reaches only once done with the
// chunks before. So the set of chunk j is free again once a rank has passed
// the phases of chunks j-2 and j-1: a rank may copy chunk j+1 in while
// others still copy chunk j-1 out, which lets the all-reduce merge the
// "reduced" phase of one chunk with the "copied in" phase of the next.
//
// Reductions add the slots in rank order 0..n-1, and each segment is
// reduced by one rank only: every rank gets the same bits.

const (
	slotElems = 128 << 10
	line      = 64
	spinLimit = 200
	sets      = 3
)

// splitPartBytes is the most that hierSplit hands its peers in one call
// at ranks ranks a host: a rank's segment of one chunk (allReduceOwn).
func splitPartBytes(ranks int) int { return 4 * (slotElems / ranks) }

// At 2 ranks a host a whole chunk's part is large enough for scatter
// (useHierSplit's range between three hosts depends on it).
var _ [4*(slotElems/2) - scatterBytes]struct{}

// A chunk of the pipelined hierarchical all-reduce (at most
// hierChunkElems plus one element per host, for up to 64 Ki hosts) fits a
// slot.
var _ [slotElems - hierChunkElems - 64<<10]struct{}

// A buffer of hierSmall (hierRootBytes over at least 2 ranks) fits a slot.
var _ [4*slotElems - hierRootBytes/2]struct{}

type shmGroup struct {
	c       *tcpComm
	n, me   int
	mem     []byte
	hdr     int    // bytes of header before the slots
	prog    int    // offset of the progress word (hierAdd)
	landed  uint64 // elements landed by hierAdd so far
	phase   uint32
	chunk   int // chunks run so far: chunk j uses set j%sets
	aborted atomic.Bool
}

func shmName(c *tcpComm) string {
	h := sha256.Sum256([]byte(c.nd.o.Token + "\x00" + c.nd.o.MasterAddr + ":" + strconv.Itoa(c.nd.o.MasterPort) + "\x00" + c.id))
	return "/dev/shm/hpcrun-nccl-" + hex.EncodeToString(h[:8])
}

// newShmGroup maps the group's shared file; every member calls it, and
// either all get a group or all get an error.
func newShmGroup(c *tcpComm) (*shmGroup, error) {
	g := &shmGroup{c: c, n: c.n, me: c.rank}
	g.prog = (line*(g.n+2) + 8*g.n + sets*g.n*16 + line - 1) &^ (line - 1)
	g.hdr = (g.prog + line + 4095) &^ 4095
	size := g.hdr + sets*g.n*slotElems*4
	name := shmName(c)
	var err error
	if c.rank == 0 {
		err = g.mmap(name, size, true)
	}
	ok := func(err error) error {
		flag := []float32{0}
		if err != nil {
			flag[0] = 1
		}
		if e := c.ring(flag, func(i int) (int, int) { return segment(1, c.n, i) }, 0, true, true, Max, header('Z', Max, 1)); e != nil {
			return e
		}
		if flag[0] != 0 {
			if err != nil {
				return err
			}
			return errors.New("a peer could not map the shared file")
		}
		return nil
	}
	if err = ok(err); err != nil {
		g.close()
		return nil, err
	}
	if c.rank != 0 {
		err = g.mmap(name, size, false)
	}
	if err == nil {
		*g.u64(line*(g.n+2) + 8*g.me) = uint64(os.Getpid())
	}
	err = ok(err)
	if c.rank == 0 {
		os.Remove(name)
	}
	if err != nil {
		g.close()
		return nil, err
	}
	c.nd.mu.Lock()
	c.nd.shms[g] = true
	c.nd.mu.Unlock()
	return g, nil
}

func (g *shmGroup) mmap(name string, size int, create bool) error {
	flags := os.O_RDWR
	if create {
		// Never truncate a file someone maps (that would be their SIGBUS):
		// a leftover name is unlinked and made anew.
		flags |= os.O_CREATE | os.O_EXCL
	}
	f, err := os.OpenFile(name, flags, 0o600)
	if create && errors.Is(err, os.ErrExist) {
		os.Remove(name)
		f, err = os.OpenFile(name, flags, 0o600)
	}
	if err != nil {
		return err
	}
	defer f.Close()
	if create {
		// Reserve the pages now: a full /dev/shm must be an error here,
		// not a SIGBUS in the middle of a collective.
		if err := syscall.Fallocate(int(f.Fd()), 0, 0, int64(size)); err != nil {
			return fmt.Errorf("reserve %d bytes in %s: %w", size, name, err)
		}
	}
	g.mem, err = syscall.Mmap(int(f.Fd()), 0, size, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_SHARED)
	if err != nil {
		return fmt.Errorf("mmap %s: %w", name, err)
	}
	return nil
}

func (g *shmGroup) close() {
	if g.mem != nil {
		g.c.nd.mu.Lock()
		delete(g.c.nd.shms, g)
		g.c.nd.mu.Unlock()
		syscall.Munmap(g.mem)
		g.mem = nil
	}
}

func (g *shmGroup) u32(off int) *uint32 { return (*uint32)(unsafe.Pointer(&g.mem[off])) }
func (g *shmGroup) u64(off int) *uint64 { return (*uint64)(unsafe.Pointer(&g.mem[off])) }
func (g *shmGroup) futex() *uint32      { return g.u32(line * g.n) }
func (g *shmGroup) sleepers() *uint32   { return g.u32(line * (g.n + 1)) }

// slot is rank r's slot in the current chunk's set.
func (g *shmGroup) slot(r int) []float32 { return g.slotOf(g.chunk, r) }

// slotOf is rank r's slot in chunk j's set.
func (g *shmGroup) slotOf(j, r int) []float32 {
	off := g.hdr + ((j%sets)*g.n+r)*slotElems*4
	return unsafe.Slice((*float32)(unsafe.Pointer(&g.mem[off])), slotElems)
}

// meta is rank r's description of the current operation in this set.
func (g *shmGroup) meta(r int) []byte {
	off := line*(g.n+2) + 8*g.n + ((g.chunk%sets)*g.n+r)*16
	return g.mem[off : off+16]
}

func futexWait(addr *uint32, val uint32, d time.Duration) {
	ts := syscall.NsecToTimespec(int64(d))
	syscall.Syscall6(syscall.SYS_FUTEX, uintptr(unsafe.Pointer(addr)), 0 /* FUTEX_WAIT */, uintptr(val),
		uintptr(unsafe.Pointer(&ts)), 0, 0)
}

// yield gives the core to another runnable thread (a peer rank when ranks
// outnumber cores). It is a raw system call on purpose: through
// syscall.Syscall the runtime marks the goroutine as in a system call, and
// when the yield lasts past one sysmon tick (20 us; a peer's time slice is
// longer) sysmon retakes the P if no other P is idle, which under
// GOMAXPROCS=1 (what slurm.Tasks gives each of n ranks on fewer than 2n
// cores) is every time: it wakes a spinning M for the P, and the yielding
// thread must take the P back on exitsyscall's slow path. Measured with 4
// ranks on 2 cores: 4x the context switches, 2x the CPU time and half the
// bus bandwidth. sched_yield never blocks, so the raw call holds the P only
// for the peer's time slice.
func yield() { syscall.RawSyscall(syscall.SYS_SCHED_YIELD, 0, 0, 0) }

func futexWake(addr *uint32) {
	syscall.Syscall6(syscall.SYS_FUTEX, uintptr(unsafe.Pointer(addr)), 1 /* FUTEX_WAKE */, 1<<30, 0, 0, 0)
}

func (g *shmGroup) wakeAll() {
	g.aborted.Store(true)
	if g.mem != nil {
		atomic.AddUint32(g.futex(), 1)
		futexWake(g.futex())
	}
}

func (g *shmGroup) arrive() {
	g.phase++
	atomic.StoreUint32(g.u32(line*g.me), g.phase)
	atomic.AddUint32(g.futex(), 1)
	if atomic.LoadUint32(g.sleepers()) > 0 {
		futexWake(g.futex())
	}
}

// laggard returns the first rank that has not reached this phase, or -1.
func (g *shmGroup) laggard() int {
	for r := range g.n {
		if int32(atomic.LoadUint32(g.u32(line*r))-g.phase) < 0 {
			return r
		}
	}
	return -1
}

// sync arrives at the next phase and waits for every rank to reach it.
func (g *shmGroup) sync() error {
	g.arrive()
	return g.wait(g.laggard)
}

// wait waits until laggard finds no rank to wait for (-1), spinning then
// sleeping on the futex; a rank that changes what laggard reads wakes it
// as arrive does.
func (g *shmGroup) wait(laggard func() int) error {
	start := time.Now()
	for spins := 0; ; spins++ {
		if laggard() < 0 {
			return nil
		}
		if g.aborted.Load() {
			if err := g.c.nd.abortErr(); err != nil {
				return err
			}
			return ErrClosed
		}
		if spins < spinLimit {
			// Ranks may outnumber cores: let a peer run rather than spin.
			yield()
			continue
		}
		gen := atomic.LoadUint32(g.futex())
		atomic.AddUint32(g.sleepers(), 1)
		if laggard() >= 0 {
			futexWait(g.futex(), gen, 50*time.Millisecond)
		}
		atomic.AddUint32(g.sleepers(), ^uint32(0))
		if r := laggard(); r >= 0 && time.Since(start) > g.c.nd.o.Timeout {
			w := g.c.ranks[r]
			return g.c.nd.fail(&PeerError{Rank: w, Host: g.c.nd.peer(w).host,
				Err: fmt.Errorf("%w after %v waiting for it in shared memory (stalled?)", ErrTimeout, g.c.nd.o.Timeout)})
		}
	}
}

// progress is the number of elements group rank 0 has landed in shared
// memory since the group began (hierAdd), published by land.
func (g *shmGroup) progress() *uint64 { return g.u64(g.prog) }

// land publishes that rank 0 has landed k elements in all.
func (g *shmGroup) land(k uint64) {
	atomic.StoreUint64(g.progress(), k)
	atomic.AddUint32(g.futex(), 1)
	if atomic.LoadUint32(g.sleepers()) > 0 {
		futexWake(g.futex())
	}
}

// awaitLanded waits until rank 0 has landed more than k elements in all,
// and returns how many.
func (g *shmGroup) awaitLanded(k uint64) (uint64, error) {
	var got uint64
	err := g.wait(func() int {
		if got = atomic.LoadUint64(g.progress()); got > k {
			return -1
		}
		return 0
	})
	return got, err
}

// holds says whether count elements fit one set of slots.
func (g *shmGroup) holds(count int) bool { return count <= g.n*slotElems }

// landing takes the current set's slots, one after the other, for count
// elements (at most n*slotElems) that rank 0 lands there, and returns
// them with the elements landed before. The set is free, as for any
// chunk, and stays so until every rank has passed the next phase: the
// others read it before they get there.
func (g *shmGroup) landing(count int) ([]float32, uint64) {
	off := g.hdr + (g.chunk%sets)*g.n*slotElems*4
	g.chunk++
	base := g.landed
	g.landed += uint64(count)
	return unsafe.Slice((*float32)(unsafe.Pointer(&g.mem[off])), count), base
}

// begin writes this rank's description of the operation into the current
// set; check compares everyone's after the first phase.
func (g *shmGroup) begin(kind byte, op Op, count int) {
	m := g.meta(g.me)
	m[0] = kind
	*(*uint16)(unsafe.Pointer(&m[2])) = uint16(op)
	*(*uint64)(unsafe.Pointer(&m[8])) = uint64(count)
}

func (g *shmGroup) check() error {
	mine := g.meta(g.me)
	for r := range g.n {
		if m := g.meta(r); string(m) != string(mine) {
			return fmt.Errorf("nccl: group rank %d called %s but rank %d called %s",
				g.me, describe(mine[0], *(*uint16)(unsafe.Pointer(&mine[2])), *(*uint64)(unsafe.Pointer(&mine[8]))),
				r, describe(m[0], *(*uint16)(unsafe.Pointer(&m[2])), *(*uint64)(unsafe.Pointer(&m[8]))))
		}
	}
	return nil
}

// allReduce runs chunk j's reduction in the same phase interval as chunk
// j+1's copy-in and chunk j-1's copy-out: one phase per chunk, plus one.
// Rank r reduces segment r of each chunk from all slots (its own part
// straight from buf), publishes it in its slot, and copies the others'
// segments out once they are published.
func (g *shmGroup) allReduce(buf []float32, op Op) error {
	return g.allReduceOwn(buf, op, nil)
}

// allReduceOwn is allReduce that hands own each segment this rank has
// reduced, in its slot, before the others copy it out (hierSplit); own
// may be nil.
func (g *shmGroup) allReduceOwn(buf []float32, op Op, own func(seg []float32) error) error {
	base := g.chunk
	nch := max(1, (len(buf)+slotElems-1)/slotElems)
	span := func(j int) (off, cl int) {
		off = j * slotElems
		return off, min(slotElems, len(buf)-off)
	}
	copyIn := func(j int) {
		off, cl := span(j)
		mine := g.slotOf(base+j, g.me)
		lo, hi := segment(cl, g.n, g.me) // only this rank reads its own part
		copy(mine[:lo], buf[off:off+lo])
		copy(mine[hi:cl], buf[off+hi:off+cl])
	}
	copyOut := func(j int) {
		off, cl := span(j)
		for r := range g.n {
			if r != g.me {
				lo, hi := segment(cl, g.n, r)
				copy(buf[off+lo:off+hi], g.slotOf(base+j, r)[lo:hi])
			}
		}
	}
	srcs := make([][]float32, g.n)
	reduce := func(j int) error {
		off, cl := span(j)
		lo, hi := segment(cl, g.n, g.me)
		for r := range srcs {
			srcs[r] = g.slotOf(base+j, r)[lo:hi]
		}
		srcs[g.me] = buf[off+lo : off+hi]
		out := g.slotOf(base+j, g.me)[lo:hi]
		reduceSlots(out, srcs, op)
		finish(out, op, g.n)
		if own != nil {
			if err := own(out); err != nil {
				return err
			}
		}
		copy(buf[off+lo:off+hi], out)
		return nil
	}

	g.begin('R', op, len(buf))
	copyIn(0)
	if err := g.sync(); err != nil {
		return err
	}
	if err := g.check(); err != nil {
		g.chunk++
		return err
	}
	for j := range nch {
		if j > 0 {
			copyOut(j - 1)
		}
		if err := reduce(j); err != nil {
			g.chunk = base + nch
			return err
		}
		if j+1 < nch {
			copyIn(j + 1)
		}
		if err := g.sync(); err != nil {
			return err
		}
	}
	copyOut(nch - 1)
	g.chunk = base + nch
	return nil
}

// reduceOnePhase is the all-reduce of a buffer that fits a slot, in one
// phase: every rank copies its whole buffer into its slot and, once all
// have, reduces all slots in rank order into its buffer (all), or only
// group rank 0 does (a reduce to rank 0, for the hierarchical path). Every
// rank reads n slots where allReduce reads one, but waits for its peers
// once instead of twice: below smallShmBytes, where waiting costs more
// than reading, it is the faster path. The fold is reduceSlots' as in
// allReduce, so the bits are the same.
func (g *shmGroup) reduceOnePhase(buf []float32, op Op, all bool) error {
	g.begin('R', op, len(buf))
	copy(g.slot(g.me), buf)
	err := g.sync()
	if err == nil {
		err = g.check()
	}
	if err == nil && (all || g.me == 0) {
		srcs := make([][]float32, g.n)
		for r := range srcs {
			srcs[r] = g.slot(r)[:len(buf)]
		}
		reduceSlots(buf, srcs, op)
		finish(buf, op, g.n)
	}
	g.chunk++
	return err
}

// reduceBroadcast is one phase of the pipelined hierarchical all-reduce
// (hier.go): it reduces buf's spans red to group rank 0 as reduceOnePhase
// does, and copies rank 0's spans bc into the others' buf, as broadcast
// does; either may be empty. Rank 0 reads its own part of red from buf
// and hands bc over in its slot; the others put red in theirs.
func (g *shmGroup) reduceBroadcast(buf []float32, red, bc []span, op Op) error {
	g.begin('R', op, spansLen(red)+spansLen(bc))
	if g.me == 0 {
		pack(g.slot(0), buf, bc)
	} else {
		pack(g.slot(g.me), buf, red)
	}
	err := g.sync()
	if err == nil {
		err = g.check()
	}
	switch {
	case err != nil:
	case g.me == 0:
		srcs := make([][]float32, g.n)
		off := 0
		for _, s := range red {
			out := buf[s.lo:s.hi]
			for r := range srcs {
				srcs[r] = g.slot(r)[off : off+len(out)]
			}
			srcs[0] = out
			reduceSlots(out, srcs, op)
			off += len(out)
		}
	default:
		unpack(buf, g.slot(0), bc)
	}
	g.chunk++
	return err
}

func (g *shmGroup) allGather(send, recv []float32) error {
	b := len(send)
	for off, first := 0, true; first || off < b; off, first = off+slotElems, false {
		cl := min(slotElems, b-off)
		if first {
			g.begin('G', Sum, b)
		}
		copy(g.slot(g.me), send[off:off+cl])
		if err := g.sync(); err != nil {
			return err
		}
		if first {
			if err := g.check(); err != nil {
				g.chunk++
				return err
			}
		}
		for r := range g.n {
			if r != g.me {
				copy(recv[r*b+off:r*b+off+cl], g.slot(r))
			}
		}
		g.chunk++
	}
	return nil
}

func (g *shmGroup) reduceScatter(send, recv []float32, op Op) error {
	b := len(recv)
	per := slotElems / g.n
	for off, first := 0, true; first || off < b; off, first = off+per, false {
		cl := min(per, b-off)
		if first {
			g.begin('S', op, len(send))
		}
		mine := g.slot(g.me)
		for r := range g.n {
			copy(mine[r*cl:(r+1)*cl], send[r*b+off:r*b+off+cl])
		}
		if err := g.sync(); err != nil {
			return err
		}
		if first {
			if err := g.check(); err != nil {
				g.chunk++
				return err
			}
		}
		g.reduce(recv[off:off+cl], g.me*cl, op)
		g.chunk++
	}
	return nil
}

// reduce sets out to the reduction over all slots of the len(out)
// elements at off.
func (g *shmGroup) reduce(out []float32, off int, op Op) {
	srcs := make([][]float32, g.n)
	for r := range srcs {
		srcs[r] = g.slot(r)[off : off+len(out)]
	}
	reduceSlots(out, srcs, op)
	finish(out, op, g.n)
}

func (g *shmGroup) broadcast(buf []float32, root int) error {
	for off, first := 0, true; first || off < len(buf); off, first = off+slotElems, false {
		cl := min(slotElems, len(buf)-off)
		if first {
			g.begin('B', Op(root), len(buf))
		}
		if g.me == root {
			copy(g.slot(g.me), buf[off:off+cl])
		}
		if err := g.sync(); err != nil {
			return err
		}
		if first {
			if err := g.check(); err != nil {
				g.chunk++
				return err
			}
		}
		if g.me != root {
			copy(buf[off:off+cl], g.slot(root))
		}
		g.chunk++
	}
	return nil
}

func (g *shmGroup) barrier() error {
	g.begin('Z', Sum, 0)
	err := g.sync()
	if err == nil {
		err = g.check()
	}
	g.chunk++
	return err
}
