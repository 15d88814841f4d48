package tensor

import "sync"

// The driver follows the GotoBLAS/BLIS scheme: C is cut into one rectangle
// per thread; each thread walks its rectangle in nc-wide column blocks and
// kc-deep slices of k, packs the (kc,nc) block of op(B) into nr-wide panels
// (kept in L2), packs mc rows of op(A) into mr-row panels, and for each A
// panel (kept in L1) runs the micro-kernel across every B panel. Packing
// zero-pads the ragged edges, so the kernel always computes full tiles; edge
// tiles go through a small scratch tile and are merged into C here.

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

// gemmTeam is the state the threads of one product share. They walk the
// same loops in lockstep: for each (kc,nc) block of op(B) and each (mc,kc)
// block of op(A), every thread packs its share of the panels into the shared
// buffers, all meet at a barrier, then each computes its share of the
// block's tiles. Packing is thus done once per call, not once per thread,
// and each packed block is read by every core. Both buffers are double
// buffered, so one barrier per packed block is enough: a buffer is refilled
// only after the barrier that follows the compute that last read it.
type gemmTeam struct {
	kr         *gemmKernel
	p          gemmParams
	threads    int
	kc, mc, nc int
	packA      [2][]float32
	packB      [2][]float32
	bar        spinBarrier
}

// setup prepares the team for product p on threads threads, choosing block
// sizes no larger than the kernel's that split m, n and k evenly, and
// growing the buffers when needed.
func (t *gemmTeam) setup(kr *gemmKernel, p *gemmParams, threads int) {
	t.kr, t.p, t.threads = kr, *p, threads
	t.kc = evenBlock(p.k, kr.kc, 1)
	t.mc = evenBlock(p.m, kr.mc, kr.mr)
	t.nc = evenBlock(p.n, kr.nc, kr.nr)
	na := roundUp(t.mc, kr.mr) * t.kc
	nb := roundUp(t.nc, kr.nr) * t.kc
	for i := range 2 {
		if cap(t.packA[i]) < na {
			t.packA[i] = make([]float32, na)
		}
		if cap(t.packB[i]) < nb {
			t.packB[i] = make([]float32, nb)
		}
	}
	t.bar.reset(threads)
}

// evenBlock splits n into the fewest blocks of at most maxBlock and returns
// the block size that makes them even, rounded up to a multiple of unit.
func evenBlock(n, maxBlock, unit int) int {
	maxBlock = max(unit, maxBlock/unit*unit)
	blocks := (n + maxBlock - 1) / maxBlock
	return min(maxBlock, roundUp((n+blocks-1)/blocks, unit))
}

