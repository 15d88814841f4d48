package plan

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/hpcrun/hpcrun/internal/atomicfile"
	"github.com/hpcrun/hpcrun/tensor"
)

// This file is the CPU's measured rates, as hpcrun bench gemm keeps them
// (cpu-gemm.json), and how the plan reads a rate off them: a GEMM's
// FLOP/s by its shape, the elementwise kernels' and AdamW's bytes/s, at the
// threads and cores a rank has.

// RatesFormat is the format of cpu-gemm.json this plan reads and writes:
// 2, the table of GEMM shapes and the streaming bandwidths. Format 1 (one
// median GFLOP/s) is refused with ErrOldRates.
const RatesFormat = 2

// ErrOldRates says the cache file is of an older format.
var ErrOldRates = errors.New("cpu-gemm.json is of an older format: rerun hpcrun bench gemm")

// GemmRate is a GEMM shape's measured rate on Threads threads.
type GemmRate struct {
	tensor.GemmShape
	Threads int     `json:"threads"`
	GFlops  float64 `json:"gflops"`
}

// StreamRate is the bandwidth the engine's elementwise kernels reach on
// Threads threads, in GB/s of bytes read and written: Add (out = a + b over
// 64 MiB buffers) and AdamW (weights, gradients and two moments read,
// three written); and ElemGBs, that of a real step's elementwise kernels
// (layer norms, GELU, softmax, residuals, the loss) over the activation
// bytes the plan counts for them, as CalibrateElementwise finds it (0: not
// measured, Add's stands for it).
type StreamRate struct {
	Threads int     `json:"threads"`
	AddGBs  float64 `json:"add_gbs"`
	AdamGBs float64 `json:"adamw_gbs"`
	ElemGBs float64 `json:"elementwise_gbs,omitempty"`
}

// CPURates is what hpcrun bench gemm leaves for the plan: this machine's
// GEMM rates by shape and its streaming bandwidths, each at the thread
// counts measured, with the machine's CPU model and the date.
type CPURates struct {
	Format   int          `json:"format"`
	CPU      string       `json:"cpu"`    // /proc/cpuinfo's model name
	Kernel   string       `json:"kernel"` // tensor.GemmKernel
	Measured time.Time    `json:"measured"`
	Gemms    []GemmRate   `json:"gemms"`
	Stream   []StreamRate `json:"stream"`
}

// Check says what is wrong with r as a table the plan can read.
func (r *CPURates) Check() error {
	if r.Format != RatesFormat {
		if r.Format == 0 {
			return ErrOldRates
		}
		return fmt.Errorf("cpu-gemm.json format %d: this hpcrun reads %d (rerun hpcrun bench gemm)", r.Format, RatesFormat)
	}
	if len(r.Gemms) == 0 || len(r.Stream) == 0 {
		return errors.New("cpu-gemm.json holds no GEMM or no bandwidth: rerun hpcrun bench gemm")
	}
	for _, g := range r.Gemms {
		if g.Threads < 1 || !(g.GFlops > 0) || g.M < 1 || g.N < 1 || g.K < 1 {
			return fmt.Errorf("cpu-gemm.json: bad GEMM rate %+v: rerun hpcrun bench gemm", g)
		}
	}
	for _, s := range r.Stream {
		if s.Threads < 1 || !(s.AddGBs > 0) || !(s.AdamGBs > 0) {
			return fmt.Errorf("cpu-gemm.json: bad bandwidth %+v: rerun hpcrun bench gemm", s)
		}
	}
	return nil
}

// GemmFlops is the FLOP/s of g on a rank running threads threads on cores
// cores (fewer than threads when the rank shares them): the rate measured
// for g's shape, else interpolated in log(FLOPs) between the shapes of its
// kind (batched or not) measured, at the thread counts measured around
// threads (linear in threads; beyond the most, per thread as at the most),
// times cores/threads when the threads share cores.
func (r *CPURates) GemmFlops(g tensor.GemmShape, threads int, cores float64) float64 {
	at := func(t int) float64 { return gemmAt(r.Gemms, g, t) }
	var ts []int
	for _, x := range r.Gemms {
		ts = append(ts, x.Threads)
	}
	return 1e9 * byThreads(ts, at, threads, cores, true)
}

// StreamBandwidth is the bandwidths, in bytes/s, of a step's elementwise
// kernels (ElemGBs where every thread count has it, else Add's) and of
// AdamW, for a rank running threads threads on cores cores (as GemmFlops).
func (r *CPURates) StreamBandwidth(threads int, cores float64) (elementwise, adam float64) {
	var ts []int
	for _, s := range r.Stream {
		ts = append(ts, s.Threads)
	}
	get := func(f func(StreamRate) float64) func(int) float64 {
		return func(t int) float64 {
			for _, s := range r.Stream {
				if s.Threads == t {
					return f(s)
				}
			}
			return 0
		}
	}
	elem := func(s StreamRate) float64 { return s.AddGBs }
	if !slices.ContainsFunc(r.Stream, func(s StreamRate) bool { return s.ElemGBs <= 0 }) {
		elem = func(s StreamRate) float64 { return s.ElemGBs }
	}
	// Memory bandwidth does not grow with threads beyond those measured.
	elementwise = 1e9 * byThreads(ts, get(elem), threads, cores, false)
	adam = 1e9 * byThreads(ts, get(func(s StreamRate) float64 { return s.AdamGBs }), threads, cores, false)
	return elementwise, adam
}

