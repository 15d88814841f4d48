package plan

import (
	"cmp"
	"fmt"
	"sort"
	"strings"
	"time"
)

// Device is what the plan needs to know of one rank's device: how much
// memory it has, how fast it multiplies, and how fast its links move bytes.
// The figures are the vendors' nominal ones (dense, no sparsity); Efficiency
// is the share of the GEMM peak a training step's matrix products reach.
type Device struct {
	Name     string `json:"name"`
	MemBytes int64  `json:"mem_bytes"` // the device's memory (as nvidia-smi reports its total)
	CUDA     bool   `json:"cuda"`      // a GPU: the CUDA context and NCCL buffers count
	SMs      int    `json:"sms,omitempty"`
	// FP32Flops and BF16Flops are the peak FLOP/s of float32 and bfloat16
	// (tensor core) matrix products; 0: the device has no such units.
	FP32Flops float64 `json:"fp32_flops"`
	BF16Flops float64 `json:"bf16_flops"`
	// TF32Flops is the dense peak of tf32 tensor-core products (float32
	// operands); 0: none (V100).
	TF32Flops float64 `json:"tf32_flops,omitempty"`
	// FP16Flops is the peak of float16 tensor-core products: the half
	// precision a V100, which has no bf16, trains in (plan at scale).
	FP16Flops float64 `json:"fp16_flops,omitempty"`
	// Efficiency is the fraction of the peak the step's GEMMs reach (1 for
	// a rate that was measured, as the CPU's from hpcrun bench gemm).
	Efficiency float64 `json:"efficiency"`
	// MemBandwidth is bytes/s between the compute units and the memory:
	// it bounds the step's elementwise kernels and the optimizer.
	MemBandwidth float64 `json:"mem_bandwidth"`
	// LinkBandwidth is one rank's bytes/s to its peers inside a node
	// (NVLink, or shared memory for CPU ranks); NetBandwidth across nodes.
	LinkBandwidth float64 `json:"link_bandwidth"`
	NetBandwidth  float64 `json:"net_bandwidth"`
	// Latency is the fixed cost of one collective, in seconds.
	Latency float64 `json:"latency_s"`
	// Wait is how long a rank that shares its cores with other ranks
	// waits at a collective for a peer that is not running, while that
	// peer runs (Time.TurnS); 0 when each rank has its own cores.
	Wait float64 `json:"wait_s,omitempty"`
	// ContextBytes is the CUDA context and library handles (cuBLAS, NCCL)
	// a process holds on the GPU outside the engine's tensors.
	ContextBytes int64 `json:"context_bytes"`
	// Source says where the rates come from.
	Source string `json:"source,omitempty"`

	// A CPU rank's threads (GOMAXPROCS, as the launcher sets it) and the
	// cores they run on (fewer when the node's ranks share them).
	Threads int     `json:"threads,omitempty"`
	Cores   float64 `json:"cores,omitempty"`
	// OptBandwidth is bytes/s of the optimizer's pass (AdamW), when
	// measured apart from MemBandwidth; 0: MemBandwidth.
	OptBandwidth float64 `json:"opt_bandwidth,omitempty"`
	// Rates are the GEMM rates by shape hpcrun bench gemm measured (nil:
	// every GEMM at FP32Flops x Efficiency); Comm the collectives' fits
	// hpcrun bench comm measured (nil, or a path not in it: LinkBandwidth,
	// NetBandwidth and Latency).
	Rates *CPURates  `json:"-"`
	Comm  *CommRates `json:"-"`
	// machine is the one the rates are read on (for their age and CPU).
	machine Machine
	// Warnings say why the plan's time may be off on this machine: a rate
	// not measured, old or measured on another CPU, a busy machine.
	Warnings []string `json:"warnings,omitempty"`
}

// optBandwidth is the optimizer's bytes/s.
func (d Device) optBandwidth() float64 {
	if d.OptBandwidth > 0 {
		return d.OptBandwidth
	}
	return d.MemBandwidth
}

// gemmSeconds is how long the products gs take on d: each at its shape's
// rate when d has measured rates, else all at FP32Flops x Efficiency.
func (d Device) gemmSeconds(gs []GemmCount) float64 {
	if d.Rates == nil {
		return gemmFlops(gs) / (d.FP32Flops * d.Efficiency)
	}
	var s float64
	for _, g := range gs {
		s += g.Flops() * float64(g.Count) / d.Rates.GemmFlops(g.GemmShape, d.Threads, d.Cores)
	}
	return s
}

// linkCost is what a group's collectives cost: a latency each (with the
// skew's fixed part), their bytes at the bus bandwidth (bytes/s) of their
// kind, and the share of the work before them that the ranks wait for the
// slowest (skew); from says where the figures come from, warn (for a CPU
// rank) that the fit is missing, old or of another CPU, and the command
// that measures it.
type linkCost struct {
	latency                             float64
	allReduce, allGather, reduceScatter float64
	skew                                float64
	from, warn                          string
}

