package tensor

import (
	"fmt"
	"math"
	"math/rand/v2"
	"runtime"
	"slices"
	"strings"
	"testing"
)

// refGemm computes alpha*op(A)*op(B) + beta*C in float64, and for each element
// the sum of |alpha*a*b| terms plus |beta*c|, the scale that fp32 rounding
// error is relative to.
func refGemm(transA, transB bool, m, n, k int, alpha float32, a []float32, lda int, b []float32, ldb int, beta float32, c []float32, ldc int) (want, scale []float64) {
	want = make([]float64, m*n)
	scale = make([]float64, m*n)
	for i := 0; i < m; i++ {
		for j := 0; j < n; j++ {
			var s, abs float64
			for p := 0; p < k; p++ {
				var av, bv float64
				if transA {
					av = float64(a[p*lda+i])
				} else {
					av = float64(a[i*lda+p])
				}
				if transB {
					bv = float64(b[j*ldb+p])
				} else {
					bv = float64(b[p*ldb+j])
				}
				s += av * bv
				abs += math.Abs(av * bv)
			}
			s *= float64(alpha)
			abs *= math.Abs(float64(alpha))
			if beta != 0 {
				cv := float64(beta) * float64(c[i*ldc+j])
				s += cv
				abs += math.Abs(cv)
			}
			want[i*n+j] = s
			scale[i*n+j] = abs
		}
	}
	return want, scale
}

// gemmErr is the largest |got-want| over the matrix divided by the largest
// per-element magnitude scale: a norm-relative error that does not blow up on
// elements that cancel to near zero.
func gemmErr(m, n int, got []float32, ldc int, want, scale []float64) float64 {
	var maxDiff, maxScale float64
	for i := 0; i < m; i++ {
		for j := 0; j < n; j++ {
			g := float64(got[i*ldc+j])
			if math.IsNaN(g) || math.IsInf(g, 0) {
				return math.Inf(1)
			}
			maxDiff = max(maxDiff, math.Abs(g-want[i*n+j]))
			maxScale = max(maxScale, scale[i*n+j])
		}
	}
	if maxScale == 0 {
		return maxDiff
	}
	return maxDiff / maxScale
}

func randSlice(r *rand.Rand, n int) []float32 {
	s := make([]float32, n)
	for i := range s {
		s[i] = r.Float32()*2 - 1
	}
	return s
}

type gemmCase struct {
	m, n, k     int
	transA      bool
	transB      bool
	alpha, beta float32
	padA, padB  int // extra columns beyond the minimum leading dimension
	padC        int
	nanC        bool // fill C with NaN; only meaningful with beta == 0
}

func (tc gemmCase) String() string {
	return fmt.Sprintf("m%d_n%d_k%d_tA%v_tB%v_a%g_b%g_pad%d%d%d", tc.m, tc.n, tc.k, tc.transA, tc.transB, tc.alpha, tc.beta, tc.padA, tc.padB, tc.padC)
}

// gemmCases lists every transpose combination over odd sizes, with and
// without padded leading dimensions and alpha/beta variants.
func gemmCases(sizes []int) []gemmCase {
	var cases []gemmCase
	ab := [][2]float32{{1, 0}, {0.5, 1}, {-1.5, 0.25}, {1, 1}}
	i := 0
	for _, m := range sizes {
		for _, n := range sizes {
			for _, k := range sizes {
				for t := 0; t < 4; t++ {
					v := ab[i%len(ab)]
					pad := (i / 3) % 2 * (i%5 + 1)
					cases = append(cases, gemmCase{
						m: m, n: n, k: k, transA: t&1 != 0, transB: t&2 != 0,
						alpha: v[0], beta: v[1], padA: pad, padB: pad / 2, padC: pad, nanC: v[1] == 0,
					})
					i++
				}
			}
		}
	}
	return cases
}

