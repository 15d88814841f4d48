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

// gemmWorker owns the packing buffers of one goroutine, reused across calls.
type gemmWorker struct {
	packA, packB []float32
	tile         []float32
}

func (w *gemmWorker) buffers(kr *gemmKernel, kc, mc, nc int) (pa, pb, tile []float32) {
	na := roundUp(mc, kr.mr) * kc
	nb := roundUp(nc, kr.nr) * kc
	if cap(w.packA) < na {
		w.packA = make([]float32, na)
	}
	if cap(w.packB) < nb {
		w.packB = make([]float32, nb)
	}
	if cap(w.tile) < kr.mr*kr.nr {
		w.tile = make([]float32, kr.mr*kr.nr)
	}
	return w.packA[:na], w.packB[:nb], w.tile[:kr.mr*kr.nr]
}

func roundUp(x, m int) int { return (x + m - 1) / m * m }

// run computes rows [i0,i1) and columns [j0,j1) of C with kernel kr.
func (w *gemmWorker) run(kr *gemmKernel, p *gemmParams, i0, i1, j0, j1 int) {
	if i0 >= i1 || j0 >= j1 {
		return
	}
	mr, nr := kr.mr, kr.nr
	kcMax := min(kr.kc, p.k)
	mcMax := min(kr.mc, i1-i0)
	ncMax := min(kr.nc, j1-j0)
	pa, pb, tile := w.buffers(kr, kcMax, mcMax, ncMax)
	for jc := j0; jc < j1; jc += ncMax {
		nc := min(ncMax, j1-jc)
		for pc := 0; pc < p.k; pc += kcMax {
			kc := min(kcMax, p.k-pc)
			packB(pb, p.b, p.ldb, p.transB, pc, kc, jc, nc, nr, kr.asmPack)
			beta, loadC := float32(1), true
			if pc == 0 {
				beta, loadC = p.beta, p.beta != 0
			}
			for ic := i0; ic < i1; ic += mcMax {
				mc := min(mcMax, i1-ic)
				packA(pa, p.a, p.lda, p.transA, ic, mc, pc, kc, mr, kr.asmPack)
				for ir := 0; ir < mc; ir += mr {
					ap := pa[ir*kc : (ir+mr)*kc]
					rows := min(mr, mc-ir)
					for jr := 0; jr < nc; jr += nr {
						bp := pb[jr*kc : (jr+nr)*kc]
						cols := min(nr, nc-jr)
						off := (ic+ir)*p.ldc + jc + jr
						if rows == mr && cols == nr {
							kr.fn(kc, ap, bp, p.c[off:], p.ldc, p.alpha, beta, loadC)
							continue
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

// workerPool hands out gemmWorkers to calling goroutines, so that their
// packing buffers survive from call to call.
var workerPool = sync.Pool{New: func() any { return new(gemmWorker) }}

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
	// than it saves.
	if float64(m)*float64(n)*float64(k) < 48*48*48 {
		threads = 1
	}
	tm, tn := threadGrid(kr, m, n, k, threads)
	if tm*tn == 1 {
		w := workerPool.Get().(*gemmWorker)
		w.run(kr, &p, 0, m, 0, n)
		workerPool.Put(w)
		return
	}
	job := jobPool.Get().(*gemmJob)
	job.kr, job.p, job.tm, job.tn = kr, p, tm, tn
	job.runTasks(tm * tn)
	job.p = gemmParams{}
	jobPool.Put(job)
}

// threadGrid splits C into tm x tn rectangles, one per thread, choosing the
// split that minimizes the largest share of kernel work plus packing.
func threadGrid(kr *gemmKernel, m, n, k, threads int) (tm, tn int) {
	mt, nt := (m+kr.mr-1)/kr.mr, (n+kr.nr-1)/kr.nr
	best := -1.0
	tm, tn = 1, 1
	for x := 1; x <= threads; x++ {
		if threads%x != 0 {
			continue
		}
		y := threads / x
		if x > mt || y > nt {
			continue
		}
		rows := float64((mt+x-1)/x) * float64(kr.mr)
		cols := float64((nt+y-1)/y) * float64(kr.nr)
		// Each thread packs its B block once and its A rows once per nc block.
		ncBlocks := float64(int(cols+float64(kr.nc)-1) / kr.nc)
		cost := rows*cols*float64(k) + 8*float64(k)*(cols+rows*ncBlocks)
		if best < 0 || cost < best {
			best, tm, tn = cost, x, y
		}
	}
	return tm, tn
}

// split returns the range [lo,hi) of part q of p parts of n items handed out
// in whole units of unit items.
func split(n, unit, p, q int) (lo, hi int) {
	units := (n + unit - 1) / unit
	lo = min(n, units*q/p*unit)
	hi = min(n, units*(q+1)/p*unit)
	return lo, hi
}
