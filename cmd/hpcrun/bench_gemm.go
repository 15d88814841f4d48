package main

import (
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/hpcrun/hpcrun/tensor"
	"github.com/hpcrun/hpcrun/train/plan"
	"github.com/urfave/cli/v2"
)

// gemmShape is one benchmarked product C(m,n) = op(A)*op(B) with k inner.
type gemmShape struct {
	name           string
	m, n, k        int
	transA, transB bool
}

// defaultGemmShapes are square sizes and the GEMMs of a GPT-2 small layer
// over 256 tokens, forward and backward.
var defaultGemmShapes = []gemmShape{
	{name: "square 256", m: 256, n: 256, k: 256},
	{name: "square 768", m: 768, n: 768, k: 768},
	{name: "square 1024", m: 1024, n: 1024, k: 1024},
	{name: "square 2048", m: 2048, n: 2048, k: 2048},
	{name: "fc 256x768 @ 768x3072", m: 256, n: 3072, k: 768},
	{name: "proj 256x3072 @ 3072x768", m: 256, n: 768, k: 3072},
	{name: "qkv 256x768 @ 768x2304", m: 256, n: 2304, k: 768},
	{name: "fc dX 256x3072 @ (768x3072)T", m: 256, n: 768, k: 3072, transB: true},
	{name: "fc dW (256x768)T @ 256x3072", m: 768, n: 3072, k: 256, transA: true},
	{name: "lm-head 256x768 @ 768x50304", m: 256, n: 50304, k: 768},
}

func benchGemmCommand() *cli.Command {
	return &cli.Command{
		Name:  "gemm",
		Usage: "GEMM GFLOP/s next to OpenBLAS sgemm, measured in the same run",
		Description: "Times tensor.Sgemm and OpenBLAS cblas_sgemm alternately on square and transformer\n" +
			"shapes and prints the median GFLOP/s of each and the median ratio of the rounds.\n" +
			"OpenBLAS is present only in a binary built with CGO_ENABLED=1 -tags openblas.",
		Flags: []cli.Flag{
			&cli.IntFlag{Name: "threads", Value: 2, Usage: "threads for both libraries"},
			&cli.IntFlag{Name: "rounds", Value: 5, Usage: "alternating rounds per shape (the median is reported)"},
			&cli.DurationFlag{Name: "min-time", Value: 200 * time.Millisecond, Usage: "least time one library runs a shape per round"},
			&cli.StringSliceFlag{Name: "shape", Usage: "benchmark `MxNxK` instead of the default shapes (repeatable)"},
			&cli.BoolFlag{Name: "quick", Usage: "skip the 2048 and lm-head shapes"},
		},
		Action: func(c *cli.Context) error {
			threads, rounds, minTime := c.Int("threads"), c.Int("rounds"), c.Duration("min-time")
			if threads < 1 {
				return cli.Exit(fmt.Sprintf("bench gemm: --threads %d: give at least 1", threads), 2)
			}
			if rounds < 1 {
				return cli.Exit(fmt.Sprintf("bench gemm: --rounds %d: give at least 1", rounds), 2)
			}
			if minTime <= 0 {
				return cli.Exit(fmt.Sprintf("bench gemm: --min-time %v: give a positive duration such as 200ms", minTime), 2)
			}
			shapes := defaultGemmShapes
			if specs := c.StringSlice("shape"); len(specs) > 0 {
				shapes = nil
				for _, s := range specs {
					sh, err := parseGemmShape(s)
					if err != nil {
						return cli.Exit("bench gemm: "+err.Error(), 2)
					}
					shapes = append(shapes, sh)
				}
			} else if c.Bool("quick") {
				shapes = slices.DeleteFunc(slices.Clone(shapes), func(s gemmShape) bool {
					return s.m*s.n*s.k > 1<<30
				})
			}
			peer, ok := tensor.OpenBLASPeer()
			if ok {
				if err := reexecWithOpenBLASCore(peer); err != nil {
					return cli.Exit("bench gemm: "+err.Error(), 1)
				}
			} else {
				peer = nil
			}
			return runGemmBench(c.App.Writer, shapes, peer, threads, rounds, minTime)
		},
	}
}