func runGemmCase(t *testing.T, r *rand.Rand, tc gemmCase) {
	t.Helper()
	ar, ac := tc.m, tc.k
	if tc.transA {
		ar, ac = tc.k, tc.m
	}
	br, bc := tc.k, tc.n
	if tc.transB {
		br, bc = tc.n, tc.k
	}
	lda, ldb, ldc := max(1, ac)+tc.padA, max(1, bc)+tc.padB, max(1, tc.n)+tc.padC
	a := randSlice(r, ar*lda)
	b := randSlice(r, br*ldb)
	c := randSlice(r, tc.m*ldc)
	if tc.nanC {
		for i := range c {
			c[i] = float32(math.NaN())
		}
	}
	want, scale := refGemm(tc.transA, tc.transB, tc.m, tc.n, tc.k, tc.alpha, a, lda, b, ldb, tc.beta, c, ldc)
	orig := append([]float32(nil), c...)
	Sgemm(tc.transA, tc.transB, tc.m, tc.n, tc.k, tc.alpha, a, lda, b, ldb, tc.beta, c, ldc)
	if e := gemmErr(tc.m, tc.n, c, ldc, want, scale); e > 1e-5 {
		t.Fatalf("%v: relative error %.3g > 1e-5", tc, e)
	}
	// Padding columns of C must be untouched.
	for i := 0; i < tc.m; i++ {
		for j := tc.n; j < ldc; j++ {
			if x, y := c[i*ldc+j], orig[i*ldc+j]; x != y && !(x != x && y != y) {
				t.Fatalf("%v: C padding (%d,%d) changed from %v to %v", tc, i, j, y, x)
			}
		}
	}
}

// forKernels runs f once per micro-kernel this machine can run (the
// assembly ones and the portable one), whatever HPCRUN_NOASM says.
func forKernels(t *testing.T, f func(t *testing.T)) {
	saved := activeKernel.Load()
	defer activeKernel.Store(saved)
	for _, kr := range gemmKernels {
		activeKernel.Store(kr)
		t.Run(kr.name, f)
	}
}

func TestGemmKernelsPresent(t *testing.T) {
	if gemmKernels[len(gemmKernels)-1] != portableKernel {
		t.Fatalf("the portable kernel must be the last fallback")
	}
	t.Logf("kernels: %d, active %s", len(gemmKernels), GemmKernel())
}

func TestSgemm(t *testing.T) { forKernels(t, testSgemm) }

func testSgemm(t *testing.T) {
	sizes := []int{1, 3, 7, 17, 33, 65}
	if !testing.Short() && !raceEnabled {
		sizes = append(sizes, 127)
	}
	r := rand.New(rand.NewPCG(1, 2))
	for _, tc := range gemmCases(sizes) {
		runGemmCase(t, r, tc)
	}
}

func TestSgemmLarge(t *testing.T) { forKernels(t, testSgemmLarge) }

func testSgemmLarge(t *testing.T) {
	if testing.Short() || raceEnabled {
		t.Skip("large shapes are slow under -short and -race")
	}
	r := rand.New(rand.NewPCG(3, 4))
	for _, tc := range []gemmCase{
		{m: 250, n: 250, k: 250, alpha: 1},
		{m: 250, n: 301, k: 513, transA: true, alpha: 0.5, beta: 1},
		{m: 300, n: 257, k: 1100, transB: true, alpha: 1, beta: -1, padA: 3, padC: 5},
		{m: 129, n: 1031, k: 260, transA: true, transB: true, alpha: 2, padB: 7, nanC: true},
		{m: 640, n: 96, k: 300, alpha: 1, beta: 0.5},
		{m: 5, n: 2000, k: 40, alpha: 1},
		{m: 2000, n: 5, k: 40, transA: true, alpha: 1},
	} {
		runGemmCase(t, r, tc)
	}
}

func TestSgemmThreads(t *testing.T) { forKernels(t, testSgemmThreads) }

func testSgemmThreads(t *testing.T) {
	defer SetGemmThreads(0)
	r := rand.New(rand.NewPCG(5, 6))
	for _, th := range []int{1, 2, 3, 5} {
		SetGemmThreads(th)
		if got := GemmThreads(); got != th {
			t.Fatalf("GemmThreads() = %d after SetGemmThreads(%d)", got, th)
		}
		for _, tc := range []gemmCase{
			{m: 97, n: 65, k: 33, alpha: 1},
			{m: 33, n: 130, k: 70, transA: true, alpha: 1, beta: 1},
			{m: 200, n: 40, k: 17, transB: true, alpha: 1},
		} {
			runGemmCase(t, r, tc)
		}
	}
}