// collective is the cost of a collective over n ranks on path (of nodes
// nodes): the fit hpcrun bench comm kept for the path (the nearest number
// of ranks), else the device's figures (NetBandwidth across nodes,
// LinkBandwidth within, no skew).
func (d Device) collective(path string, n, nodes int) linkCost {
	measure := fmt.Sprintf("hpcrun bench comm --nproc %d", max(n, 2))
	switch path {
	case PathTCP:
		measure += " --backend tcp"
	case PathNet:
		k := max(nodes, 2)
		measure = fmt.Sprintf("hpcrun bench comm --nproc %d --nodes %d", (max(n, k)+k-1)/k*k, k)
	}
	if f := d.Comm.Lookup(path, n); f != nil {
		var c linkCost
		switch age := d.machine.Now.Sub(f.Measured); {
		case d.CUDA:
		case !d.machine.Now.IsZero() && age > staleAfter:
			c.warn = fmt.Sprintf("the %s collectives' fit (%d ranks) is %d days old: rerun %s", path, f.NRanks, int(age.Hours()/24), measure)
		case d.machine.CPU != "" && f.CPU != d.machine.CPU:
			c.warn = fmt.Sprintf("the %s collectives' fit (%d ranks) was measured on %q: rerun %s here", path, f.NRanks, f.CPU, measure)
		}
		c.latency, c.skew = f.LatencyS+f.SkewS, f.SkewFrac
		c.allReduce, c.allGather, c.reduceScatter = f.BusGBs*1e9, cmp.Or(f.GatherGBs, f.BusGBs)*1e9, cmp.Or(f.ScatterGBs, f.BusGBs)*1e9
		kinds := fmt.Sprintf("all-gathers %.2f GB/s, reduce-scatters %.2f GB/s", f.GatherGBs, f.ScatterGBs)
		if f.GatherGBs == 0 || f.ScatterGBs == 0 {
			kinds = "all-gathers and reduce-scatters as all-reduces (not measured apart)"
		}
		c.from = fmt.Sprintf("%s %d ranks measured %s (%.0f µs + %.0f µs skew + %.2f GB/s, %s; the slowest rank waited for after %.1f%% of the work)",
			f.Path, f.NRanks, f.Measured.Format(time.DateOnly), f.LatencyS*1e6, f.SkewS*1e6, f.BusGBs, kinds, 100*f.SkewFrac)
		return c
	}
	var c linkCost
	if !d.CUDA {
		c.warn = fmt.Sprintf("the %s collectives are not measured (defaults): run %s", path, measure)
	}
	bw := d.LinkBandwidth
	if path == PathNet {
		bw = d.NetBandwidth
	}
	c.latency, c.allReduce, c.allGather, c.reduceScatter = d.Latency, bw, bw, bw
	c.from = fmt.Sprintf("%s default, not measured (%.0f µs + %.2f GB/s)", path, d.Latency*1e6, bw/1e9)
	if d.CUDA {
		where := "within a node"
		if path == PathNet {
			where = "across nodes"
		}
		c.from = fmt.Sprintf("%s nominal (%.0f µs + %.0f GB/s)", where, d.Latency*1e6, bw/1e9)
	}
	return c
}

const (
	mib = int64(1) << 20
	gib = int64(1) << 30
)

// The GPU table: totals as nvidia-smi reports them, SXM peak rates,
// NVLink per direction, 200 Gb/s InfiniBand between nodes.
var devices = map[string]Device{
	"v100-16": {Name: "v100-16", MemBytes: 16160 * mib, CUDA: true, SMs: 80, FP32Flops: 15.7e12, BF16Flops: 0, FP16Flops: 125e12,
		MemBandwidth: 900e9, LinkBandwidth: 150e9, NetBandwidth: 25e9, Latency: 20e-6, ContextBytes: 400 * mib},
	"v100-32": {Name: "v100-32", MemBytes: 32510 * mib, CUDA: true, SMs: 80, FP32Flops: 15.7e12, BF16Flops: 0, FP16Flops: 125e12,
		MemBandwidth: 900e9, LinkBandwidth: 150e9, NetBandwidth: 25e9, Latency: 20e-6, ContextBytes: 400 * mib},
	"a100-40": {Name: "a100-40", MemBytes: 40960 * mib, CUDA: true, SMs: 108, FP32Flops: 19.5e12, TF32Flops: 156e12, BF16Flops: 312e12, FP16Flops: 312e12,
		MemBandwidth: 1555e9, LinkBandwidth: 300e9, NetBandwidth: 25e9, Latency: 15e-6, ContextBytes: 500 * mib},
	"a100-80": {Name: "a100-80", MemBytes: 81920 * mib, CUDA: true, SMs: 108, FP32Flops: 19.5e12, TF32Flops: 156e12, BF16Flops: 312e12, FP16Flops: 312e12,
		MemBandwidth: 2039e9, LinkBandwidth: 300e9, NetBandwidth: 25e9, Latency: 15e-6, ContextBytes: 500 * mib},
	"h100-80": {Name: "h100-80", MemBytes: 81559 * mib, CUDA: true, SMs: 132, FP32Flops: 67e12, TF32Flops: 494e12, BF16Flops: 989e12, FP16Flops: 989e12,
		MemBandwidth: 3350e9, LinkBandwidth: 450e9, NetBandwidth: 50e9, Latency: 10e-6, ContextBytes: 550 * mib},
	"h200": {Name: "h200", MemBytes: 143771 * mib, CUDA: true, SMs: 132, FP32Flops: 67e12, TF32Flops: 494e12, BF16Flops: 989e12, FP16Flops: 989e12,
		MemBandwidth: 4800e9, LinkBandwidth: 450e9, NetBandwidth: 50e9, Latency: 10e-6, ContextBytes: 550 * mib},
}

