package idrenv

import (
	"fmt"
	"hash/fnv"
	"os"
	"strconv"
	"strings"
)

// Source says which launcher's variables an Env was read from.
type Source string

// The sources, in the order Detect tries them.
const (
	Torchrun  Source = "torchrun"   // TORCHELASTIC_RUN_ID is set: torchrun's RANK, WORLD_SIZE, ... win
	SlurmStep Source = "slurm-step" // inside srun: SLURM_STEP_* variables
	SlurmJob  Source = "slurm-job"  // a task with only job-level SLURM_* variables
	Single    Source = "single"     // no launcher: one process
)

// Master ports derived from a job id lie in [PortBase, PortBase+PortSpan):
// port = PortBase + id mod PortSpan for a numeric SLURM_JOB_ID (which is
// unique per array task), or PortBase + fnv32a(id) mod PortSpan for another
// id. Jobs sharing a node get different ports unless their ids differ by a
// multiple of PortSpan. The range sits below Linux's ephemeral ports
// (32768-60999), so outgoing connections do not take it.
const (
	PortBase = 20000
	PortSpan = 10000
)

// Env is who this process is inside its job.
type Env struct {
	Source         Source   `json:"source"`
	Rank           int      `json:"rank"`             // global rank, 0..WorldSize-1
	WorldSize      int      `json:"world_size"`       // tasks in the step (or torchrun world)
	LocalRank      int      `json:"local_rank"`       // rank among the tasks on this node
	LocalWorldSize int      `json:"local_world_size"` // tasks on this node
	NodeRank       int      `json:"node_rank"`        // index of this node in Nodes
	NumNodes       int      `json:"num_nodes"`
	Node           string   `json:"node"`                     // this node's name
	Nodes          []string `json:"nodes,omitempty"`          // the step's nodes, expanded; nil under torchrun
	TasksPerNode   []int    `json:"tasks_per_node,omitempty"` // parallel to Nodes
	MasterAddr     string   `json:"master_addr"`              // first node of the step
	MasterPort     int      `json:"master_port"`              // 0: any free port (a single process without a job)
	IsMaster       bool     `json:"is_master"`                // Rank == 0
	JobID          string   `json:"job_id,omitempty"`         // array tasks as A_T
	StepID         string   `json:"step_id,omitempty"`
	RestartCount   int      `json:"restart_count"` // SLURM_RESTART_COUNT or TORCHELASTIC_RESTART_COUNT
	CPUsPerTask    int      `json:"cpus_per_task"` // 0: the launcher did not say
	// GPU is the CUDA ordinal this process should use, -1 when the launcher
	// made no GPU visible. When the launcher says nothing about GPUs it is
	// LocalRank; use GPUOrdinal to fold it onto the devices present.
	GPU  int      `json:"gpu"`
	GPUs []string `json:"gpus,omitempty"` // the devices as the launcher names them
}

// GPUOrdinal returns the device to use when count devices are visible to
// the process: GPU modulo count, or -1 when there is no GPU to use.
func (e Env) GPUOrdinal(count int) int {
	if e.GPU < 0 || count <= 0 {
		return -1
	}
	return e.GPU % count
}

// Options are the caller's settings for detection.
type Options struct {
	// MasterPort, when non-zero, replaces the port derived from the job id
	// (it comes from configuration). MASTER_PORT in the environment wins
	// over it; torchrun's MASTER_PORT always does.
	MasterPort int
	// Hostname names this machine where no node list does (a single process,
	// torchrun). Empty means os.Hostname.
	Hostname string
}

// LookupFunc reads one environment variable; ok is false when it is unset.
// os.LookupEnv is one.
type LookupFunc func(key string) (value string, ok bool)

// Environ returns a LookupFunc over KEY=VALUE pairs, as in os.Environ or
// exec.Cmd.Env; a later pair for the same key wins.
func Environ(pairs []string) LookupFunc {
	m := make(map[string]string, len(pairs))
	for _, p := range pairs {
		if k, v, ok := strings.Cut(p, "="); ok {
			m[k] = v
		}
	}
	return func(k string) (string, bool) { v, ok := m[k]; return v, ok }
}

// Detect reads this process's environment; see DetectFrom.
func Detect() (Env, error) {
	return DetectFrom(os.LookupEnv, Options{})
}