// run is thread id's part of the product; tile is its (mr,nr) scratch.
func (t *gemmTeam) run(id int, tile []float32) {
	p, kr, nt := &t.p, t.kr, t.threads
	mr, nr := kr.mr, kr.nr
	nA, nB := 0, 0
	for jc := 0; jc < p.n; jc += t.nc {
		nc := min(t.nc, p.n-jc)
		npanB := (nc + nr - 1) / nr
		for pc := 0; pc < p.k; pc += t.kc {
			kc := min(t.kc, p.k-pc)
			pb := t.packB[nB&1]
			nB++
			bLo, bHi := npanB*id/nt, npanB*(id+1)/nt
			if bLo < bHi {
				packB(pb[bLo*nr*kc:], p.b, p.ldb, p.transB, pc, kc, jc+bLo*nr, min(nc, bHi*nr)-bLo*nr, nr, kr.asmPack)
			}
			beta, loadC := float32(1), true
			if pc == 0 {
				beta, loadC = p.beta, p.beta != 0
			}
			for ic := 0; ic < p.m; ic += t.mc {
				mc := min(t.mc, p.m-ic)
				npanA := (mc + mr - 1) / mr
				pa := t.packA[nA&1]
				nA++
				lo, hi := npanA*id/nt, npanA*(id+1)/nt
				if lo < hi {
					packA(pa[lo*mr*kc:], p.a, p.lda, p.transA, ic+lo*mr, min(mc, hi*mr)-lo*mr, pc, kc, mr, kr.asmPack)
				}
				t.bar.wait()
				// This thread's tiles. With enough B panels, every A panel
				// against the B panels this thread packed itself: they are
				// already in its own L2, and no core reads another's. Else a
				// contiguous run of the block's (A panel, B panel) pairs.
				// Either way in A-panel-major order, so an A panel stays in
				// L1 while B panels stream past it.
				q0, q1, qB := npanA*npanB*id/nt, npanA*npanB*(id+1)/nt, npanB
				if ownB := npanB >= 2*nt; ownB {
					q0, q1, qB = 0, npanA*(bHi-bLo), bHi-bLo
				}
				for q := q0; q < q1; q++ {
					ir, jr := q/qB*mr, q%qB*nr
					if qB != npanB {
						jr += bLo * nr
					}
					ap := pa[ir*kc : (ir+mr)*kc]
					bp := pb[jr*kc : (jr+nr)*kc]
					rows, cols := min(mr, mc-ir), min(nr, nc-jr)
					off := (ic+ir)*p.ldc + jc + jr
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
	for ir := 0; ir < mc; ir += mr {
		d := dst[ir*kc : (ir+mr)*kc]
		rows := min(mr, mc-ir)
		if !fast || !packTransFast(d, a[(i0+ir)*lda+p0:], rows, lda, kc, mr) {
			for pb := 0; pb < kc; pb += packBlock {
				pe := min(pb+packBlock, kc)
				for r := 0; r < rows; r++ {
					s := (i0+ir+r)*lda + p0
					dd := d[pb*mr+r:]
					for p, v := range a[s+pb : s+pe] {
						dd[p*mr] = v
					}
				}
			}
		}
		for r := rows; r < mr; r++ {
			for p := 0; p < kc; p++ {
				d[p*mr+r] = 0
			}
		}
	}
}

// packB packs k indices [p0,p0+kc) and columns [j0,j0+nc) of op(B) into
// nr-column panels: panel q holds, for each k step, the nr values of
// columns j0+q*nr..j0+q*nr+nr-1, zero beyond the last column.
func packB(dst, b []float32, ldb int, trans bool, p0, kc, j0, nc, nr int, fast bool) {
	if !trans && fast && packPanelsFast(dst, b[p0*ldb+j0:], kc, ldb, nc, nr) {
		return
	}
	for jr := 0; jr < nc; jr += nr {
		d := dst[jr*kc : (jr+nr)*kc]
		cols := min(nr, nc-jr)
		if !trans {
			for p := 0; p < kc; p++ {
				s := (p0+p)*ldb + j0 + jr
				copy(d[p*nr:p*nr+cols], b[s:s+cols])
				clear(d[p*nr+cols : p*nr+nr])
			}
			continue
		}
		// B is stored (n,k): column j of op(B) is row j of b.
		if !fast || !packTransFast(d, b[(j0+jr)*ldb+p0:], cols, ldb, kc, nr) {
			for pb := 0; pb < kc; pb += packBlock {
				pe := min(pb+packBlock, kc)
				for j := 0; j < cols; j++ {
					s := (j0+jr+j)*ldb + p0
					dd := d[pb*nr+j:]
					for p, v := range b[s+pb : s+pe] {
						dd[p*nr] = v
					}
				}
			}
		}
		for j := cols; j < nr; j++ {
			for p := 0; p < kc; p++ {
				d[p*nr+j] = 0
			}
		}
	}
}

// packPanelsFast packs n columns of kc rows of src (ld apart) into w-wide
// panels, zero beyond column n, with packCopyFast; ok is false when it did
// nothing.
func packPanelsFast(dst, src []float32, kc, ld, n, w int) (ok bool) {
	full := n / w
	if full > 0 && !packCopyFast(dst, src, kc, ld, full, w, w) {
		return false
	}
	if r := n - full*w; r > 0 {
		return packCopyFast(dst[full*w*kc:], src[full*w:], kc, ld, 1, w, r)
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
	if m == 0 || n == 0 {
		return
	}
	if k == 0 || alpha == 0 {
		scaleC(m, n, beta, c, ldc)
		return
	}
	p := gemmParams{transA, transB, m, n, k, alpha, beta, a, lda, b, ldb, c, ldc}
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
