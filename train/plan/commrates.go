package plan

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/hpcrun/hpcrun/internal/atomicfile"
)

// This file is the collectives' measured cost, as hpcrun bench comm keeps
// it (cpu-comm.json): per path and number of ranks, a latency and a bus
// bandwidth fitted to its all-reduce times, which the plan uses for the
// tensor-, data- and pipeline-parallel communication.

// Comm paths: how the ranks of a group reach each other.
const (
	PathShm = "shm" // one host, the auto backend: shared memory
	PathTCP = "tcp" // one host, the TCP ring only (--backend tcp, comm = "tcp")
	PathNet = "net" // across nodes (TCP ring, hierarchical within the nodes)
)

// CommFit is an all-reduce of b bytes over NRanks ranks on Path taking
// LatencyS + 2(n-1)/n b / (BusGBs 1e9) seconds, as fitted to the times
// hpcrun bench comm measured on Measured.
type CommFit struct {
	Path     string  `json:"path"`
	NRanks   int     `json:"nranks"`
	Nodes    int     `json:"nodes"`
	LatencyS float64 `json:"latency_s"`
	BusGBs   float64 `json:"bus_gbs"`
	// SkewS and SkewFrac are what a collective adds in training after the
	// same w seconds of work on every rank: the wait for the slowest,
	// SkewS + SkewFrac w (hpcrun bench comm measures it after GEMMs of
	// about 1 and 20 ms). A fit without skew_frac in the file (before
	// 2026-11-26 14:50) had SkewS measured after a millisecond of work.
	SkewS    float64 `json:"skew_s,omitempty"`
	SkewFrac float64 `json:"skew_frac"`
	// GatherGBs and ScatterGBs are the bus bandwidths of an all-gather and
	// a reduce-scatter (bus bytes (n-1)/n of the gathered or scattered
	// buffer), their latency the all-reduce's; 0 when not measured
	// (before 2026-11-27): the all-reduce's bandwidth.
	GatherGBs  float64   `json:"allgather_bus_gbs,omitempty"`
	ScatterGBs float64   `json:"reducescatter_bus_gbs,omitempty"`
	MinBytes   int64     `json:"min_bytes"` // the sizes fitted
	MaxBytes   int64     `json:"max_bytes"`
	CPU        string    `json:"cpu"`
	Measured   time.Time `json:"measured"`
}

// CommRatesFormat is the format of cpu-comm.json.
const CommRatesFormat = 1

// CommRates is cpu-comm.json: the latest fit of each path and number of
// ranks.
type CommRates struct {
	Format int       `json:"format"`
	Fits   []CommFit `json:"fits"`
}

// FitComm fits a latency and a bus bandwidth to all-reduce times over n
// ranks (times[b] seconds for b bytes): t = latency + x / bandwidth in bus
// bytes x = 2(n-1)/n b, least squares in relative error (each size counts
// alike, the smallest setting the latency, the largest the bandwidth),
// the latency at least 0.
func FitComm(n int, times map[int64]float64) (latencyS, busGBs float64, lo, hi int64, err error) {
	return fitBus(2*float64(n-1)/float64(n), n, times)
}

// FitGather fits an all-gather's or a reduce-scatter's times over n ranks
// (times[b] seconds for a gathered or scattered buffer of b bytes) as
// FitComm fits an all-reduce's, in bus bytes x = (n-1)/n b.
func FitGather(n int, times map[int64]float64) (latencyS, busGBs float64, lo, hi int64, err error) {
	return fitBus(float64(n-1)/float64(n), n, times)
}