// DetectFrom works out who this process is from the variables lookup
// returns. Torchrun's variables win when TORCHELASTIC_RUN_ID is set; then
// srun's step variables (SLURM_STEP_NUM_TASKS, SLURM_STEP_NODELIST,
// SLURM_STEP_TASKS_PER_NODE) with SLURM_PROCID, SLURM_LOCALID and
// SLURM_NODEID; then the job-level ones (SLURM_NTASKS, SLURM_JOB_NODELIST,
// SLURM_TASKS_PER_NODE) when a task id is set; otherwise this is a single
// process. Missing or inconsistent variables give an error naming them.
func DetectFrom(lookup LookupFunc, opt Options) (Env, error) {
	r := reader{lookup}
	var (
		e   Env
		err error
	)
	switch {
	case r.has("TORCHELASTIC_RUN_ID"):
		e, err = r.torchrun(opt)
	case r.has(stepNames.tasks[0], stepNames.nodelist[0], stepNames.perNode[0]):
		e, err = r.slurm(stepNames)
	case r.has("SLURM_PROCID", "SLURM_LOCALID", "SLURM_NODEID"):
		e, err = r.slurm(jobNames)
	default:
		e, err = r.single(opt)
	}
	if err != nil {
		return Env{}, fmt.Errorf("%s environment: %w", e.Source, err)
	}
	if err := r.common(&e, opt); err != nil {
		return Env{}, fmt.Errorf("%s environment: %w", e.Source, err)
	}
	e.IsMaster = e.Rank == 0
	return e, nil
}

// slurmNames are the variables of one Slurm level; each field lists
// aliases, preferred first.
type slurmNames struct {
	source                            Source
	tasks, nodelist, perNode, nodeNum []string
}

var (
	stepNames = slurmNames{SlurmStep,
		[]string{"SLURM_STEP_NUM_TASKS"}, []string{"SLURM_STEP_NODELIST"},
		[]string{"SLURM_STEP_TASKS_PER_NODE"}, []string{"SLURM_STEP_NUM_NODES"}}
	jobNames = slurmNames{SlurmJob,
		[]string{"SLURM_NTASKS", "SLURM_NPROCS"}, []string{"SLURM_JOB_NODELIST", "SLURM_NODELIST"},
		[]string{"SLURM_TASKS_PER_NODE"}, []string{"SLURM_JOB_NUM_NODES", "SLURM_NNODES"}}
)

type reader struct{ lookup LookupFunc }

// has reports whether any of names is set.
func (r reader) has(names ...string) bool {
	for _, n := range names {
		if _, ok := r.lookup(n); ok {
			return true
		}
	}
	return false
}

// first returns the first of the aliases that is set.
func (r reader) first(aliases []string) (name, val string, ok bool) {
	for _, n := range aliases {
		if v, ok := r.lookup(n); ok {
			return n, v, true
		}
	}
	return aliases[0], "", false
}

// count parses a non-negative integer variable.
func count(name, val string) (int, error) {
	v, err := strconv.Atoi(strings.TrimSpace(val))
	if err != nil || v < 0 {
		return 0, fmt.Errorf("%s=%q is not a non-negative integer", name, val)
	}
	return v, nil
}

// missing returns those of names that are unset.
func (r reader) missing(names ...string) []string {
	var out []string
	for _, n := range names {
		if !r.has(n) {
			out = append(out, n)
		}
	}
	return out
}

// ints parses the listed variables, all set, as non-negative integers.
func (r reader) ints(names ...string) ([]int, error) {
	vals := make([]int, len(names))
	for i, n := range names {
		v, _ := r.lookup(n)
		c, err := count(n, v)
		if err != nil {
			return nil, err
		}
		vals[i] = c
	}
	return vals, nil
}

