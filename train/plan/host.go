package plan

import (
	"bufio"
	"cmp"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/hpcrun/hpcrun/internal/stats"
	"github.com/hpcrun/hpcrun/train/config"
)

// This file is the plan's one contact with the machine it runs on: the
// device a rank gets, and for a CPU rank this machine's cores, its memory
// (/proc/meminfo) and the GEMM rate hpcrun bench gemm measured (a file
// in the user's cache directory).

// Share is how a run's ranks share a node: the tasks the node runs, the
// GPUs it has for them (0: none asked), the cores Slurm gives each task
// (cpus_per_task; 0: none asked) and who starts the tasks (Launcher),
// which decides the threads a rank runs.
type Share struct {
	TasksPerNode int
	GPUsPerNode  int
	CPUsPerTask  int
	Launcher     Launcher
}

// Launcher is what starts a run's tasks, as far as their threads go.
type Launcher int

const (
	// LaunchSlurm is srun: a task runs cpus_per_task threads (idrenv's
	// LimitThreads reads SLURM_CPUS_PER_TASK), or all the node's when
	// no cpus_per_task is asked.
	LaunchSlurm Launcher = iota
	// LaunchLocal is this machine's launcher (hpcrun run, the Local
	// executor's srun; slurm.Tasks): GOMAXPROCS = its cores / the tasks,
	// at least 1, whatever cpus_per_task says.
	LaunchLocal
)

// RankThreads is the threads (GOMAXPROCS) a rank placed as s runs on a
// machine of numCPU cores, as its launcher sets them.
func RankThreads(s Share, numCPU int) int {
	if s.Launcher == LaunchLocal {
		return max(1, numCPU/max(s.TasksPerNode, 1))
	}
	if s.CPUsPerTask > 0 {
		return min(s.CPUsPerTask, numCPU)
	}
	return numCPU
}

// RankCores is the cores a rank has on a machine of numCPU cores: its
// threads (RankThreads), or less when the node's tasks oversubscribe the
// cores (a fraction when ranks share one).
func RankCores(s Share, numCPU int) float64 {
	return min(float64(RankThreads(s, numCPU)), float64(numCPU)/float64(max(s.TasksPerNode, 1)))
}

// launchWords says how s's launcher sets a rank's threads.
func launchWords(s Share, threads int) string {
	if s.Launcher == LaunchLocal {
		return fmt.Sprintf("GOMAXPROCS %d: the local launcher splits the cores over %s", threads, plural(max(s.TasksPerNode, 1), "task"))
	}
	if s.CPUsPerTask > 0 {
		return fmt.Sprintf("GOMAXPROCS %d: cpus_per_task %d under srun", threads, s.CPUsPerTask)
	}
	return fmt.Sprintf("GOMAXPROCS %d: no cpus_per_task, every task takes all the cores", threads)
}

// RankDevice is the device a rank of a run of cfg placed as s gets: the
// GPU named gpu (a flag or the profile's gpu key), else the CPU of this
// machine (HostCPU) when the run has no GPU. why says, without an error,
// that the run asks for GPUs but names none: there is no plan then.
func RankDevice(gpu string, cfg config.Config, s Share) (d Device, why string, err error) {
	if cfg.Device == "cpu" || strings.EqualFold(gpu, "cpu") {
		return HostCPU(s), "", nil
	}
	if gpu != "" {
		d, err := LookupDevice(gpu)
		return d, "", err
	}
	if s.GPUsPerNode > 0 || cfg.Device == "cuda" {
		return Device{}, fmt.Sprintf("no plan: the run asks for GPUs but none is named: pass --gpu (cpu, %s) or set gpu in the profile", strings.Join(DeviceNames(), ", ")), nil
	}
	return HostCPU(s), "", nil
}

