package tensor

import (
	"sync"
	"sync/atomic"
)

// The driver follows the GotoBLAS/BLIS scheme: C is walked in nc-wide
// column blocks and kc-deep slices of k; the (kc,nc) block of op(B) is
// packed into nr-wide panels (kept in L2), mc rows of op(A) into mr-row
// panels, and for each A panel (kept in L1) the micro-kernel runs across the
// B panels. The threads of a call share the packing (see gemmTeam).
// Packing zero-pads the ragged edges, so the kernel always computes full
// tiles; a short last A panel has its own kernel where the CPU has one, and
// other edge tiles go through a small scratch tile and are merged into C.

// gemmParams is one product C = alpha*op(A)*op(B) + beta*C (after checks).
type gemmParams struct {
	transA, transB bool
	m, n, k        int
	alpha, beta    float32
	a              []float32
	lda            int
	b              []float32
	ldb            int
	c              []float32
	ldc            int
	// ah and bh, when not nil, hold A and B as bfloat16 instead of a and
	// b: packing widens them (an activation or a weight's bfloat16 copy,
	// read without a widened copy of it all).
	ah, bh []uint16
}

// gemmWorker is one goroutine's private state: the scratch tile edge tiles
// go through, and a one-thread team for products it runs alone (strided
// batches), reused across calls.
type gemmWorker struct {
	tile []float32
	solo gemmTeam
}

func (w *gemmWorker) tileFor(kr *gemmKernel) []float32 {
	if cap(w.tile) < kr.mr*kr.nr {
		w.tile = make([]float32, kr.mr*kr.nr)
	}
	return w.tile[:kr.mr*kr.nr]
}

func roundUp(x, m int) int { return (x + m - 1) / m * m }

// gemmTeam is the state the threads of one product share. The product is
// cut into blocks: for each nc-wide column block of C and kc-deep slice of
// k, a (kc,nc) block of op(B), and within it each (mc,kc) block of op(A).
// Every thread packs its share of each block's panels into the shared
// buffers, so packing is done once per call, not once per thread.
//
// When each thread has at least two of a block's B panels (ownB), a thread
// computes every A panel against the B panels it packed itself: its B stays
// in its own L2 and never needs to be shared, only the A blocks are. Those
// are triple buffered and pipelined: a thread packs its share of the next A
// block before it computes the current one, so a thread that runs ahead
// waits only when it gets a whole block ahead, not at every block.
//
// Otherwise the threads walk the blocks in lockstep: all pack their share of
// the A and B panels, meet at a barrier, and each computes a contiguous run
// of the block's tiles. Both buffers are double buffered, so one barrier
// per block is enough: a buffer is refilled only after the barrier that
// follows the compute that last read it.
type gemmTeam struct {
	kr         *gemmKernel
	p          gemmParams
	threads    int
	kc, mc, nc int
	// nI, nP and nJ count the blocks of m, k and n.
	nI, nP, nJ int
	ownB       bool
	packA      [3][]float32
	packB      [2][]float32
	bar        spinBarrier
	// For ownB: each thread's progress, and sig to wait on the others'.
	prog []threadProgress
	sig  teamSignal
}

// threadProgress counts the A-block shares a thread has packed and the
// blocks it has computed; padded to a cache line of its own.
type threadProgress struct {
	packed, computed atomic.Int64
	_                [48]byte
}

