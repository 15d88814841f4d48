package plan

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/hpcrun/hpcrun/internal/atomicfile"
	"github.com/hpcrun/hpcrun/train/config"
)

// This file is the plan's one contact with the machine it runs on: the
// device a rank gets, and for a CPU rank this machine's cores, its memory
// (/proc/meminfo) and the GEMM rate hpcrun bench gemm measured (a file
// in the user's cache directory).

// Share is how a run's ranks share a node: the tasks the node runs, the
// GPUs it has for them (0: none asked) and the cores Slurm gives each
// task (cpus_per_task; 0 counts as 1).
type Share struct {
	TasksPerNode int
	GPUsPerNode  int
	CPUsPerTask  int
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
// node's tasks share it) and of the cores (RankCores), at the GEMM rate a
// core reached in the last hpcrun bench gemm, else the default for two
// cores.
func HostCPU(s Share) Device {
	rate, err := LoadCPURate()
	return hostCPU(s, runtime.NumCPU(), MemTotal(), rate, err == nil)
}

// hostCPU is HostCPU on a machine of numCPU cores and mem bytes, whose
// cached rate is rate when measured.
func hostCPU(s Share, numCPU int, mem int64, rate CPURate, measured bool) Device {
	cores := RankCores(s, numCPU)
	var perCore float64
	var source string
	if measured && rate.Threads > 0 && rate.GFlops > 0 {
		perCore = rate.GFlops * 1e9 / float64(rate.Threads)
		source = fmt.Sprintf("hpcrun bench gemm of %s: %.1f GFLOP/s on %d threads; %s a rank", rate.Measured.Format(time.DateOnly), rate.GFlops, rate.Threads, coresWord(cores))
	} else {
		perCore = DefaultCPUFlops / 2
		source = fmt.Sprintf("default %.0f GFLOP/s for 2 cores (hpcrun bench gemm measures this machine); %s a rank", DefaultCPUFlops/1e9, coresWord(cores))
	}
	return CPU(perCore*cores, mem/int64(max(s.TasksPerNode, 1)), cores, source)
}

// RankCores is the cores a rank has on a machine of numCPU cores: its
// cpus_per_task, or less when the node's tasks oversubscribe the cores (a
// fraction when ranks share one).
func RankCores(s Share, numCPU int) float64 {
	return min(float64(max(s.CPUsPerTask, 1)), float64(numCPU)/float64(max(s.TasksPerNode, 1)))
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

// CPURate is what hpcrun bench gemm leaves for the plan: this machine's
// GEMM rate.
type CPURate struct {
	GFlops   float64   `json:"gflops"` // median over the shapes measured
	Threads  int       `json:"threads"`
	Measured time.Time `json:"measured"`
}

// CPURatePath is where the rate is kept: cpu-gemm.json under hpcrun in
// the user's cache directory.
func CPURatePath() (string, error) {
	dir, err := os.UserCacheDir()
	if err != nil {
		return "", err
	}
	return filepath.Join(dir, "hpcrun", "cpu-gemm.json"), nil
}

// LoadCPURate reads the rate SaveCPURate kept.
func LoadCPURate() (CPURate, error) {
	var c CPURate
	path, err := CPURatePath()
	if err != nil {
		return c, err
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return c, err
	}
	return c, json.Unmarshal(b, &c)
}

// SaveCPURate keeps c for the plans to come, atomically (a plan reading it
// meanwhile sees the old rate or the new one), and says where.
func SaveCPURate(c CPURate) (path string, err error) {
	if path, err = CPURatePath(); err != nil {
		return "", err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return path, err
	}
	b, err := json.Marshal(c)
	if err != nil {
		return path, err
	}
	return path, atomicfile.WriteFile(path, append(b, '\n'), 0o644)
}
