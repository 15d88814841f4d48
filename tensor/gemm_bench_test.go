package tensor

import (
	"fmt"
	"math/rand/v2"
	"testing"
)

// gemmBenchShapes are square sizes and the GEMMs of a GPT-2 small layer at
// 256 tokens (m,n,k of C(m,n) = A(m,k)*B(k,n)).
var gemmBenchShapes = []struct {
	name    string
	m, n, k int
}{
	{"256", 256, 256, 256},
	{"768", 768, 768, 768},
	{"1024", 1024, 1024, 1024},
	{"2048", 2048, 2048, 2048},
	{"fc_256x768x3072", 256, 3072, 768},
	{"proj_256x3072x768", 256, 768, 3072},
	{"qkv_256x768x2304", 256, 2304, 768},
	{"lmhead_256x768x50304", 256, 50304, 768},
}

func benchGemm(b *testing.B, f func(transA, transB bool, m, n, k int, alpha float32, a []float32, lda int, b []float32, ldb int, beta float32, c []float32, ldc int)) {
	for _, s := range gemmBenchShapes {
		b.Run(s.name, func(b *testing.B) {
			r := rand.New(rand.NewPCG(1, 1))
			x, y, c := randSlice(r, s.m*s.k), randSlice(r, s.k*s.n), make([]float32, s.m*s.n)
			b.SetBytes(0)
			b.ResetTimer()
			for b.Loop() {
				f(false, false, s.m, s.n, s.k, 1, x, s.k, y, s.n, 0, c, s.n)
			}
			flops := 2 * float64(s.m) * float64(s.n) * float64(s.k) * float64(b.N)
			b.ReportMetric(flops/b.Elapsed().Seconds()/1e9, "GFLOP/s")
		})
	}
}

func BenchmarkSgemm(b *testing.B) {
	defer SetGemmThreads(0)
	SetGemmThreads(2)
	benchGemm(b, Sgemm)
}

func BenchmarkOpenBLAS(b *testing.B) {
	peer, ok := OpenBLASPeer()
	if !ok {
		b.Skip("OpenBLAS peer absent: build with CGO_ENABLED=1 -tags openblas")
	}
	peer.SetThreads(2)
	b.Log(peer.Name)
	benchGemm(b, peer.Sgemm)
}

var _ = fmt.Sprint
