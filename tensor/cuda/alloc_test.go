package cuda

import (
	"strings"
	"testing"
)

// fakeDriver hands out increasing addresses and can run out of memory.
type fakeDriver struct {
	next     uintptr
	held     int64
	limit    int64
	mallocs  int
	releases int
	syncs    int
}

func (f *fakeDriver) raw(bytes int64) (uintptr, error) {
	if f.limit > 0 && f.held+bytes > f.limit {
		return 0, &Error{Call: "cuMemAlloc_v2", Code: 2, Name: "CUDA_ERROR_OUT_OF_MEMORY"}
	}
	f.next += 1 << 32
	f.held += bytes
	f.mallocs++
	return f.next, nil
}

func newFake(limit int64) (*fakeDriver, *allocator) {
	f := &fakeDriver{limit: limit}
	sizes := map[uintptr]int64{}
	a := newAllocator(func(b int64) (uintptr, error) {
		p, err := f.raw(b)
		if err == nil {
			sizes[p] = b
		}
		return p, err
	}, func(p uintptr) error {
		f.held -= sizes[p]
		delete(sizes, p)
		f.releases++
		return nil
	}, func() error { f.syncs++; return nil })
	return f, a
}

func TestSizeClass(t *testing.T) {
	for _, tt := range []struct{ in, want int64 }{
		{1, 512}, {512, 512}, {513, 1024}, {1<<20 - 1, 1 << 20}, {1 << 20, 1 << 20},
		{1<<20 + 1, 1<<20 + 1<<18}, {3 << 20, 3 << 20}, {(3 << 20) + 1, 3<<20 + 1<<19}, {7 << 30, 7 << 30},
	} {
		if got := sizeClass(tt.in); got != tt.want {
			t.Errorf("sizeClass(%d) = %d, want %d", tt.in, got, tt.want)
		}
		if got := sizeClass(tt.in); got < tt.in || (tt.in >= smallLimit && float64(got) > 1.25*float64(tt.in)) {
			t.Errorf("sizeClass(%d) = %d: outside [n, 1.25n]", tt.in, got)
		}
	}
}

// A training loop that frees and allocates the same shapes every step
// calls the driver only in its first step; accounting counts what was asked.
func TestAllocatorReusesAndAccounts(t *testing.T) {
	f, a := newFake(0)
	sizes := []int64{4, 3000, 768 * 4, 50257 * 768 * 4, 1 << 20}
	var total int64
	for _, s := range sizes {
		total += s
	}
	for step := 0; step < 3; step++ {
		var ps []uintptr
		for _, s := range sizes {
			p, err := a.alloc(s)
			if err != nil {
				t.Fatal(err)
			}
			ps = append(ps, p)
		}
		if a.cur != total || a.peak != total {
			t.Fatalf("step %d: cur %d peak %d, want %d", step, a.cur, a.peak, total)
		}
		for _, p := range ps {
			a.freeBlock(p)
		}
		if a.cur != 0 {
			t.Fatalf("step %d: cur %d after freeing everything", step, a.cur)
		}
	}
	s := a.snapshot()
	if f.mallocs != len(sizes) || s.Mallocs != int64(len(sizes)) || s.Reuses != 2*int64(len(sizes)) {
		t.Errorf("mallocs %d (stats %d), reuses %d: want %d mallocs and %d reuses", f.mallocs, s.Mallocs, s.Reuses, len(sizes), 2*len(sizes))
	}
	if s.Reserved != f.held || s.Reserved < total {
		t.Errorf("reserved %d, driver holds %d, asked %d", s.Reserved, f.held, total)
	}
	if err := a.emptyCache(); err != nil {
		t.Fatal(err)
	}
	if f.held != 0 || a.snapshot().Reserved != 0 || f.releases != len(sizes) || f.syncs != 1 {
		t.Errorf("after emptyCache: driver holds %d, reserved %d, %d releases, %d syncs", f.held, a.snapshot().Reserved, f.releases, f.syncs)
	}
}

// Two live blocks of one class are distinct; a freed one is reused first.
func TestAllocatorDistinctBlocks(t *testing.T) {
	_, a := newFake(0)
	p1, _ := a.alloc(1000)
	p2, _ := a.alloc(1000)
	if p1 == p2 {
		t.Fatal("two live blocks share an address")
	}
	a.freeBlock(p1)
	p3, _ := a.alloc(600) // same 1024-byte class
	if p3 != p1 {
		t.Errorf("freed block %x not reused, got %x", p1, p3)
	}
	if a.cur != 1600 || a.peak != 2000 {
		t.Errorf("cur %d peak %d, want 1600 and 2000", a.cur, a.peak)
	}
}

// Out of memory with blocks cached: the cache goes back to the driver and
// the allocation is retried; without a cache the error comes back.
func TestAllocatorOutOfMemoryRetries(t *testing.T) {
	f, a := newFake(4 << 20)
	p, err := a.alloc(3 << 20)
	if err != nil {
		t.Fatal(err)
	}
	a.freeBlock(p)
	if _, err := a.alloc(2 << 20); err != nil { // another class: needs the cached 3 MiB back
		t.Fatalf("alloc after freeing: %v", err)
	}
	if f.releases != 1 {
		t.Errorf("%d releases, want the cached block released once", f.releases)
	}
	_, err = a.alloc(3 << 20)
	if err == nil {
		t.Fatal("allocating past the limit succeeded")
	}
	if want := "CUDA_ERROR_OUT_OF_MEMORY"; !strings.Contains(err.Error(), want) {
		t.Errorf("error %q does not name %s", err, want)
	}
}

func TestAllocatorDoubleFreePanics(t *testing.T) {
	_, a := newFake(0)
	p, _ := a.alloc(10)
	a.freeBlock(p)
	defer func() {
		if recover() == nil {
			t.Error("second free of a block did not panic")
		}
	}()
	a.freeBlock(p)
}

// The kernels' scratch (the bf16 copies of GEMM operands, say) counts in
// the peak but not in the current allocation; growing it gives the old
// block back first.
func TestScratchCountsInPeak(t *testing.T) {
	f, a := newFake(0)
	p, err := a.alloc(1000)
	if err != nil {
		t.Fatal(err)
	}
	var s scratch
	if _, err := s.grow(a, 100<<10); err != nil {
		t.Fatal(err)
	}
	if a.cur != 1000 || a.peak != 1000+100<<10 {
		t.Fatalf("with 100 KiB of scratch: cur %d, peak %d, want 1000 and %d", a.cur, a.peak, 1000+100<<10)
	}
	if _, err := s.grow(a, 300<<10); err != nil {
		t.Fatal(err)
	}
	if a.peak != 1000+300<<10 || f.held != sizeClass(1000)+300<<10 || f.syncs != 1 {
		t.Fatalf("grown to 300 KiB: peak %d, driver holds %d, %d syncs; want %d, %d, 1", a.peak, f.held, f.syncs, 1000+300<<10, sizeClass(1000)+300<<10)
	}
	a.freeBlock(p)
	s.free(a)
	if err := a.emptyCache(); err != nil {
		t.Fatal(err)
	}
	if a.cur != 0 || a.work != 0 || f.held != 0 || a.peak != 1000+300<<10 {
		t.Fatalf("after freeing: cur %d, work %d, driver holds %d, peak %d", a.cur, a.work, f.held, a.peak)
	}
}