func (r reader) slurm(names slurmNames) (Env, error) {
	e := Env{Source: names.source}
	nlName, nlVal, nlOK := r.first(names.nodelist)
	pnName, pnVal, pnOK := r.first(names.perNode)
	var missing []string
	if !nlOK {
		missing = append(missing, nlName)
	}
	if !pnOK {
		missing = append(missing, pnName)
	}
	missing = append(missing, r.missing("SLURM_PROCID", "SLURM_LOCALID", "SLURM_NODEID")...)
	if len(missing) > 0 {
		return e, fmt.Errorf("missing %s (start tasks with srun)", strings.Join(missing, ", "))
	}
	ids, err := r.ints("SLURM_PROCID", "SLURM_LOCALID", "SLURM_NODEID")
	if err != nil {
		return e, err
	}
	e.Rank, e.LocalRank, e.NodeRank = ids[0], ids[1], ids[2]

	if e.Nodes, err = ExpandHostlist(nlVal); err != nil {
		return e, fmt.Errorf("%s: %w", nlName, err)
	}
	if len(e.Nodes) == 0 {
		return e, fmt.Errorf("%s=%q names no node", nlName, nlVal)
	}
	if e.TasksPerNode, err = ExpandTasksPerNode(pnVal); err != nil {
		return e, fmt.Errorf("%s: %w", pnName, err)
	}
	if len(e.TasksPerNode) != len(e.Nodes) {
		return e, fmt.Errorf("%s=%s gives counts for %d nodes but %s=%s has %d",
			pnName, pnVal, len(e.TasksPerNode), nlName, nlVal, len(e.Nodes))
	}
	e.NumNodes = len(e.Nodes)
	if n, v, ok := r.first(names.nodeNum); ok {
		c, err := count(n, v)
		if err != nil {
			return e, err
		}
		if c != e.NumNodes {
			return e, fmt.Errorf("%s=%d but %s=%s has %d nodes", n, c, nlName, nlVal, e.NumNodes)
		}
	}
	sum := 0
	for _, c := range e.TasksPerNode {
		sum += c
	}
	e.WorldSize = sum
	if n, v, ok := r.first(names.tasks); ok {
		c, err := count(n, v)
		if err != nil {
			return e, err
		}
		if c != sum {
			return e, fmt.Errorf("%s=%d but %s=%s adds up to %d", n, c, pnName, pnVal, sum)
		}
	}
	tasksName := names.tasks[0]
	if e.Rank >= e.WorldSize {
		return e, fmt.Errorf("SLURM_PROCID=%d is not below the world size %d (%s)", e.Rank, e.WorldSize, tasksName)
	}
	if e.NodeRank >= e.NumNodes {
		return e, fmt.Errorf("SLURM_NODEID=%d is not below the %d nodes of %s", e.NodeRank, e.NumNodes, nlName)
	}
	e.Node = e.Nodes[e.NodeRank]
	e.LocalWorldSize = e.TasksPerNode[e.NodeRank]
	if e.LocalRank >= e.LocalWorldSize {
		return e, fmt.Errorf("SLURM_LOCALID=%d is not below the %d tasks %s gives node %d (%s)",
			e.LocalRank, e.LocalWorldSize, pnName, e.NodeRank, e.Node)
	}
	if host, ok := r.lookup("SLURMD_NODENAME"); ok && host != e.Node {
		return e, fmt.Errorf("SLURMD_NODENAME=%s but node %d (SLURM_NODEID) of %s is %s", host, e.NodeRank, nlName, e.Node)
	}
	if gtids, ok := r.lookup("SLURM_GTIDS"); ok {
		if err := checkGTIDs(gtids, e, pnName); err != nil {
			return e, err
		}
	}
	e.MasterAddr = e.Nodes[0]
	return e, nil
}

// checkGTIDs checks SLURM_GTIDS, the global ranks on this node. It catches
// the batch script itself, which sees the job's task counts but is one
// process.
func checkGTIDs(gtids string, e Env, pnName string) error {
	var n int
	found := false
	for _, f := range strings.Split(gtids, ",") {
		v, err := count("SLURM_GTIDS", f)
		if err != nil {
			return fmt.Errorf("SLURM_GTIDS=%q is not a list of ranks", gtids)
		}
		n++
		found = found || v == e.Rank
	}
	if n != e.LocalWorldSize {
		return fmt.Errorf("SLURM_GTIDS=%s lists %d tasks on this node but %s gives %d (is this the batch script? start tasks with srun)",
			gtids, n, pnName, e.LocalWorldSize)
	}
	if !found {
		return fmt.Errorf("SLURM_GTIDS=%s does not hold SLURM_PROCID=%d", gtids, e.Rank)
	}
	return nil
}