// setup prepares the team for product p on threads threads, choosing block
// sizes no larger than the kernel's that split m, n and k evenly, and
// growing the buffers when needed.
func (t *gemmTeam) setup(kr *gemmKernel, p *gemmParams, threads int) {
	t.kr, t.p, t.threads = kr, *p, threads
	t.kc = evenBlock(p.k, kr.kc, 1)
	t.mc = evenBlock(p.m, kr.mc, kr.mr)
	t.nc = evenBlock(p.n, kr.nc, kr.nr)
	t.nI, t.nP, t.nJ = (p.m+t.mc-1)/t.mc, (p.k+t.kc-1)/t.kc, (p.n+t.nc-1)/t.nc
	// The last column block is the narrowest.
	lastNc := p.n - (t.nJ-1)*t.nc
	t.ownB = threads > 1 && (lastNc+kr.nr-1)/kr.nr >= 2*threads
	na := roundUp(t.mc, kr.mr) * t.kc
	nb := roundUp(t.nc, kr.nr) * t.kc
	if t.ownB {
		nb = threads * t.ownShare() * kr.nr * t.kc
	}
	for i := range t.packA {
		if cap(t.packA[i]) < na {
			t.packA[i] = make([]float32, na)
		}
	}
	for i := range t.packB {
		if cap(t.packB[i]) < nb {
			t.packB[i] = make([]float32, nb)
		}
	}
	t.bar.reset(threads)
	if cap(t.prog) < threads {
		t.prog = make([]threadProgress, threads)
	}
	t.prog = t.prog[:threads]
	for i := range t.prog {
		t.prog[i].packed.Store(0)
		t.prog[i].computed.Store(0)
	}
	t.sig.init()
}

// ownShare is the most B panels of a block one thread packs when ownB.
func (t *gemmTeam) ownShare() int {
	npanB := (t.nc + t.kr.nr - 1) / t.kr.nr
	return (npanB + t.threads - 1) / t.threads
}

// evenBlock splits n into the fewest blocks of at most maxBlock and returns
// the block size that makes them even, rounded up to a multiple of unit.
func evenBlock(n, maxBlock, unit int) int {
	maxBlock = max(unit, maxBlock/unit*unit)
	blocks := (n + maxBlock - 1) / maxBlock
	return min(maxBlock, roundUp((n+blocks-1)/blocks, unit))
}

// gemmBlock is one (mc,kc) block of op(A) against one (kc,nc) block of
// op(B): C rows [ic,ic+mc) and columns [jc,jc+nc), k indices [pc,pc+kc).
type gemmBlock struct {
	ic, mc, pc, kc, jc, nc int
}

// block returns block b of the walk over column blocks, then k slices,
// then row blocks.
func (t *gemmTeam) block(b int) gemmBlock {
	ii, pp, jj := b%t.nI, b/t.nI%t.nP, b/(t.nI*t.nP)
	ic, pc, jc := ii*t.mc, pp*t.kc, jj*t.nc
	return gemmBlock{ic, min(t.mc, t.p.m-ic), pc, min(t.kc, t.p.k-pc), jc, min(t.nc, t.p.n-jc)}
}

// packAShare packs thread id's share of block bl's A panels into pa.
func (t *gemmTeam) packAShare(id int, bl gemmBlock, pa []float32) {
	p, mr, nt := &t.p, t.kr.mr, t.threads
	npanA := (bl.mc + mr - 1) / mr
	lo, hi := npanA*id/nt, npanA*(id+1)/nt
	switch {
	case lo >= hi:
	case p.ah != nil:
		packAHalf(pa[lo*mr*bl.kc:], p.ah, p.lda, p.transA, bl.ic+lo*mr, min(bl.mc, hi*mr)-lo*mr, bl.pc, bl.kc, mr, t.kr.asmPack)
	default:
		packA(pa[lo*mr*bl.kc:], p.a, p.lda, p.transA, bl.ic+lo*mr, min(bl.mc, hi*mr)-lo*mr, bl.pc, bl.kc, mr, t.kr.asmPack)
	}
}

// bShare returns the range of block bl's B panels that thread id packs.
func (t *gemmTeam) bShare(id int, bl gemmBlock) (lo, hi int) {
	npanB := (bl.nc + t.kr.nr - 1) / t.kr.nr
	return npanB * id / t.threads, npanB * (id + 1) / t.threads
}

// packBPanels packs B panels [lo,hi) of block bl into dst.
func (t *gemmTeam) packBPanels(bl gemmBlock, lo, hi int, dst []float32) {
	p, nr := &t.p, t.kr.nr
	switch {
	case lo >= hi:
	case p.bh != nil:
		packBHalf(dst, p.bh, p.ldb, p.transB, bl.pc, bl.kc, bl.jc+lo*nr, min(bl.nc, hi*nr)-lo*nr, nr, t.kr.asmPack)
	default:
		packB(dst, p.b, p.ldb, p.transB, bl.pc, bl.kc, bl.jc+lo*nr, min(bl.nc, hi*nr)-lo*nr, nr, t.kr.asmPack)
	}
}