// HostCPU is a CPU rank on this machine: its share of the memory (the
// node's tasks share it) and of the cores (RankThreads, RankCores), at the
// rates hpcrun bench gemm and bench comm measured here (LoadCPURates,
// LoadCommRates), else the defaults; its Warnings say what is not
// measured, old or of another CPU, and whether the machine is busy now.
func HostCPU(s Share) Device {
	rates, err := LoadCPURates()
	comm, _ := LoadCommRates()
	return hostCPU(s, Machine{NumCPU: runtime.NumCPU(), OnlineCPU: OnlineCPUs(), Mem: MemTotal(), CPU: CPUModel(), Load: LoadAverage(), Now: time.Now()}, rates, err, comm)
}

// Machine is what the plan reads of the machine it runs on.
type Machine struct {
	NumCPU int // the cores this process may run on (its cpuset)
	// OnlineCPU are all the machine's cores, which its load average counts
	// the runnable tasks of; 0 unknown: NumCPU.
	OnlineCPU int
	Mem       int64     // bytes; 0 unknown
	CPU       string    // model name; "" unknown
	Load      float64   // 1-minute load average; negative unknown
	Now       time.Time // for the rates' age
}

// defaultRatesSource begins a CPU device's Source when its rates are the
// defaults, busyWarning the warning of a busy machine: a plan kept in
// meta.json says so by them (Check's caveat).
const (
	defaultRatesSource = "default "
	busyWarning        = "this machine is busy "
)

// staleAfter is the age at which a measured rate is called old.
const staleAfter = 30 * 24 * time.Hour

// hostCPU is HostCPU on machine m with the rates read (nil and why when
// none) and the comm fits (nil: none).
func hostCPU(s Share, m Machine, rates *CPURates, why error, comm *CommRates) Device {
	threads, cores := RankThreads(s, m.NumCPU), RankCores(s, m.NumCPU)
	share := fmt.Sprintf("%s a rank (%s)", coresWord(cores), launchWords(s, threads))
	var d Device
	var warn []string
	if rates != nil {
		// The device's nominal rate: the table's median at the rank's threads
		// and cores (what MFU is taken against); each GEMM is priced by its
		// shape (Device.gemmSeconds).
		var at []float64
		for _, g := range rates.Gemms {
			at = append(at, rates.GemmFlops(g.GemmShape, threads, cores))
		}
		d = CPU(stats.Median(at), m.Mem/int64(max(s.TasksPerNode, 1)), cores, "")
		d.MemBandwidth, d.OptBandwidth = rates.StreamBandwidth(threads, cores)
		d.Rates = rates
		d.Source = fmt.Sprintf("hpcrun bench gemm of %s on %q: %d GEMM shapes, the elementwise and AdamW bandwidths at %s threads, read at %s",
			rates.Measured.Format(time.DateOnly), rates.CPU, len(rates.Gemms)/len(threadCounts(rates)), joinInts(threadCounts(rates)), share)
		if age := m.Now.Sub(rates.Measured); age > staleAfter {
			warn = append(warn, fmt.Sprintf("the CPU rates are %d days old: rerun hpcrun bench gemm", int(age.Hours()/24)))
		}
		if ts := threadCounts(rates); len(ts) > 0 && threads > ts[len(ts)-1] {
			warn = append(warn, fmt.Sprintf("a rank runs %d threads, the CPU rates were measured up to %d: rerun hpcrun bench gemm --threads %d", threads, ts[len(ts)-1], threads))
		}
		if m.CPU != "" && rates.CPU != m.CPU {
			warn = append(warn, fmt.Sprintf("the CPU rates were measured on %q, this machine is %q: rerun hpcrun bench gemm here", rates.CPU, m.CPU))
		}
	} else {
		d = CPU(DefaultCPUFlops/2*cores, m.Mem/int64(max(s.TasksPerNode, 1)), cores, "")
		d.Source = fmt.Sprintf(defaultRatesSource+"%.0f GFLOP/s for 2 cores and %.0f GB/s a core, not measured; %s", DefaultCPUFlops/1e9, cpuMemBWPerCore/1e9, share)
		w := "the CPU rates are not measured (defaults): run hpcrun bench gemm"
		if why != nil && !errors.Is(why, os.ErrNotExist) {
			w = "the CPU rates are not measured (defaults): " + why.Error()
		}
		warn = append(warn, w)
	}
	d.Threads, d.Cores, d.Comm, d.machine = threads, cores, comm, m
	if s.Launcher == LaunchSlurm && s.CPUsPerTask == 0 && s.GPUsPerNode == 0 && m.NumCPU > max(s.TasksPerNode, 1) {
		// Slurm's task/none (this repository's local Slurm) lets a task
		// run on every core; task/affinity or task/cgroup bind it to its
		// allocation, one core when none is asked.
		warn = append(warn, fmt.Sprintf("no cpus_per_task: the plan lets each task use all %d cores, as Slurm does without task binding; where Slurm binds tasks (task/affinity, task/cgroup) a task gets 1 core: set --cpus-per-task", m.NumCPU))
	}
	if online := cmp.Or(m.OnlineCPU, m.NumCPU); m.Load > float64(online) {
		warn = append(warn, fmt.Sprintf(busyWarning+"(load average %.1f on %d cores): the measured rates and a run's timing now are both off", m.Load, online))
	}
	d.Warnings = warn
	return d
}