// aliases are other names users type for the table's devices.
var aliases = map[string]string{
	"v100": "v100-16", "v100-16gb": "v100-16", "v100-32gb": "v100-32",
	"a100": "a100-80", "a100-40gb": "a100-40", "a100-80gb": "a100-80",
	"h100": "h100-80", "h100-80gb": "h100-80", "h200-141": "h200", "h200-141gb": "h200",
}

// The CPU's figures when nothing was measured: a rate two AVX2/AVX-512
// cores reach in this engine's GEMM, what the elementwise kernels move a
// core, the shared-memory collectives' bandwidth and latency between
// ranks of a node, a 10 Gb/s network between nodes. Ranks that share cores
// (fewer cores than ranks) wait up to oversubscribedWait at a collective
// for a peer that is not running, while it runs: comm that overlaps the
// work (Time.TurnS). Fitted on 4 ranks of tiny and small on 2 cores,
// where small (13 ms of work between collectives) waited 1.9-2.2 ms each.
const (
	DefaultCPUFlops     = 100e9
	cpuMemBWPerCore     = 15e9
	defaultCPULink      = 5e9
	defaultCPULatency   = 10e-6
	oversubscribedWait  = 2e-3
	defaultCPUMemBytes  = 8 * gib
	defaultCPUNetwork   = 1.25e9
	defaultCPUEfficency = 1
)

// CPU is a CPU rank with cores cores (a fraction when ranks share one), a
// GEMM rate of flops FLOP/s for them (0: DefaultCPUFlops, for two cores)
// and memBytes of memory (0: 8 GiB); source says where the rate comes from.
func CPU(flops float64, memBytes int64, cores float64, source string) Device {
	if cores <= 0 {
		cores = 2
	}
	wait := 0.0
	if cores < 1 {
		wait = oversubscribedWait
	}
	if flops <= 0 {
		flops, source = DefaultCPUFlops, fmt.Sprintf("default %.0f GFLOP/s (run hpcrun bench gemm to measure this machine)", DefaultCPUFlops/1e9)
	}
	if memBytes <= 0 {
		memBytes = defaultCPUMemBytes
	}
	return Device{Name: "cpu", MemBytes: memBytes, FP32Flops: flops, BF16Flops: flops, TF32Flops: flops, Efficiency: defaultCPUEfficency,
		MemBandwidth: cpuMemBWPerCore * cores, LinkBandwidth: defaultCPULink, NetBandwidth: defaultCPUNetwork,
		Latency: defaultCPULatency, Wait: wait, Cores: cores, Source: source}
}

// gpuEfficiency is the share of the peak cuBLAS reaches on a step's GEMMs.
const gpuEfficiency = 0.7

// LookupDevice returns the table's GPU called name (v100-16, v100-32,
// a100-40, a100-80, h100-80, h200, or an alias such as a100-80gb). The CPU
// is not in the table: its figures depend on the machine (see CPU).
func LookupDevice(name string) (Device, error) {
	key := strings.ToLower(strings.TrimSpace(name))
	if a, ok := aliases[key]; ok {
		key = a
	}
	d, ok := devices[key]
	if !ok {
		return Device{}, fmt.Errorf("device %q: use cpu or one of %s", name, strings.Join(DeviceNames(), ", "))
	}
	d.Efficiency = gpuEfficiency
	d.Source = "nominal peak of the table, at 70% for the GEMMs"
	return d, nil
}

// DeviceNames lists the table's GPUs, sorted.
func DeviceNames() []string {
	names := make([]string, 0, len(devices))
	for n := range devices {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}