// run is thread id's part of the product; tile is its (mr,nr) scratch.
func (t *gemmTeam) run(id int, tile []float32) {
	if t.ownB {
		t.runOwnB(id, tile)
		return
	}
	mr, nr, nt := t.kr.mr, t.kr.nr, t.threads
	blocks := t.nI * t.nP * t.nJ
	for b := range blocks {
		bl := t.block(b)
		// Each (kc,nc) B block is packed once, before its first A block.
		nB := b / t.nI
		pb := t.packB[nB&1]
		if bl.ic == 0 {
			lo, hi := t.bShare(id, bl)
			t.packBPanels(bl, lo, hi, pb[lo*nr*bl.kc:])
		}
		pa := t.packA[b&1]
		t.packAShare(id, bl, pa)
		t.bar.wait()
		// A contiguous run of the block's (A panel, B panel) pairs in
		// A-panel-major order, so an A panel stays in L1 while B panels
		// stream past it.
		npanA, npanB := (bl.mc+mr-1)/mr, (bl.nc+nr-1)/nr
		tiles := npanA * npanB
		t.computeTiles(bl, pa, pb, tiles*id/nt, tiles*(id+1)/nt, npanB, 0, tile)
	}
}

// runOwnB is run when every thread owns some of each block's B panels.
func (t *gemmTeam) runOwnB(id int, tile []float32) {
	mr := t.kr.mr
	blocks := t.nI * t.nP * t.nJ
	me := &t.prog[id]
	packed := func(tp *threadProgress) *atomic.Int64 { return &tp.packed }
	computed := func(tp *threadProgress) *atomic.Int64 { return &tp.computed }
	t.packAShare(id, t.block(0), t.packA[0])
	t.sig.add(&me.packed, 1)
	var bLo, bHi int
	var pb []float32
	for b := range blocks {
		bl := t.block(b)
		if bl.ic == 0 {
			// Only this thread reads its B panels, and it has computed
			// every block that used the previous ones. Its region is fixed
			// for the whole product, as the others may be at a block of
			// another depth or width.
			bLo, bHi = t.bShare(id, bl)
			pb = t.packB[0][id*t.ownShare()*t.kr.nr*t.kc:]
			t.packBPanels(bl, bLo, bHi, pb)
		}
		if b+1 < blocks {
			// The next A buffer was last read by block b-2.
			t.sig.waitFor(t.prog, computed, int64(b-1))
			t.packAShare(id, t.block(b+1), t.packA[(b+1)%3])
			t.sig.add(&me.packed, 1)
		}
		t.sig.waitFor(t.prog, packed, int64(b+1))
		npanA := (bl.mc + mr - 1) / mr
		t.computeTiles(bl, t.packA[b%3], pb, 0, npanA*(bHi-bLo), bHi-bLo, bLo*t.kr.nr, tile)
		t.sig.add(&me.computed, 1)
	}
}