// fitBus fits t = latency + bus x b / bandwidth to times over n ranks.
func fitBus(bus float64, n int, times map[int64]float64) (latencyS, busGBs float64, lo, hi int64, err error) {
	var sizes []int64
	for b, s := range times {
		if s > 0 {
			sizes = append(sizes, b)
		}
	}
	if n < 2 || len(sizes) < 2 {
		return 0, 0, 0, 0, errors.New("comm fit: need 2 ranks or more and 2 sizes or more")
	}
	slices.Sort(sizes)
	lo, hi = sizes[0], sizes[len(sizes)-1]
	var sw, sx, sxx, st, sxt float64
	for _, b := range sizes {
		t := times[b]
		x, w := bus*float64(b), 1/(t*t)
		sw, sx, sxx, st, sxt = sw+w, sx+w*x, sxx+w*x*x, st+w*t, sxt+w*x*t
	}
	slope := (sw*sxt - sx*st) / (sw*sxx - sx*sx)
	latencyS = (st - slope*sx) / sw
	if latencyS < 0 || !(slope > 0) {
		// No latency to see: the bandwidth alone, through the origin.
		latencyS, slope = 0, sxt/sxx
	}
	return latencyS, 1 / slope / 1e9, lo, hi, nil
}

// CommRatesPath is where the fits are kept: cpu-comm.json under hpcrun in
// the user's cache directory.
func CommRatesPath() (string, error) { return cachePath("cpu-comm.json") }

// LoadCommRates reads the fits SaveCommFit kept.
func LoadCommRates() (*CommRates, error) {
	path, err := CommRatesPath()
	if err != nil {
		return nil, err
	}
	return ReadCommRates(path)
}

// ReadCommRates reads a cpu-comm.json at path.
func ReadCommRates(path string) (*CommRates, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	return parseCommRates(path, b)
}

// parseCommRates reads b, the cpu-comm.json at path.
func parseCommRates(path string, b []byte) (*CommRates, error) {
	var r CommRates
	if err := json.Unmarshal(b, &r); err != nil {
		return nil, fmt.Errorf("%s: %w (rerun hpcrun bench comm)", path, err)
	}
	if r.Format != CommRatesFormat {
		return nil, fmt.Errorf("%s: format %d, this hpcrun reads %d (rerun hpcrun bench comm)", path, r.Format, CommRatesFormat)
	}
	for _, f := range r.Fits {
		if f.NRanks < 2 || !(f.BusGBs > 0) || f.LatencyS < 0 || f.Path == "" || f.GatherGBs < 0 || f.ScatterGBs < 0 {
			return nil, fmt.Errorf("%s: bad fit %+v (rerun hpcrun bench comm)", path, f)
		}
	}
	return &r, nil
}

// SaveCommFit keeps f in cpu-comm.json, in place of an older fit of the
// same path and number of ranks, and says where: atomically, and under a
// lock, so that the fits other processes save meanwhile stay beside it.
func SaveCommFit(f CommFit) (path string, err error) {
	if path, err = CommRatesPath(); err != nil {
		return "", err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return "", err
	}
	return path, atomicfile.Update(path, 0o644, func(old []byte) ([]byte, error) {
		r, err := parseCommRates(path, old)
		if err != nil {
			r = &CommRates{}
		}
		return marshalJSON(withFit(r, f))
	})
}

// withFit is r with f in place of its fit of the same path and ranks.
func withFit(r *CommRates, f CommFit) *CommRates {
	r.Format = CommRatesFormat
	r.Fits = slices.DeleteFunc(r.Fits, func(o CommFit) bool { return o.Path == f.Path && o.NRanks == f.NRanks })
	r.Fits = append(r.Fits, f)
	slices.SortFunc(r.Fits, func(a, b CommFit) int {
		if a.Path != b.Path {
			if a.Path < b.Path {
				return -1
			}
			return 1
		}
		return a.NRanks - b.NRanks
	})
	return r
}

// Lookup is the fit for a group of n ranks on path: the one measured with
// n ranks, else the one with the nearest number of ranks; nil when none
// of path was measured.
func (r *CommRates) Lookup(path string, n int) *CommFit {
	if r == nil {
		return nil
	}
	var best *CommFit
	for i, f := range r.Fits {
		if f.Path != path {
			continue
		}
		if best == nil || abs(f.NRanks-n) < abs(best.NRanks-n) {
			best = &r.Fits[i]
		}
	}
	return best
}

func abs(x int) int {
	if x < 0 {
		return -x
	}
	return x
}
