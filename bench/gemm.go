package bench

import (
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/hpcrun/hpcrun/internal/stats"
	"github.com/hpcrun/hpcrun/tensor"
)

// DefaultGemmShapes are square sizes and the GEMMs of a GPT-2 small layer
// over 256 tokens, forward and backward.
var DefaultGemmShapes = []tensor.GemmShape{
	{M: 256, N: 256, K: 256},
	{M: 768, N: 768, K: 768},
	{M: 1024, N: 1024, K: 1024},
	{M: 2048, N: 2048, K: 2048},
	{M: 256, N: 3072, K: 768},               // mlp.c_fc
	{M: 256, N: 768, K: 3072},               // mlp.c_proj
	{M: 256, N: 2304, K: 768},               // attn.c_attn
	{M: 256, N: 768, K: 3072, TransB: true}, // mlp.c_fc's dX
	{M: 768, N: 3072, K: 256, TransA: true}, // mlp.c_fc's dW
	{M: 256, N: 50304, K: 768},              // the LM head
}

// ParseGemmShape reads "MxNxK", optionally followed by ":tA", ":tB" or
// ":tAtB" (tensor.GemmShape's String).
func ParseGemmShape(s string) (tensor.GemmShape, error) {
	dims, trans, _ := strings.Cut(s, ":")
	parts := strings.Split(dims, "x")
	var sh tensor.GemmShape
	if len(parts) != 3 {
		return sh, fmt.Errorf("--shape %q: want MxNxK such as 256x3072x768", s)
	}
	var v [3]int
	for i, p := range parts {
		n, err := strconv.Atoi(p)
		if err != nil || n < 1 || n > 1<<16 {
			return sh, fmt.Errorf("--shape %q: %q is not a size between 1 and 65536", s, p)
		}
		v[i] = n
	}
	sh.M, sh.N, sh.K = v[0], v[1], v[2]
	switch trans {
	case "":
	case "tA":
		sh.TransA = true
	case "tB":
		sh.TransB = true
	case "tAtB":
		sh.TransA, sh.TransB = true, true
	default:
		return sh, fmt.Errorf("--shape %q: suffix %q is not :tA, :tB or :tAtB", s, trans)
	}
	return sh, nil
}

// ReexecWithOpenBLASCore restarts this process with OPENBLAS_CORETYPE set
// when OpenBLAS did not recognise the CPU and fell back to its generic SSE3
// kernels ("Prescott"), which would make it a strawman peer. The core type
// must be set before the library loads, hence the exec. It picks the
// OpenBLAS kernels that match the widest SIMD our own kernel uses.
func ReexecWithOpenBLASCore(peer *tensor.GemmPeer) error {
	if peer.Core != "Prescott" || os.Getenv("OPENBLAS_CORETYPE") != "" {
		return nil
	}
	core := ""
	switch k := tensor.GemmKernel(); {
	case strings.HasPrefix(k, "avx512"):
		core = "SkylakeX"
	case strings.HasPrefix(k, "avx2"):
		core = "Haswell"
	default:
		return nil
	}
	exe, err := os.Executable()
	if err != nil {
		return fmt.Errorf("find own executable to set OPENBLAS_CORETYPE=%s: %w (set it yourself)", core, err)
	}
	env := append(os.Environ(), "OPENBLAS_CORETYPE="+core)
	err = syscall.Exec(exe, os.Args, env)
	return fmt.Errorf("re-exec with OPENBLAS_CORETYPE=%s: %w (set it yourself)", core, err)
}

type gemmFunc func(transA, transB bool, m, n, k int, alpha float32, a []float32, lda int, b []float32, ldb int, beta float32, c []float32, ldc int)