func TestSgemmStridedBatched(t *testing.T) { forKernels(t, testSgemmStridedBatched) }

func testSgemmStridedBatched(t *testing.T) {
	defer SetGemmThreads(0)
	SetGemmThreads(2)
	r := rand.New(rand.NewPCG(7, 8))
	for _, tc := range []struct {
		m, n, k, batch         int
		transA, transB         bool
		alpha, beta            float32
		shareA, shareB         bool
		extraA, extraB, extraC int
		// sideC puts the C matrices side by side in rows of width
		// batch*(n+extraC)+1, strideC = n+extraC (per-head attention outputs).
		sideC bool
	}{
		{m: 7, n: 9, k: 5, batch: 3, alpha: 1},
		{m: 17, n: 33, k: 12, batch: 4, transA: true, alpha: 0.5, beta: 1, extraA: 3, extraB: 1, extraC: 2},
		{m: 20, n: 7, k: 31, batch: 5, transB: true, alpha: 1, beta: -2, shareB: true},
		{m: 3, n: 65, k: 64, batch: 2, transA: true, transB: true, alpha: 1, shareA: true, extraC: 7},
		{m: 1, n: 1, k: 1, batch: 6, alpha: 1, beta: 1},
		{m: 40, n: 50, k: 60, batch: 3, transB: true, alpha: 1, beta: 0.5, extraC: 1},
		{m: 70, n: 90, k: 50, batch: 1, transA: true, alpha: 1},
		{m: 64, n: 16, k: 64, batch: 12, alpha: 1, sideC: true},
		{m: 37, n: 13, k: 29, batch: 5, transB: true, alpha: 0.5, beta: 1, sideC: true, extraC: 3},
		{m: 50, n: 33, k: 70, batch: 2, transA: true, alpha: 1, beta: -1, sideC: true, shareB: true},
		{m: 130, n: 64, k: 130, batch: 3, alpha: 1, sideC: true},
	} {
		ar, ac := tc.m, tc.k
		if tc.transA {
			ar, ac = tc.k, tc.m
		}
		br, bc := tc.k, tc.n
		if tc.transB {
			br, bc = tc.n, tc.k
		}
		lda, ldb, ldc := ac, bc, tc.n
		sa, sb, sc := ar*lda+tc.extraA, br*ldb+tc.extraB, tc.m*ldc+tc.extraC
		if tc.sideC {
			sc = tc.n + tc.extraC
			ldc = tc.batch*sc + 1
		}
		if tc.shareA {
			sa = 0
		}
		if tc.shareB {
			sb = 0
		}
		a := randSlice(r, (tc.batch-1)*sa+ar*lda)
		b := randSlice(r, (tc.batch-1)*sb+br*ldb)
		c := randSlice(r, (tc.batch-1)*sc+tc.m*ldc)
		c0 := slices.Clone(c)
		type ref struct{ want, scale []float64 }
		refs := make([]ref, tc.batch)
		for i := range refs {
			w, s := refGemm(tc.transA, tc.transB, tc.m, tc.n, tc.k, tc.alpha, a[i*sa:], lda, b[i*sb:], ldb, tc.beta, c[i*sc:], ldc)
			refs[i] = ref{w, s}
		}
		SgemmStridedBatched(tc.transA, tc.transB, tc.m, tc.n, tc.k, tc.alpha, a, lda, sa, b, ldb, sb, tc.beta, c, ldc, sc, tc.batch)
		for i, rf := range refs {
			if e := gemmErr(tc.m, tc.n, c[i*sc:], ldc, rf.want, rf.scale); e > 1e-5 {
				t.Fatalf("%+v: batch %d relative error %.3g > 1e-5", tc, i, e)
			}
		}
		// Elements of c outside every C matrix are untouched.
		inside := make([]bool, len(c))
		for i := 0; i < tc.batch; i++ {
			for row := 0; row < tc.m; row++ {
				for j := 0; j < tc.n; j++ {
					inside[i*sc+row*ldc+j] = true
				}
			}
		}
		for x := range c {
			if !inside[x] && c[x] != c0[x] {
				t.Fatalf("%+v: c[%d] outside every C matrix changed from %v to %v", tc, x, c0[x], c[x])
			}
		}
	}
}