// computeTiles runs the micro-kernel over tiles [q0,q1) of block bl, tile q
// being A panel q/width of pa against B panel q%width of pb, which holds
// the block's B columns from col0 on.
func (t *gemmTeam) computeTiles(bl gemmBlock, pa, pb []float32, q0, q1, width, col0 int, tile []float32) {
	p, kr := &t.p, t.kr
	mr, nr, kc := kr.mr, kr.nr, bl.kc
	beta, loadC := float32(1), true
	if bl.pc == 0 {
		beta, loadC = p.beta, p.beta != 0
	}
	for q := q0; q < q1; q++ {
		ir, jr := q/width*mr, q%width*nr
		ap := pa[ir*kc : (ir+mr)*kc]
		bp := pb[jr*kc : (jr+nr)*kc]
		rows, cols := min(mr, bl.mc-ir), min(nr, bl.nc-col0-jr)
		off := (bl.ic+ir)*p.ldc + bl.jc + col0 + jr
		if cols == nr {
			if rows == mr {
				kr.fn(kc, ap, bp, p.c[off:], p.ldc, p.alpha, beta, loadC)
				continue
			}
			if kr.short != nil && kr.short(rows, kc, ap, bp, p.c[off:], p.ldc, p.alpha, beta, loadC) {
				continue
			}
		}
		kr.fn(kc, ap, bp, tile, nr, p.alpha, 0, false)
		for i := 0; i < rows; i++ {
			src := tile[i*nr : i*nr+cols]
			dst := p.c[off+i*p.ldc : off+i*p.ldc+cols]
			if loadC {
				for j, v := range src {
					dst[j] = v + beta*dst[j]
				}
			} else {
				copy(dst, src)
			}
		}
	}
}

// packBlock is how many k steps packA and packB gather from each source
// row before moving to the next: one cache line of floats, so the source
// lines and the destination being filled stay in L1 together.
const packBlock = 16

// packA packs rows [i0,i0+mc) and k indices [p0,p0+kc) of op(A) into mr-row
// panels: panel q holds, for each k step, the mr values of rows
// i0+q*mr..i0+q*mr+mr-1, zero beyond the last row.
func packA(dst, a []float32, lda int, trans bool, i0, mc, p0, kc, mr int, fast bool) {
	if trans {
		// A is stored (k,m): each k step is a contiguous run of rows, read
		// once and dealt out to the panels.
		if fast && packPanelsFast(dst, a[p0*lda+i0:], kc, lda, mc, mr) {
			return
		}
		for p := 0; p < kc; p++ {
			s := (p0+p)*lda + i0
			row := a[s : s+mc]
			for ir := 0; ir < mc; ir += mr {
				rows := min(mr, mc-ir)
				o := ir*kc + p*mr
				copy(dst[o:o+rows], row[ir:ir+rows])
				clear(dst[o+rows : o+mr])
			}
		}
		return
	}
	// A is stored (m,k): row i of op(A) is row i of a.
	if !fast || !packTransPanelsFast(dst, a[i0*lda+p0:], mc, lda, kc, mr) {
		packTransPanels(dst, a[i0*lda+p0:], mc, lda, kc, mr)
	}
}

// packB packs k indices [p0,p0+kc) and columns [j0,j0+nc) of op(B) into
// nr-column panels: panel q holds, for each k step, the nr values of
// columns j0+q*nr..j0+q*nr+nr-1, zero beyond the last column.
func packB(dst, b []float32, ldb int, trans bool, p0, kc, j0, nc, nr int, fast bool) {
	if fast && !trans && packPanelsFast(dst, b[p0*ldb+j0:], kc, ldb, nc, nr) {
		return
	}
	if trans {
		// B is stored (n,k): column j of op(B) is row j of b.
		if !fast || !packTransPanelsFast(dst, b[j0*ldb+p0:], nc, ldb, kc, nr) {
			packTransPanels(dst, b[j0*ldb+p0:], nc, ldb, kc, nr)
		}
		return
	}
	for jr := 0; jr < nc; jr += nr {
		d := dst[jr*kc : (jr+nr)*kc]
		cols := min(nr, nc-jr)
		for p := 0; p < kc; p++ {
			s := (p0+p)*ldb + j0 + jr
			copy(d[p*nr:p*nr+cols], b[s:s+cols])
			clear(d[p*nr+cols : p*nr+nr])
		}
	}
}

// packTransPanels is packTransPanelsFast in Go: n rows of kc elements of
// src (ld apart) into w-wide transposed panels, zero beyond row n, a
// cache line of each row at a time (packBlock).
func packTransPanels(dst, src []float32, n, ld, kc, w int) {
	for r0 := 0; r0 < n; r0 += w {
		d := dst[r0*kc : (r0+w)*kc]
		rows := min(w, n-r0)
		for pb := 0; pb < kc; pb += packBlock {
			pe := min(pb+packBlock, kc)
			for r := range rows {
				dd := d[pb*w+r:]
				for p, v := range src[(r0+r)*ld+pb : (r0+r)*ld+pe] {
					dd[p*w] = v
				}
			}
		}
		zeroPanelRows(d, rows, w, kc)
	}
}