// timeGemm runs f on the shape until at least minTime has passed and
// returns GFLOP/s.
func timeGemm(f gemmFunc, s tensor.GemmShape, a, b, c []float32, minTime time.Duration) float64 {
	lda, ldb := s.K, s.N
	if s.TransA {
		lda = s.M
	}
	if s.TransB {
		ldb = s.K
	}
	calls := 0
	start := time.Now()
	for time.Since(start) < minTime || calls == 0 {
		f(s.TransA, s.TransB, s.M, s.N, s.K, 1, a, lda, b, ldb, 0, c, s.N)
		calls++
	}
	sec := time.Since(start).Seconds()
	return s.Flops() * float64(calls) / sec / 1e9
}

// benchSettle is the pause before each timed run of one library.
const benchSettle = 150 * time.Millisecond

// Gemm times tensor.Sgemm and peer's sgemm (OpenBLAS; nil when absent)
// alternately on each shape, rounds times of at least minTime each on
// threads threads, and writes a table of the median GFLOP/s of each and the
// median ratio. It returns hpcrun's median rate over the shapes, in
// GFLOP/s (hpcrun plan prices a step by Rates instead).
func Gemm(w io.Writer, shapes []tensor.GemmShape, peer *tensor.GemmPeer, threads, rounds int, minTime time.Duration) (float64, error) {
	tensor.SetGemmThreads(threads)
	defer tensor.SetGemmThreads(0)
	fmt.Fprintf(w, "hpcrun Sgemm: kernel %s, %d threads\n", tensor.GemmKernel(), threads)
	if peer != nil {
		peer.SetThreads(threads)
		fmt.Fprintf(w, "peer: %s, %d threads\n", peer.Name, threads)
	} else {
		fmt.Fprintln(w, "peer: OpenBLAS absent (this binary was built without -tags openblas; rebuild with CGO_ENABLED=1 go run -tags openblas ./cmd/hpcrun bench gemm)")
	}
	fmt.Fprintf(w, "median of %d alternating rounds of >= %v each\n\n", rounds, minTime)
	const row = "%-30s %6v %6v %6v %15v %17v %6v\n"
	fmt.Fprintf(w, row, "shape", "m", "n", "k", "hpcrun GFLOP/s", "OpenBLAS GFLOP/s", "ratio")
	r := rand.New(rand.NewPCG(1, 2))
	var rates []float64 // hpcrun's median GFLOP/s of each shape, for hpcrun plan
	for _, s := range shapes {
		a, b, c := randGemmData(r, s.M*s.K), randGemmData(r, s.K*s.N), make([]float32, s.M*s.N)
		var ours, theirs, ratios []float64
		// One untimed call each warms caches, buffers and worker threads.
		timeGemm(tensor.Sgemm, s, a, b, c, 0)
		if peer != nil {
			timeGemm(peer.Sgemm, s, a, b, c, 0)
		}
		for range rounds {
			// OpenBLAS's idle threads keep spinning for about 0.1 s after a
			// call and would take cores from the next library timed: let
			// each library's threads settle before the other runs.
			time.Sleep(benchSettle)
			g := timeGemm(tensor.Sgemm, s, a, b, c, minTime)
			ours = append(ours, g)
			if peer != nil {
				time.Sleep(benchSettle)
				p := timeGemm(peer.Sgemm, s, a, b, c, minTime)
				theirs = append(theirs, p)
				ratios = append(ratios, g/p)
			}
		}
		rates = append(rates, stats.Median(ours))
		peerCol, ratioCol := "absent", "-"
		if peer != nil {
			peerCol = fmt.Sprintf("%.1f", stats.Median(theirs))
			ratioCol = fmt.Sprintf("%.2f", stats.Median(ratios))
		}
		if _, err := fmt.Fprintf(w, row, s, s.M, s.N, s.K, fmt.Sprintf("%.1f", stats.Median(ours)), peerCol, ratioCol); err != nil {
			return 0, err
		}
	}
	return stats.Median(rates), nil
}

func randGemmData(r *rand.Rand, n int) []float32 {
	s := make([]float32, n)
	for i := range s {
		s[i] = r.Float32()*2 - 1
	}
	return s
}