func (r reader) torchrun(opt Options) (Env, error) {
	e := Env{Source: Torchrun}
	if m := r.missing("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"); len(m) > 0 {
		return e, fmt.Errorf("TORCHELASTIC_RUN_ID is set but %s is missing", strings.Join(m, ", "))
	}
	vals, err := r.ints("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")
	if err != nil {
		return e, err
	}
	e.Rank, e.WorldSize, e.LocalRank, e.LocalWorldSize = vals[0], vals[1], vals[2], vals[3]
	e.MasterAddr, _ = r.lookup("MASTER_ADDR")
	if e.MasterAddr == "" {
		return e, fmt.Errorf("MASTER_ADDR is empty")
	}
	mp, _ := r.lookup("MASTER_PORT")
	if e.MasterPort, err = port("MASTER_PORT", mp); err != nil {
		return e, err
	}
	if e.WorldSize == 0 || e.LocalWorldSize == 0 {
		return e, fmt.Errorf("WORLD_SIZE=%d and LOCAL_WORLD_SIZE=%d must be positive", e.WorldSize, e.LocalWorldSize)
	}
	if e.Rank >= e.WorldSize {
		return e, fmt.Errorf("RANK=%d is not below WORLD_SIZE=%d", e.Rank, e.WorldSize)
	}
	if e.LocalRank >= e.LocalWorldSize {
		return e, fmt.Errorf("LOCAL_RANK=%d is not below LOCAL_WORLD_SIZE=%d", e.LocalRank, e.LocalWorldSize)
	}
	if e.LocalWorldSize > e.WorldSize {
		return e, fmt.Errorf("LOCAL_WORLD_SIZE=%d is above WORLD_SIZE=%d", e.LocalWorldSize, e.WorldSize)
	}
	e.NumNodes = (e.WorldSize + e.LocalWorldSize - 1) / e.LocalWorldSize
	e.NodeRank = e.Rank / e.LocalWorldSize
	if v, ok := r.lookup("GROUP_WORLD_SIZE"); ok {
		if e.NumNodes, err = count("GROUP_WORLD_SIZE", v); err != nil {
			return e, err
		}
	}
	if v, ok := r.lookup("GROUP_RANK"); ok {
		if e.NodeRank, err = count("GROUP_RANK", v); err != nil {
			return e, err
		}
	}
	if e.NodeRank >= e.NumNodes {
		return e, fmt.Errorf("GROUP_RANK=%d is not below GROUP_WORLD_SIZE=%d", e.NodeRank, e.NumNodes)
	}
	e.Node = hostname(opt)
	if v, ok := r.lookup("TORCHELASTIC_RESTART_COUNT"); ok {
		if e.RestartCount, err = count("TORCHELASTIC_RESTART_COUNT", v); err != nil {
			return e, err
		}
	}
	return e, nil
}

func (r reader) single(opt Options) (Env, error) {
	host := hostname(opt)
	return Env{
		Source: Single, WorldSize: 1, LocalWorldSize: 1, NumNodes: 1,
		Node: host, Nodes: []string{host}, TasksPerNode: []int{1},
		MasterAddr: "127.0.0.1",
	}, nil
}

func hostname(opt Options) string {
	if opt.Hostname != "" {
		return opt.Hostname
	}
	if h, err := os.Hostname(); err == nil && h != "" {
		return h
	}
	return "localhost"
}

// common fills what every source shares: job and step ids, restart count,
// CPUs, the master port (except under torchrun) and the GPU.
func (r reader) common(e *Env, opt Options) error {
	jobName, jobID, hasJob := r.first([]string{"SLURM_JOB_ID", "SLURM_JOBID"})
	if hasJob && jobID == "" {
		return fmt.Errorf("%s is set but empty", jobName)
	}
	e.JobID = jobID
	arrayJob, okA := r.lookup("SLURM_ARRAY_JOB_ID")
	arrayTask, okT := r.lookup("SLURM_ARRAY_TASK_ID")
	if okA && okT && arrayJob != "" && arrayTask != "" {
		e.JobID = arrayJob + "_" + arrayTask
	}
	if _, v, ok := r.first([]string{"SLURM_STEP_ID", "SLURM_STEPID"}); ok && e.Source != Single {
		e.StepID = v
	}
	if e.Source != Torchrun {
		if v, ok := r.lookup("SLURM_RESTART_COUNT"); ok {
			c, err := count("SLURM_RESTART_COUNT", v)
			if err != nil {
				return err
			}
			e.RestartCount = c
		}
	}
	if err := r.cpus(e); err != nil {
		return err
	}
	if e.Source != Torchrun {
		p, err := r.masterPort(opt, jobName, jobID, hasJob)
		if err != nil {
			return err
		}
		e.MasterPort = p
	}
	return r.gpu(e)
}