func TestSgemmEmpty(t *testing.T) {
	c := []float32{1, 2, 3, 4}
	// k == 0: C = beta*C, A and B may be empty.
	Sgemm(false, false, 2, 2, 0, 1, nil, 1, nil, 2, 0.5, c, 2)
	for i, want := range []float32{0.5, 1, 1.5, 2} {
		if c[i] != want {
			t.Fatalf("k=0: c[%d] = %v, want %v", i, c[i], want)
		}
	}
	Sgemm(false, false, 0, 0, 5, 1, nil, 5, nil, 1, 0, nil, 1)
	SgemmStridedBatched(false, false, 2, 2, 2, 1, nil, 2, 4, nil, 2, 4, 0, nil, 2, 4, 0)
}

func TestSgemmBadArgs(t *testing.T) {
	a := make([]float32, 12)
	for _, tc := range []struct {
		name string
		call func()
		want string
	}{
		{"lda", func() { Sgemm(false, false, 3, 4, 4, 1, a, 3, a, 4, 0, a, 4) }, "lda=3"},
		{"ldbT", func() { Sgemm(false, true, 3, 4, 4, 1, a, 4, a, 3, 0, a, 4) }, "ldb=3"},
		{"ldc", func() { Sgemm(false, false, 3, 4, 3, 1, a, 3, a, 4, 0, a, 2) }, "ldc=2"},
		{"neg", func() { Sgemm(false, false, -1, 4, 3, 1, a, 3, a, 4, 0, a, 4) }, "negative dimension"},
		{"shortA", func() { Sgemm(false, false, 5, 4, 3, 1, a, 3, a, 4, 0, make([]float32, 20), 4) }, "len(a)=12"},
		{"shortC", func() { Sgemm(false, false, 3, 4, 3, 1, a, 3, a, 4, 0, a[:11], 4) }, "len(c)=11"},
		{"overlapC", func() {
			SgemmStridedBatched(false, false, 2, 2, 2, 1, a, 2, 0, a, 2, 0, 0, make([]float32, 8), 2, 3, 2)
		}, "overlap"},
		{"sideCTooNarrow", func() {
			// Side by side, 2 matrices of 3 columns need rows of at least 6.
			SgemmStridedBatched(false, false, 2, 3, 2, 1, a, 2, 0, a, 3, 0, 0, make([]float32, 20), 5, 3, 2)
		}, "overlap"},
		{"sideCStrideBelowN", func() {
			SgemmStridedBatched(false, false, 2, 3, 2, 1, a, 2, 0, a, 3, 0, 0, make([]float32, 20), 8, 2, 2)
		}, "overlap"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			defer func() {
				r := recover()
				msg, _ := r.(string)
				if !strings.Contains(msg, tc.want) || strings.Contains(msg, "\n") {
					t.Fatalf("panic %q, want one line containing %q", r, tc.want)
				}
			}()
			tc.call()
		})
	}
}

// TestSgemmSmallBlocks shrinks the cache blocks so that moderate sizes walk
// every loop of the shared-packing driver many times (several k, m and n
// blocks, ragged edges, both halves of the double buffers) on 1 to 3
// threads.
func TestSgemmSmallBlocks(t *testing.T) {
	saved := activeKernel.Load()
	defer activeKernel.Store(saved)
	defer SetGemmThreads(0)
	r := rand.New(rand.NewPCG(9, 10))
	for _, kr := range gemmKernels {
		// nc of 2 panels makes threads share B panels; 7 lets each own some.
		for _, ncPanels := range []int{2, 7} {
			small := *kr
			small.kc, small.mc, small.nc = 19, 3*kr.mr, ncPanels*kr.nr
			activeKernel.Store(&small)
			for threads := 1; threads <= 3; threads++ {
				SetGemmThreads(threads)
				t.Run(fmt.Sprintf("%s/nc%d/threads%d", kr.name, small.nc, threads), func(t *testing.T) {
					for _, tc := range []gemmCase{
						{m: 101, n: 157, k: 83, alpha: 1},
						{m: 64, n: 200, k: 40, transA: true, alpha: 0.5, beta: 1, padC: 3},
						{m: 130, n: 70, k: 57, transB: true, alpha: 1, beta: -1, padA: 2},
						{m: 37, n: 300, k: 20, transA: true, transB: true, alpha: 1, nanC: true},
					} {
						runGemmCase(t, r, tc)
					}
				})
			}
		}
	}
}