// zeroPanelRows zeroes lanes [rows,w) of every k step of a w-wide panel.
func zeroPanelRows(d []float32, rows, w, kc int) {
	for r := rows; r < w; r++ {
		for p := range kc {
			d[p*w+r] = 0
		}
	}
}

// halfPanel holds a panel's part of a bfloat16 operand, widened, for
// packAHalf and packBHalf.
var halfPanel = sync.Pool{New: func() any { return new([]float32) }}

// packAHalf is packA from a bfloat16 A, widened as the fast packers load
// it; without them each mr-row panel's part of A is widened into a small
// float32 A of its own, which packA then packs (as packBHalf for B).
func packAHalf(dst []float32, a []uint16, lda int, trans bool, i0, mc, p0, kc, mr int, fast bool) {
	if fast && trans && packPanelsFast(dst, a[p0*lda+i0:], kc, lda, mc, mr) {
		return
	}
	if fast && !trans && packTransPanelsFast(dst, a[i0*lda+p0:], mc, lda, kc, mr) {
		return
	}
	tmp := halfPanel.Get().(*[]float32)
	defer halfPanel.Put(tmp)
	if cap(*tmp) < mr*kc {
		*tmp = make([]float32, mr*kc)
	}
	for ir := 0; ir < mc; ir += mr {
		rows := min(mr, mc-ir)
		w := (*tmp)[:rows*kc]
		if trans { // row i of op(A) is column i of a: (kc, rows)
			for p := range kc {
				s := (p0+p)*lda + i0 + ir
				WidenBF16(w[p*rows:(p+1)*rows], a[s:s+rows])
			}
			packA(dst[ir*kc:], w, rows, true, 0, rows, 0, kc, mr, fast)
			continue
		}
		for i := range rows { // (rows, kc)
			s := (i0+ir+i)*lda + p0
			WidenBF16(w[i*kc:(i+1)*kc], a[s:s+kc])
		}
		packA(dst[ir*kc:], w, kc, false, 0, rows, 0, kc, mr, fast)
	}
}

// packBHalf is packB from a bfloat16 B, widened as the fast packers load
// it; without them each nr-column panel's part of B is widened into a
// small float32 B of its own (rows of b, contiguous, either way round),
// which packB then packs.
func packBHalf(dst []float32, b []uint16, ldb int, trans bool, p0, kc, j0, nc, nr int, fast bool) {
	if fast && !trans && packPanelsFast(dst, b[p0*ldb+j0:], kc, ldb, nc, nr) {
		return
	}
	if fast && trans && packTransPanelsFast(dst, b[j0*ldb+p0:], nc, ldb, kc, nr) {
		return
	}
	tmp := halfPanel.Get().(*[]float32)
	defer halfPanel.Put(tmp)
	if cap(*tmp) < nr*kc {
		*tmp = make([]float32, nr*kc)
	}
	for jr := 0; jr < nc; jr += nr {
		cols := min(nr, nc-jr)
		w := (*tmp)[:cols*kc]
		if trans { // column j of op(B) is row j of b: (cols, kc)
			for j := range cols {
				s := (j0+jr+j)*ldb + p0
				WidenBF16(w[j*kc:(j+1)*kc], b[s:s+kc])
			}
			packB(dst[jr*kc:], w, kc, true, 0, kc, 0, cols, nr, fast)
			continue
		}
		for p := range kc { // (kc, cols)
			s := (p0+p)*ldb + j0 + jr
			WidenBF16(w[p*cols:(p+1)*cols], b[s:s+cols])
		}
		packB(dst[jr*kc:], w, cols, false, 0, kc, 0, cols, nr, fast)
	}
}

// packElem is what a fast packer reads: float32, or bfloat16 (its bits),
// widened as it is packed.
type packElem interface{ float32 | uint16 }