// threadCounts are the thread counts rates measured GEMMs at.
func threadCounts(r *CPURates) []int {
	var ts []int
	for _, g := range r.Gemms {
		if !slices.Contains(ts, g.Threads) {
			ts = append(ts, g.Threads)
		}
	}
	slices.Sort(ts)
	return ts
}

// joinInts is "1,2".
func joinInts(xs []int) string {
	s := make([]string, len(xs))
	for i, x := range xs {
		s[i] = strconv.Itoa(x)
	}
	return strings.Join(s, ",")
}

// OnlineCPUs is the number of this machine's online cores
// (/sys/devices/system/cpu/online, e.g. "0-63" or "0-3,8-11"), whatever
// cpuset this process runs in; 0 when unknown.
func OnlineCPUs() int {
	b, err := os.ReadFile("/sys/devices/system/cpu/online")
	if err != nil {
		return 0
	}
	return countCPUList(strings.TrimSpace(string(b)))
}

// countCPUList counts the cores of a kernel CPU list ("0-3,8,10-11": 7);
// 0 when it is not one.
func countCPUList(list string) int {
	n := 0
	for _, part := range strings.Split(list, ",") {
		lo, hi, isRange := strings.Cut(part, "-")
		a, err := strconv.Atoi(lo)
		b := a
		if err == nil && isRange {
			b, err = strconv.Atoi(hi)
		}
		if err != nil || b < a || a < 0 {
			return 0
		}
		n += b - a + 1
	}
	return n
}

// LoadAverage is this machine's 1-minute load average (/proc/loadavg);
// -1 when unknown.
func LoadAverage() float64 {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return -1
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return -1
	}
	v, err := strconv.ParseFloat(f[0], 64)
	if err != nil {
		return -1
	}
	return v
}

// coresWord is a number of cores to two digits: "1 core", "0.5 core",
// "8 cores".
func coresWord(n float64) string {
	if n <= 1 {
		return fmt.Sprintf("%.2g core", n)
	}
	return fmt.Sprintf("%.2g cores", n)
}

// MemTotal is this machine's memory (MemTotal of /proc/meminfo); 0 when
// unknown.
func MemTotal() int64 {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return 0
	}
	defer f.Close()
	return memInfoTotal(f)
}

// memInfoTotal is the MemTotal line of a /proc/meminfo, in bytes; 0 when
// absent.
func memInfoTotal(r io.Reader) int64 {
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		if f := strings.Fields(sc.Text()); len(f) >= 2 && f[0] == "MemTotal:" {
			kb, _ := strconv.ParseInt(f[1], 10, 64)
			return kb * 1024
		}
	}
	return 0
}
