package cuda

import (
	"errors"
	"math/bits"
	"sort"
)

// allocator is a caching device allocator: freed blocks go to a free list
// per size class and are handed out again, so a training loop that
// allocates the same shapes every step calls cuMemAlloc only in its first.
// Reuse is safe without events because every kernel runs on the device's
// one stream: work enqueued after a Free that touches a reused block runs
// after the work that used it before.
//
// Accounting: cur counts the bytes callers asked for (as on the CPU
// device); peak is the most of cur plus the kernels' scratch (work) at
// once; reserved counts what is held from the driver, cached blocks
// included.
type allocator struct {
	raw     func(bytes int64) (uintptr, error) // cuMemAlloc
	release func(ptr uintptr) error            // cuMemFree
	sync    func() error                       // waits for the stream before blocks go back to the driver

	free  map[int64][]uintptr // size class -> cached blocks
	live  map[uintptr]block   // blocks handed out
	cur   int64
	peak  int64 // most cur+work
	work  int64 // the kernels' scratch (workspace), outside cur
	held  int64 // reserved: live and cached blocks
	stats AllocStats
}

type block struct {
	class int64 // bytes of the block
	asked int64 // bytes asked for
}

// AllocStats counts the caching allocator's work.
type AllocStats struct {
	Current  int64 // bytes of live tensors (as asked for)
	Peak     int64 // most Current plus Workspace at once since the device was opened or ResetPeak
	Reserved int64 // bytes held from the driver: live blocks and cached free ones
	Mallocs  int64 // cuMemAlloc calls
	Reuses   int64 // allocations served from the cache
	Releases int64 // cuMemFree calls (EmptyCache, or retrying after out of memory)
	// Workspace is the kernels' own device scratch (bf16 operands,
	// reduction partials, staged ids), outside Current and Reserved.
	Workspace int64
}

const (
	smallLimit = 1 << 20 // below: classes are multiples of 512 bytes
	smallQuant = 512
)

// sizeClass rounds bytes up to its class: a multiple of 512 below 1 MiB,
// above it one of four steps per power of two (at most 25% waste).
func sizeClass(bytes int64) int64 {
	if bytes <= 0 {
		return 0
	}
	if bytes < smallLimit {
		return (bytes + smallQuant - 1) / smallQuant * smallQuant
	}
	e := 63 - bits.LeadingZeros64(uint64(bytes)) // 2^e <= bytes < 2^(e+1)
	step := int64(1) << (e - 2)
	return (bytes + step - 1) / step * step
}

// workspace counts delta bytes of scratch taken (or, negative, given back)
// straight from the driver: outside cur, inside peak.
func (a *allocator) workspace(delta int64) {
	a.work += delta
	a.peak = max(a.peak, a.cur+a.work)
}

func newAllocator(raw func(int64) (uintptr, error), release func(uintptr) error, sync func() error) *allocator {
	return &allocator{raw: raw, release: release, sync: sync, free: map[int64][]uintptr{}, live: map[uintptr]block{}}
}

// alloc returns a block of at least bytes (> 0). On out-of-memory it
// returns the cache to the driver and tries once more.
func (a *allocator) alloc(bytes int64) (uintptr, error) {
	class := sizeClass(bytes)
	var p uintptr
	if fl := a.free[class]; len(fl) > 0 {
		p = fl[len(fl)-1]
		a.free[class] = fl[:len(fl)-1]
		a.stats.Reuses++
	} else {
		var err error
		p, err = a.raw(class)
		if err != nil && errors.Is(err, ErrOutOfMemory) && a.cached() > 0 {
			if rerr := a.emptyCache(); rerr != nil {
				return 0, rerr
			}
			p, err = a.raw(class)
		}
		if err != nil {
			return 0, err
		}
		a.stats.Mallocs++
		a.held += class
	}
	a.live[p] = block{class: class, asked: bytes}
	a.cur += bytes
	a.peak = max(a.peak, a.cur+a.work)
	return p, nil
}

// freeBlock puts p back in its class's free list.
func (a *allocator) freeBlock(p uintptr) {
	b, ok := a.live[p]
	if !ok {
		panic("cuda: free of a block the allocator did not hand out")
	}
	delete(a.live, p)
	a.cur -= b.asked
	a.free[b.class] = append(a.free[b.class], p)
}

// cached is the bytes held in free lists.
func (a *allocator) cached() int64 {
	var n int64
	for class, fl := range a.free {
		n += class * int64(len(fl))
	}
	return n
}

// emptyCache waits for the stream, then returns every cached block to the
// driver.
func (a *allocator) emptyCache() error {
	if a.cached() == 0 {
		return nil
	}
	if err := a.sync(); err != nil {
		return err
	}
	classes := make([]int64, 0, len(a.free))
	for c := range a.free {
		classes = append(classes, c)
	}
	sort.Slice(classes, func(i, j int) bool { return classes[i] < classes[j] })
	var first error
	for _, c := range classes {
		for _, p := range a.free[c] {
			if err := a.release(p); err != nil && first == nil {
				first = err
			}
			a.held -= c
			a.stats.Releases++
		}
		delete(a.free, c)
	}
	return first
}

// releaseAll returns live and cached blocks to the driver (Close).
func (a *allocator) releaseAll() error {
	for p, b := range a.live {
		a.free[b.class] = append(a.free[b.class], p)
		delete(a.live, p)
	}
	a.cur = 0
	return a.emptyCache()
}

func (a *allocator) snapshot() AllocStats {
	s := a.stats
	s.Current, s.Peak, s.Reserved = a.cur, a.peak, a.held
	return s
}
