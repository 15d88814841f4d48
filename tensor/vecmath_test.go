package tensor

import (
	"math"
	"math/rand/v2"
	"testing"
)

// TestVecMath checks the vector loops (the AVX2 assembly where the CPU has
// it) against float64 math on random inputs, including extremes and NaN.
func TestVecMath(t *testing.T) {
	if !useVecAsm {
		t.Skip("no vector loops on this build or CPU (noasm, HPCRUN_NOASM=1 or no AVX2+FMA)")
	}
	r := rand.New(rand.NewPCG(31, 32))
	const n = 203
	x := randF32(r, n, 12)
	x[0], x[1], x[2], x[3], x[4] = -200, 200, 0, -87.5, 87.9
	y := make([]float32, n)
	x64 := to64(x)

	m := geluFwdVec(y, x)
	if m != n&^7 {
		t.Fatalf("geluFwdVec did %d elements, want %d", m, n&^7)
	}
	for i := 0; i < m; i++ {
		if want := refGELU(x64[i]); math.Abs(float64(y[i])-want) > 2e-6*(1+math.Abs(want)) {
			t.Fatalf("gelu(%v) = %v, want %v", x[i], y[i], want)
		}
	}

	dout := randF32(r, n, 1)
	dinp := randF32(r, n, 1)
	dinp0 := append([]float32(nil), dinp...)
	geluBwdVec(dinp, x, dout)
	for i := 0; i < m; i++ {
		const h = 1e-6
		grad := (refGELU(x64[i]+h) - refGELU(x64[i]-h)) / (2 * h)
		want := float64(dinp0[i]) + grad*float64(dout[i])
		if math.Abs(float64(dinp[i])-want) > 2e-6*(1+math.Abs(want)) {
			t.Fatalf("gelu backward at %v: %v, want %v", x[i], dinp[i], want)
		}
	}

	for _, scale := range []float32{1, 0.125} {
		const shift = 3
		m, sum := expShiftVec(y, x, scale, shift)
		var want float64
		for i := 0; i < m; i++ {
			arg := float64(scale * (x[i] - shift)) // rounded as the kernel rounds it
			e := math.Exp(min(arg, 88))            // the documented clamp
			if math.Abs(float64(y[i])-e) > 3e-7*e+1e-37 {
				t.Fatalf("exp(%v*(%v-%v)) = %v, want %v", scale, x[i], shift, y[i], e)
			}
			want += float64(y[i])
		}
		if math.Abs(sum-want) > 1e-12*want {
			t.Fatalf("expShiftVec sum = %v, want %v", sum, want)
		}
	}

	xs := x[5:] // without the extremes
	m, sum := expSumVec(xs, 12)
	var want float64
	for _, v := range xs[:m] {
		want += math.Exp(float64(v - 12))
	}
	if math.Abs(sum-want) > 1e-6*want {
		t.Fatalf("expSumVec = %v, want %v", sum, want)
	}

	acc := randF32(r, len(xs), 1)
	acc0 := append([]float32(nil), acc...)
	m = expAxpyVec(acc, xs, 12, -0.5)
	for i := 0; i < m; i++ {
		w := float64(acc0[i]) - 0.5*math.Exp(float64(xs[i]-12))
		if math.Abs(float64(acc[i])-w) > 1e-6*(1+math.Abs(w)) {
			t.Fatalf("expAxpyVec[%d] = %v, want %v", i, acc[i], w)
		}
	}

	sc := append([]float32(nil), xs...)
	m = expScaleVec(sc, 12, 0.25)
	if m == 0 {
		t.Fatal("expScaleVec did nothing")
	}
	for i := 0; i < m; i++ {
		w := 0.25 * math.Exp(float64(xs[i]-12))
		if math.Abs(float64(sc[i])-w) > 1e-6*w {
			t.Fatalf("expScaleVec[%d] = %v, want %v", i, sc[i], w)
		}
	}
	if !bitsEqual(sc[m:], xs[m:]) {
		t.Fatal("expScaleVec wrote past its m elements")
	}

	for _, k := range []int{8, 16, 192} {
		m, got := maxVec(x[5 : 5+k])
		want := float32(math.Inf(-1))
		for _, v := range x[5 : 5+m] {
			want = max(want, v)
		}
		if m != k || got != want {
			t.Fatalf("maxVec over %d = %d, %v, want %d, %v", k, m, got, k, want)
		}
	}

	nan := []float32{float32(math.NaN()), 1, 2, 3, 4, 5, 6, 7}
	expShiftVec(y, nan, 1, 0)
	if y[0] == y[0] || y[1] != float32(math.E) && math.Abs(float64(y[1])-math.E) > 1e-6 {
		t.Fatalf("exp of NaN, 1 = %v, %v", y[0], y[1])
	}
}