// masterPort picks MASTER_PORT, then the configured port, then the port
// derived from the job id; a single process without a job gets 0.
func (r reader) masterPort(opt Options, jobName, jobID string, hasJob bool) (int, error) {
	if v, ok := r.lookup("MASTER_PORT"); ok {
		return port("MASTER_PORT", v)
	}
	if opt.MasterPort != 0 {
		if opt.MasterPort < 1 || opt.MasterPort > 65535 {
			return 0, fmt.Errorf("configured master port %d is not a port (1-65535)", opt.MasterPort)
		}
		return opt.MasterPort, nil
	}
	if !hasJob {
		return 0, nil
	}
	return DerivePort(jobID), nil
}

// DerivePort is the master port for a job id; see PortBase.
func DerivePort(jobID string) int {
	if n, err := strconv.ParseUint(jobID, 10, 64); err == nil {
		return PortBase + int(n%PortSpan)
	}
	h := fnv.New32a()
	h.Write([]byte(jobID))
	return PortBase + int(h.Sum32()%PortSpan)
}

func port(name, val string) (int, error) {
	p, err := strconv.Atoi(strings.TrimSpace(val))
	if err != nil || p < 1 || p > 65535 {
		return 0, fmt.Errorf("%s=%q is not a port (1-65535)", name, val)
	}
	return p, nil
}

// cpus reads SLURM_CPUS_PER_TASK, or shares SLURM_CPUS_ON_NODE among the
// tasks of this node.
func (r reader) cpus(e *Env) error {
	if v, ok := r.lookup("SLURM_CPUS_PER_TASK"); ok {
		c, err := count("SLURM_CPUS_PER_TASK", v)
		if err != nil {
			return err
		}
		if c == 0 {
			return fmt.Errorf("SLURM_CPUS_PER_TASK=0: want at least 1")
		}
		e.CPUsPerTask = c
		return nil
	}
	if e.Source != SlurmStep && e.Source != SlurmJob {
		return nil
	}
	if v, ok := r.lookup("SLURM_CPUS_ON_NODE"); ok {
		c, err := count("SLURM_CPUS_ON_NODE", v)
		if err != nil {
			return err
		}
		e.CPUsPerTask = max(1, c/e.LocalWorldSize)
	}
	return nil
}

// gpu picks the ordinal: CUDA_VISIBLE_DEVICES renumbers the devices it
// lists from 0, so the ordinal is the local rank modulo their count.
// SLURM_STEP_GPUS and SLURM_JOB_GPUS hold the node's global device ids;
// without CUDA_VISIBLE_DEVICES every device is visible and those ids are
// the ordinals.
func (r reader) gpu(e *Env) error {
	if cvd, ok := r.lookup("CUDA_VISIBLE_DEVICES"); ok {
		list := splitList(cvd)
		if len(list) == 0 || list[0] == "NoDevFiles" || strings.HasPrefix(list[0], "-") {
			e.GPU, e.GPUs = -1, nil
			return nil
		}
		e.GPU, e.GPUs = e.LocalRank%len(list), list
		return nil
	}
	if name, v, ok := r.first([]string{"SLURM_STEP_GPUS", "SLURM_JOB_GPUS"}); ok {
		list := splitList(v)
		if len(list) == 0 {
			e.GPU, e.GPUs = -1, nil
			return nil
		}
		ids := make([]int, len(list))
		for i, s := range list {
			id, err := count(name, s)
			if err != nil {
				return fmt.Errorf("%s=%q is not a list of GPU ids", name, v)
			}
			ids[i] = id
		}
		e.GPU, e.GPUs = ids[e.LocalRank%len(ids)], list
		return nil
	}
	e.GPU, e.GPUs = e.LocalRank, nil
	return nil
}

// splitList splits a comma list, dropping blanks.
func splitList(s string) []string {
	var out []string
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}