// packPanelsFast packs n columns of kc rows of src (ld apart) into w-wide
// panels, zero beyond column n, with packCopyFast; ok is false when it did
// nothing.
func packPanelsFast[E packElem](dst []float32, src []E, kc, ld, n, w int) (ok bool) {
	full := n / w
	if full > 0 && !packCopyFast(dst, src, kc, ld, full, w, w) {
		return false
	}
	if r := n - full*w; r > 0 {
		return packCopyFast(dst[full*w*kc:], src[full*w:], kc, ld, 1, w, r)
	}
	return true
}

// packTransPanelsFast packs n rows of kc elements of src (ld apart) into
// w-wide panels, transposed (panel q holds, for each k step, the w values
// of rows q*w..q*w+w-1), zero beyond row n, with packTransFast; ok is
// false when it did nothing.
func packTransPanelsFast[E packElem](dst []float32, src []E, n, ld, kc, w int) (ok bool) {
	for r0 := 0; r0 < n; r0 += w {
		d := dst[r0*kc : (r0+w)*kc]
		rows := min(w, n-r0)
		if !packTransFast(d, src[r0*ld:], rows, ld, kc, w) {
			return false
		}
		zeroPanelRows(d, rows, w, kc)
	}
	return true
}

// workerPool hands out gemmWorkers to calling goroutines, so that their
// buffers survive from call to call.
var workerPool = sync.Pool{New: func() any { return new(gemmWorker) }}

// teamPool holds the shared packing buffers of threaded calls.
var teamPool = sync.Pool{New: func() any { return new(gemmTeam) }}

// gemm is Sgemm after argument checks.
func gemm(transA, transB bool, m, n, k int, alpha float32, a []float32, lda int, b []float32, ldb int, beta float32, c []float32, ldc int) {
	runGemm(gemmParams{transA, transB, m, n, k, alpha, beta, a, lda, b, ldb, c, ldc, nil, nil})
}

// gemmHalf is gemm with A or B (or both) stored as bfloat16: ah or bh
// instead of a or b (see gemmParams.ah).
func gemmHalf(transA, transB bool, m, n, k int, alpha float32, a []float32, ah []uint16, lda int, b []float32, bh []uint16, ldb int, beta float32, c []float32, ldc int) {
	runGemm(gemmParams{transA, transB, m, n, k, alpha, beta, a, lda, b, ldb, c, ldc, ah, bh})
}

// runGemm runs product p on the calling goroutine and, when large enough,
// the pool's.
func runGemm(p gemmParams) {
	m, n, k := p.m, p.n, p.k
	if m == 0 || n == 0 {
		return
	}
	if k == 0 || p.alpha == 0 {
		scaleC(m, n, p.beta, p.c, p.ldc)
		return
	}
	kr := activeKernel.Load()
	threads := GemmThreads()
	// Below this much work, handing tiles to other goroutines costs more
	// than it saves; and no thread should be left without a tile row.
	if float64(m)*float64(n)*float64(k) < 48*48*48 {
		threads = 1
	}
	threads = max(1, min(threads, ((m+kr.mr-1)/kr.mr)*((n+kr.nr-1)/kr.nr)))
	w := workerPool.Get().(*gemmWorker)
	if threads == 1 {
		w.solo.setup(kr, &p, 1)
		w.solo.run(0, w.tileFor(kr))
		w.solo.p = gemmParams{}
		workerPool.Put(w)
		return
	}
	team := teamPool.Get().(*gemmTeam)
	team.setup(kr, &p, threads)
	job := jobPool.Get().(*gemmJob)
	job.team = team
	job.runTasks(threads, w)
	job.team, team.p = nil, gemmParams{}
	jobPool.Put(job)
	teamPool.Put(team)
	workerPool.Put(w)
}

// split returns the range [lo,hi) of part q of p parts of n items handed out
// in whole units of unit items.
func split(n, unit, p, q int) (lo, hi int) {
	units := (n + unit - 1) / unit
	lo = min(n, units*q/p*unit)
	hi = min(n, units*(q+1)/p*unit)
	return lo, hi
}