// TestPackFast checks the assembly packers against the Go loops on ragged
// panels, k tails and every row count of a 16-row transpose block; and
// the bfloat16 packers (widening as they load) against the Go loops on
// the widened source.
func TestPackFast(t *testing.T) {
	// A packer under test, and the Go loop it must match.
	type packer struct {
		name     string
		ref, run func(dst []float32)
	}
	r := rand.New(rand.NewPCG(11, 12))
	const ld = 71
	src := randSlice(r, 120*ld)
	half := make([]uint16, len(src))
	RoundBF16(half, src)
	wide := make([]float32, len(src))
	WidenBF16(wide, half)
	for _, trans := range []bool{false, true} {
		for _, mr := range []int{4, 6, 12, 16, 32} {
			for _, kc := range []int{1, 15, 16, 17, 40} {
				for _, rows := range []int{1, 5, mr - 1, mr, 2*mr + 3, 3 * mr} {
					if rows < 1 || rows > 110 || kc > ld-3 {
						continue
					}
					n := roundUp(rows, mr) * kc
					want, got := make([]float32, n), make([]float32, n)
					// Each packer against the Go loop on the float32 source
					// (the widened one for the bfloat16 packers, either path).
					packers := []packer{
						{"packA fast", func(d []float32) { packA(d, src, ld, trans, 2, rows, 3, kc, mr, false) }, func(d []float32) { packA(d, src, ld, trans, 2, rows, 3, kc, mr, true) }},
						{"packB fast", func(d []float32) { packB(d, src, ld, trans, 3, kc, 2, rows, mr, false) }, func(d []float32) { packB(d, src, ld, trans, 3, kc, 2, rows, mr, true) }},
					}
					for _, fast := range []bool{false, true} {
						packers = append(packers,
							packer{fmt.Sprintf("packAHalf fast=%v", fast), func(d []float32) { packA(d, wide, ld, trans, 2, rows, 3, kc, mr, false) }, func(d []float32) { packAHalf(d, half, ld, trans, 2, rows, 3, kc, mr, fast) }},
							packer{fmt.Sprintf("packBHalf fast=%v", fast), func(d []float32) { packB(d, wide, ld, trans, 3, kc, 2, rows, mr, false) }, func(d []float32) { packBHalf(d, half, ld, trans, 3, kc, 2, rows, mr, fast) }})
					}
					for _, p := range packers {
						p.ref(want)
						for i := range got {
							got[i] = float32(math.NaN())
						}
						p.run(got)
						if !slices.Equal(want, got) {
							t.Errorf("%s trans=%v width=%d kc=%d rows=%d: differs from the Go loop's packing", p.name, trans, mr, kc, rows)
						}
					}
				}
			}
		}
	}
}

// TestGemmWorkersReused checks that back-to-back threaded calls reuse the
// idle workers rather than start more: a worker must count itself idle
// before its caller can return.
func TestGemmWorkersReused(t *testing.T) {
	defer SetGemmThreads(0)
	SetGemmThreads(2)
	r := rand.New(rand.NewPCG(13, 14))
	a, b, c := randSlice(r, 96*96), randSlice(r, 96*96), make([]float32, 96*96)
	Sgemm(false, false, 96, 96, 96, 1, a, 96, b, 96, 0, c, 96)
	workersMu.Lock()
	before := workersIdle
	workersMu.Unlock()
	for i := range 300 {
		Sgemm(false, false, 96, 96, 96, 1, a, 96, b, 96, 0, c, 96)
		if i%2 == 0 {
			// Return to the caller's work at once (as between a step's
			// GEMMs) or after a yield, so the next call meets the worker
			// at different points of its bookkeeping.
			runtime.Gosched()
		}
	}
	workersMu.Lock()
	after := workersIdle
	workersMu.Unlock()
	if after != before {
		t.Fatalf("idle GEMM workers went from %d to %d over 300 back-to-back calls; want them reused", before, after)
	}
}