// byThreads reads a rate measured at the thread counts ts (at gives it)
// for threads threads on cores cores: linear between the counts measured,
// outside them per thread as at the nearest count (below; above too when
// perThread, else held there), then times cores/threads when the threads
// share fewer cores.
func byThreads(ts []int, at func(int) float64, threads int, cores float64, perThread bool) float64 {
	slices.Sort(ts)
	ts = slices.Compact(ts)
	if len(ts) == 0 {
		return 0
	}
	threads = max(threads, 1)
	var v float64
	switch i, found := slices.BinarySearch(ts, threads); {
	case found:
		v = at(threads)
	case i == 0:
		v = at(ts[0]) * float64(threads) / float64(ts[0])
	case i == len(ts) && !perThread:
		v = at(ts[i-1])
	case i == len(ts):
		v = at(ts[i-1]) * float64(threads) / float64(ts[i-1])
	default:
		lo, hi := ts[i-1], ts[i]
		f := float64(threads-lo) / float64(hi-lo)
		v = at(lo)*(1-f) + at(hi)*f
	}
	if cores > 0 && cores < float64(threads) {
		v *= cores / float64(threads)
	}
	return v
}

// gemmAt is the GFLOP/s of g at exactly t threads: its shape's, else
// interpolated in log(FLOPs) between the measured shapes of its kind
// (batched or not; any kind when none is), the ends held flat.
func gemmAt(rates []GemmRate, g tensor.GemmShape, t int) float64 {
	g.Batch = max(g.Batch, 1)
	type pt struct{ x, y float64 }
	var same, any []pt
	for _, r := range rates {
		if r.Threads != t {
			continue
		}
		rg := r.GemmShape
		rg.Batch = max(rg.Batch, 1)
		if rg == g {
			return r.GFlops
		}
		p := pt{math.Log(rg.Flops()), r.GFlops}
		any = append(any, p)
		if (rg.Batch > 1) == (g.Batch > 1) {
			same = append(same, p)
		}
	}
	pts := same
	if len(pts) == 0 {
		pts = any
	}
	if len(pts) == 0 {
		return 0
	}
	slices.SortFunc(pts, func(a, b pt) int {
		if a.x != b.x {
			if a.x < b.x {
				return -1
			}
			return 1
		}
		return 0
	})
	// Shapes of equal FLOPs count as one point, their mean.
	merged := pts[:0:0]
	for i := 0; i < len(pts); {
		j, sum := i, 0.0
		for ; j < len(pts) && pts[j].x == pts[i].x; j++ {
			sum += pts[j].y
		}
		merged = append(merged, pt{pts[i].x, sum / float64(j-i)})
		i = j
	}
	x := math.Log(g.Flops())
	switch i, _ := slices.BinarySearchFunc(merged, x, func(p pt, x float64) int {
		switch {
		case p.x < x:
			return -1
		case p.x > x:
			return 1
		}
		return 0
	}); {
	case i < len(merged) && merged[i].x == x:
		return merged[i].y
	case i == 0:
		return merged[0].y
	case i == len(merged):
		return merged[len(merged)-1].y
	default:
		a, b := merged[i-1], merged[i]
		return a.y + (b.y-a.y)*(x-a.x)/(b.x-a.x)
	}
}

// CPURatesPath is where the rates are kept: cpu-gemm.json under hpcrun in
// the user's cache directory.
func CPURatesPath() (string, error) { return cachePath("cpu-gemm.json") }

// cachePath is the file name under hpcrun in the user's cache directory,
// where the measured rates are kept.
func cachePath(name string) (string, error) {
	dir, err := os.UserCacheDir()
	if err != nil {
		return "", err
	}
	return filepath.Join(dir, "hpcrun", name), nil
}

// LoadCPURates reads the rates SaveCPURates kept; ErrOldRates when the
// file is of the old one-rate format.
func LoadCPURates() (*CPURates, error) {
	path, err := CPURatesPath()
	if err != nil {
		return nil, err
	}
	return ReadCPURates(path)
}

// ReadCPURates reads a rates file at path and checks it (CPURates.Check).
func ReadCPURates(path string) (*CPURates, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var r CPURates
	if err := json.Unmarshal(b, &r); err != nil {
		return nil, fmt.Errorf("%s: %w (rerun hpcrun bench gemm)", path, err)
	}
	if err := r.Check(); err != nil {
		return nil, err
	}
	return &r, nil
}

// SaveCPURates keeps r for the plans to come, atomically (a plan reading
// it meanwhile sees the old rates or the new ones), and says where.
func SaveCPURates(r *CPURates) (path string, err error) {
	r.Format = RatesFormat
	if err := r.Check(); err != nil {
		return "", err
	}
	if path, err = CPURatesPath(); err != nil {
		return "", err
	}
	return path, writeJSON(path, r)
}

// writeJSON writes v, indented, to path atomically, making its directory.
func writeJSON(path string, v any) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	b, err := marshalJSON(v)
	if err != nil {
		return err
	}
	return atomicfile.WriteFile(path, b, 0o644)
}

// marshalJSON is v as the cache's files hold it: indented, a last newline.
func marshalJSON(v any) ([]byte, error) {
	b, err := json.MarshalIndent(v, "", " ")
	return append(b, '\n'), err
}

// CPUModel is this machine's CPU ("model name" of /proc/cpuinfo); "" when
// unknown.
func CPUModel() string {
	f, err := os.Open("/proc/cpuinfo")
	if err != nil {
		return ""
	}
	defer f.Close()
	return cpuInfoModel(f)
}

// cpuInfoModel is the first "model name" of a /proc/cpuinfo.
func cpuInfoModel(r io.Reader) string {
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if ok && strings.TrimSpace(k) == "model name" {
			return strings.TrimSpace(v)
		}
	}
	return ""
}