// parseGemmShape reads "MxNxK", optionally followed by ":tA", ":tB" or ":tAtB".
func parseGemmShape(s string) (gemmShape, error) {
	dims, trans, _ := strings.Cut(s, ":")
	parts := strings.Split(dims, "x")
	sh := gemmShape{name: s}
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
	sh.m, sh.n, sh.k = v[0], v[1], v[2]
	switch trans {
	case "":
	case "tA":
		sh.transA = true
	case "tB":
		sh.transB = true
	case "tAtB":
		sh.transA, sh.transB = true, true
	default:
		return sh, fmt.Errorf("--shape %q: suffix %q is not :tA, :tB or :tAtB", s, trans)
	}
	return sh, nil
}

// reexecWithOpenBLASCore restarts this process with OPENBLAS_CORETYPE set
// when OpenBLAS did not recognise the CPU and fell back to its generic SSE3
// kernels ("Prescott"), which would make it a strawman peer. The core type
// must be set before the library loads, hence the exec. It picks the
// OpenBLAS kernels that match the widest SIMD our own kernel uses.
func reexecWithOpenBLASCore(peer *tensor.GemmPeer) error {
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
func timeGemm(f gemmFunc, s gemmShape, a, b, c []float32, minTime time.Duration) float64 {
	lda, ldb := s.k, s.n
	if s.transA {
		lda = s.m
	}
	if s.transB {
		ldb = s.k
	}
	calls := 0
	start := time.Now()
	for time.Since(start) < minTime || calls == 0 {
		f(s.transA, s.transB, s.m, s.n, s.k, 1, a, lda, b, ldb, 0, c, s.n)
		calls++
	}
	sec := time.Since(start).Seconds()
	return 2 * float64(s.m) * float64(s.n) * float64(s.k) * float64(calls) / sec / 1e9
}

func median(x []float64) float64 {
	s := slices.Clone(x)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// benchSettle is the pause before each timed run of one library.
const benchSettle = 150 * time.Millisecond

func runGemmBench(w io.Writer, shapes []gemmShape, peer *tensor.GemmPeer, threads, rounds int, minTime time.Duration) error {
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
		a, b, c := randGemmData(r, s.m*s.k), randGemmData(r, s.k*s.n), make([]float32, s.m*s.n)
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
		rates = append(rates, median(ours))
		peerCol, ratioCol := "absent", "-"
		if peer != nil {
			peerCol = fmt.Sprintf("%.1f", median(theirs))
			ratioCol = fmt.Sprintf("%.2f", median(ratios))
		}
		if _, err := fmt.Fprintf(w, row, s.name, s.m, s.n, s.k, fmt.Sprintf("%.1f", median(ours)), peerCol, ratioCol); err != nil {
			return err
		}
	}
	return saveCPURate(w, median(rates), threads)
}

// saveCPURate keeps the GEMM rate bench gemm measured, for hpcrun plan,
// and says where; a rate that cannot be kept is only mentioned.
func saveCPURate(w io.Writer, gflops float64, threads int) error {
	if !(gflops > 0) {
		return nil
	}
	path, err := plan.SaveCPURate(plan.CPURate{GFlops: gflops, Threads: threads, Measured: time.Now().UTC()})
	if err != nil {
		_, err = fmt.Fprintf(w, "\nhpcrun plan keeps the default CPU rate: %v\n", err)
		return err
	}
	_, err = fmt.Fprintf(w, "\nhpcrun plan will use %.1f GFLOP/s on %d threads (the median of the shapes), kept in %s\n", gflops, threads, path)
	return err
}

func randGemmData(r *rand.Rand, n int) []float32 {
	s := make([]float32, n)
	for i := range s {
		s[i] = r.Float32()*2 - 1
	}
	return s
}
