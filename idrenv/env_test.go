package idrenv

import (
	"maps"
	"reflect"
	"strings"
	"testing"
)

// vars is an environment for one test case.
type vars map[string]string

func (v vars) lookup(k string) (string, bool) { s, ok := v[k]; return s, ok }

// with returns a copy of v with more variables; an empty-key pair is skipped.
func (v vars) with(kv ...string) vars {
	out := maps.Clone(v)
	for i := 0; i+1 < len(kv); i += 2 {
		out[kv[i]] = kv[i+1]
	}
	return out
}

// stepVars is what srun -n 4 set on the local one-node Slurm (task 1).
var stepVars = vars{
	"SLURMD_NODENAME":           "vm",
	"SLURM_CPUS_ON_NODE":        "4",
	"SLURM_GTIDS":               "0,1,2,3",
	"SLURM_JOBID":               "2",
	"SLURM_JOB_ID":              "2",
	"SLURM_JOB_CPUS_PER_NODE":   "4",
	"SLURM_JOB_NODELIST":        "vm",
	"SLURM_JOB_NUM_NODES":       "1",
	"SLURM_LOCALID":             "1",
	"SLURM_NNODES":              "1",
	"SLURM_NODEID":              "0",
	"SLURM_NODELIST":            "vm",
	"SLURM_NPROCS":              "4",
	"SLURM_NTASKS":              "4",
	"SLURM_PROCID":              "1",
	"SLURM_STEPID":              "0",
	"SLURM_STEP_ID":             "0",
	"SLURM_STEP_NODELIST":       "vm",
	"SLURM_STEP_NUM_NODES":      "1",
	"SLURM_STEP_NUM_TASKS":      "4",
	"SLURM_STEP_TASKS_PER_NODE": "4",
	"SLURM_TASKS_PER_NODE":      "4",
}

// unevenVars: a 7-task step on 4 nodes inside a bigger job; task 6 is alone
// on the last node.
var unevenVars = vars{
	"SLURM_JOB_ID":              "123456",
	"SLURM_JOB_NODELIST":        "jz[001-008]",
	"SLURM_NTASKS":              "32",
	"SLURM_TASKS_PER_NODE":      "4(x8)",
	"SLURM_STEP_NODELIST":       "jz[003-005],gpu7",
	"SLURM_STEP_NUM_TASKS":      "7",
	"SLURM_STEP_NUM_NODES":      "4",
	"SLURM_STEP_TASKS_PER_NODE": "2(x3),1",
	"SLURM_PROCID":              "6",
	"SLURM_LOCALID":             "0",
	"SLURM_NODEID":              "3",
	"SLURM_STEP_ID":             "1",
	"SLURMD_NODENAME":           "gpu7",
}

// jobVars: a task with job-level variables only (no SLURM_STEP_*).
var jobVars = vars{
	"SLURM_JOB_ID":         "77",
	"SLURM_NODELIST":       "n[1-2]",
	"SLURM_NPROCS":         "3",
	"SLURM_TASKS_PER_NODE": "2,1",
	"SLURM_NNODES":         "2",
	"SLURM_PROCID":         "1",
	"SLURM_LOCALID":        "1",
	"SLURM_NODEID":         "0",
}

var torchVars = vars{
	"TORCHELASTIC_RUN_ID":        "run-1",
	"RANK":                       "5",
	"WORLD_SIZE":                 "8",
	"LOCAL_RANK":                 "1",
	"LOCAL_WORLD_SIZE":           "4",
	"GROUP_RANK":                 "1",
	"GROUP_WORLD_SIZE":           "2",
	"MASTER_ADDR":                "head",
	"MASTER_PORT":                "29500",
	"TORCHELASTIC_RESTART_COUNT": "2",
}

func TestDetect(t *testing.T) {
	opt := Options{Hostname: "here"}
	tests := []struct {
		name string
		env  vars
		opt  Options
		want Env
	}{
		{"no launcher", vars{}, opt, Env{
			Source: Single, WorldSize: 1, LocalWorldSize: 1, NumNodes: 1,
			Node: "here", Nodes: []string{"here"}, TasksPerNode: []int{1},
			MasterAddr: "127.0.0.1", MasterPort: 0, IsMaster: true, GPU: 0,
		}},
		{"salloc shell: one process, job id and port", vars{"SLURM_JOB_ID": "31234", "SLURM_NTASKS": "4"}, opt, Env{
			Source: Single, WorldSize: 1, LocalWorldSize: 1, NumNodes: 1,
			Node: "here", Nodes: []string{"here"}, TasksPerNode: []int{1},
			MasterAddr: "127.0.0.1", MasterPort: 21234, IsMaster: true, JobID: "31234",
		}},
		{"srun -n 4 on one node", stepVars, opt, Env{
			Source: SlurmStep, Rank: 1, WorldSize: 4, LocalRank: 1, LocalWorldSize: 4,
			NumNodes: 1, Node: "vm", Nodes: []string{"vm"}, TasksPerNode: []int{4},
			MasterAddr: "vm", MasterPort: 20002, JobID: "2", StepID: "0", CPUsPerTask: 1, GPU: 1,
		}},
		{"step variables beat job ones; uneven layout", unevenVars, opt, Env{
			Source: SlurmStep, Rank: 6, WorldSize: 7, LocalRank: 0, LocalWorldSize: 1,
			NodeRank: 3, NumNodes: 4, Node: "gpu7", Nodes: []string{"jz003", "jz004", "jz005", "gpu7"},
			TasksPerNode: []int{2, 2, 2, 1}, MasterAddr: "jz003", MasterPort: 23456,
			JobID: "123456", StepID: "1", GPU: 0,
		}},
		{"uneven layout, a node with two tasks", unevenVars.with("SLURM_PROCID", "3", "SLURM_LOCALID", "1", "SLURM_NODEID", "1", "SLURMD_NODENAME", "jz004"), opt, Env{
			Source: SlurmStep, Rank: 3, WorldSize: 7, LocalRank: 1, LocalWorldSize: 2,
			NodeRank: 1, NumNodes: 4, Node: "jz004", Nodes: []string{"jz003", "jz004", "jz005", "gpu7"},
			TasksPerNode: []int{2, 2, 2, 1}, MasterAddr: "jz003", MasterPort: 23456,
			JobID: "123456", StepID: "1", GPU: 1,
		}},
		{"job variables and their old aliases", jobVars, opt, Env{
			Source: SlurmJob, Rank: 1, WorldSize: 3, LocalRank: 1, LocalWorldSize: 2,
			NumNodes: 2, Node: "n1", Nodes: []string{"n1", "n2"}, TasksPerNode: []int{2, 1},
			MasterAddr: "n1", MasterPort: 20077, JobID: "77", GPU: 1,
		}},
		{"world size from the counts when SLURM_NTASKS is unset", vars{
			"SLURM_JOB_ID": "9", "SLURM_JOB_NODELIST": "a,b", "SLURM_TASKS_PER_NODE": "1(x2)",
			"SLURM_PROCID": "0", "SLURM_LOCALID": "0", "SLURM_NODEID": "0"}, opt, Env{
			Source: SlurmJob, WorldSize: 2, LocalWorldSize: 1, NumNodes: 2, Node: "a",
			Nodes: []string{"a", "b"}, TasksPerNode: []int{1, 1}, MasterAddr: "a",
			MasterPort: 20009, IsMaster: true, JobID: "9",
		}},
		{"torchrun wins over Slurm", torchVars.with("SLURM_JOB_ID", "5", "SLURM_PROCID", "0"), opt, Env{
			Source: Torchrun, Rank: 5, WorldSize: 8, LocalRank: 1, LocalWorldSize: 4,
			NodeRank: 1, NumNodes: 2, Node: "here", MasterAddr: "head", MasterPort: 29500,
			JobID: "5", RestartCount: 2, GPU: 1,
		}},
		{"torchrun without group variables", vars{
			"TORCHELASTIC_RUN_ID": "x", "RANK": "6", "WORLD_SIZE": "8", "LOCAL_RANK": "2",
			"LOCAL_WORLD_SIZE": "4", "MASTER_ADDR": "h", "MASTER_PORT": "1234"}, opt, Env{
			Source: Torchrun, Rank: 6, WorldSize: 8, LocalRank: 2, LocalWorldSize: 4,
			NodeRank: 1, NumNodes: 2, Node: "here", MasterAddr: "h", MasterPort: 1234, GPU: 2,
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := DetectFrom(tt.env.lookup, tt.opt)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("got  %+v\nwant %+v", got, tt.want)
			}
		})
	}
}

func TestDetectFields(t *testing.T) {
	opt := Options{Hostname: "here"}
	tests := []struct {
		name  string
		env   vars
		opt   Options
		check func(Env) bool
	}{
		{"array job id A_T, port from the task's own job id", stepVars.with("SLURM_ARRAY_JOB_ID", "100", "SLURM_ARRAY_TASK_ID", "7", "SLURM_JOB_ID", "107"), opt,
			func(e Env) bool { return e.JobID == "100_7" && e.MasterPort == PortBase+107 }},
		{"MASTER_PORT overrides the derived port", stepVars.with("MASTER_PORT", "4242"), opt,
			func(e Env) bool { return e.MasterPort == 4242 }},
		{"configured port overrides the derived port", stepVars, Options{MasterPort: 5555},
			func(e Env) bool { return e.MasterPort == 5555 }},
		{"MASTER_PORT beats the configured port", stepVars.with("MASTER_PORT", "4242"), Options{MasterPort: 5555},
			func(e Env) bool { return e.MasterPort == 4242 }},
		{"port stays in range for big job ids", stepVars.with("SLURM_JOB_ID", "98765432"), opt,
			func(e Env) bool { return e.MasterPort == PortBase+5432 }},
		{"non-numeric job id (local executor) still gets a port in range", stepVars.with("SLURM_JOB_ID", "local-20250101"), opt,
			func(e Env) bool { return e.MasterPort >= PortBase && e.MasterPort < PortBase+PortSpan }},
		{"restart count", stepVars.with("SLURM_RESTART_COUNT", "3"), opt,
			func(e Env) bool { return e.RestartCount == 3 }},
		{"cpus per task", stepVars.with("SLURM_CPUS_PER_TASK", "10"), opt,
			func(e Env) bool { return e.CPUsPerTask == 10 }},
		{"cpus on node shared by the node's tasks", stepVars.with("SLURM_CPUS_ON_NODE", "40"), opt,
			func(e Env) bool { return e.CPUsPerTask == 10 }},
		{"CUDA_VISIBLE_DEVICES renumbers: ordinal is local rank mod count", stepVars.with("SLURM_LOCALID", "3", "SLURM_PROCID", "3", "CUDA_VISIBLE_DEVICES", "4,6"), opt,
			func(e Env) bool { return e.GPU == 1 && reflect.DeepEqual(e.GPUs, []string{"4", "6"}) }},
		{"SLURM_STEP_GPUS are global ids, not ordinals, under CUDA_VISIBLE_DEVICES", stepVars.with("SLURM_STEP_GPUS", "2,3", "CUDA_VISIBLE_DEVICES", "2,3"), opt,
			func(e Env) bool { return e.GPU == 1 }},
		{"SLURM_STEP_GPUS without CUDA_VISIBLE_DEVICES: all devices visible, the id is the ordinal", stepVars.with("SLURM_STEP_GPUS", "2,3"), opt,
			func(e Env) bool { return e.GPU == 3 }},
		{"SLURM_JOB_GPUS when the step has none", stepVars.with("SLURM_JOB_GPUS", "5"), opt,
			func(e Env) bool { return e.GPU == 5 && e.GPUOrdinal(8) == 5 }},
		{"empty CUDA_VISIBLE_DEVICES: no GPU", stepVars.with("CUDA_VISIBLE_DEVICES", ""), opt,
			func(e Env) bool { return e.GPU == -1 && e.GPUOrdinal(4) == -1 }},
		{"NoDevFiles: no GPU", stepVars.with("CUDA_VISIBLE_DEVICES", "NoDevFiles"), opt,
			func(e Env) bool { return e.GPU == -1 }},
		{"GPU UUIDs", stepVars.with("CUDA_VISIBLE_DEVICES", "GPU-aa,GPU-bb"), opt,
			func(e Env) bool { return e.GPU == 1 }},
		{"no GPU variables: local rank folded by the caller's count", stepVars.with("SLURM_LOCALID", "3", "SLURM_PROCID", "3"), opt,
			func(e Env) bool { return e.GPU == 3 && e.GPUOrdinal(2) == 1 && e.GPUOrdinal(0) == -1 }},
		{"rank 0 is the one master", stepVars.with("SLURM_PROCID", "0", "SLURM_LOCALID", "0"), opt,
			func(e Env) bool { return e.IsMaster && e.Rank == 0 }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := DetectFrom(tt.env.lookup, tt.opt)
			if err != nil {
				t.Fatal(err)
			}
			if !tt.check(got) {
				t.Errorf("got %+v", got)
			}
		})
	}
}

func TestDetectErrors(t *testing.T) {
	opt := Options{Hostname: "here"}
	tests := []struct {
		name  string
		env   vars
		opt   Options
		names []string // what the error must name
	}{
		{"rank not below world", stepVars.with("SLURM_PROCID", "4"), opt, []string{"SLURM_PROCID=4", "SLURM_STEP_NUM_TASKS"}},
		{"missing step pieces", vars{"SLURM_STEP_NUM_TASKS": "2", "SLURM_PROCID": "0"}, opt, []string{"SLURM_STEP_NODELIST", "SLURM_STEP_TASKS_PER_NODE", "SLURM_LOCALID", "SLURM_NODEID"}},
		{"missing job pieces", vars{"SLURM_PROCID": "0", "SLURM_JOB_ID": "1"}, opt, []string{"SLURM_JOB_NODELIST", "SLURM_TASKS_PER_NODE", "SLURM_LOCALID", "SLURM_NODEID"}},
		{"counts for fewer nodes than the list", unevenVars.with("SLURM_STEP_TASKS_PER_NODE", "2(x3)"), opt, []string{"SLURM_STEP_TASKS_PER_NODE", "SLURM_STEP_NODELIST"}},
		{"task count disagrees with the per-node counts", unevenVars.with("SLURM_STEP_NUM_TASKS", "8"), opt, []string{"SLURM_STEP_NUM_TASKS=8", "SLURM_STEP_TASKS_PER_NODE"}},
		{"node count disagrees with the list", unevenVars.with("SLURM_STEP_NUM_NODES", "3"), opt, []string{"SLURM_STEP_NUM_NODES=3", "SLURM_STEP_NODELIST"}},
		{"node id out of range", unevenVars.with("SLURM_NODEID", "4"), opt, []string{"SLURM_NODEID=4"}},
		{"local id beyond the node's tasks", unevenVars.with("SLURM_LOCALID", "1"), opt, []string{"SLURM_LOCALID=1", "SLURM_STEP_TASKS_PER_NODE"}},
		{"node name disagrees with node id", unevenVars.with("SLURMD_NODENAME", "jz003"), opt, []string{"SLURMD_NODENAME=jz003", "SLURM_NODEID"}},
		{"the batch script is one process", stepVarsBatch(), opt, []string{"SLURM_GTIDS", "SLURM_TASKS_PER_NODE", "srun"}},
		{"rank not on this node", stepVars.with("SLURM_GTIDS", "4,5,6,7"), opt, []string{"SLURM_GTIDS", "SLURM_PROCID"}},
		{"bad node list", unevenVars.with("SLURM_STEP_NODELIST", "jz[003-005"), opt, []string{"SLURM_STEP_NODELIST", "never closed"}},
		{"bad per-node counts", unevenVars.with("SLURM_STEP_TASKS_PER_NODE", "2(x3"), opt, []string{"SLURM_STEP_TASKS_PER_NODE"}},
		{"non-numeric rank", stepVars.with("SLURM_PROCID", "one"), opt, []string{"SLURM_PROCID"}},
		{"bad MASTER_PORT", stepVars.with("MASTER_PORT", "70000"), opt, []string{"MASTER_PORT"}},
		{"bad configured port", stepVars, Options{MasterPort: -3}, []string{"master port -3"}},
		{"bad GPU ids", stepVars.with("SLURM_STEP_GPUS", "0,x"), opt, []string{"SLURM_STEP_GPUS"}},
		{"torchrun without MASTER_ADDR", torchVars.with("MASTER_ADDR", ""), opt, []string{"MASTER_ADDR"}},
		{"torchrun missing pieces", vars{"TORCHELASTIC_RUN_ID": "r", "RANK": "0"}, opt, []string{"WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"}},
		{"torchrun rank not below world", torchVars.with("RANK", "8"), opt, []string{"RANK=8", "WORLD_SIZE=8"}},
		{"torchrun local rank not below local world", torchVars.with("LOCAL_RANK", "4"), opt, []string{"LOCAL_RANK=4", "LOCAL_WORLD_SIZE=4"}},
		{"torchrun group rank", torchVars.with("GROUP_RANK", "2"), opt, []string{"GROUP_RANK=2", "GROUP_WORLD_SIZE=2"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := DetectFrom(tt.env.lookup, tt.opt)
			if err == nil {
				t.Fatalf("no error; got %+v", got)
			}
			msg := err.Error()
			if strings.Contains(msg, "\n") {
				t.Errorf("error is not one line: %q", msg)
			}
			for _, n := range tt.names {
				if !strings.Contains(msg, n) {
					t.Errorf("error %q does not name %s", msg, n)
				}
			}
		})
	}
}

// stepVarsBatch is what a batch script of a 2-task job sees (no step
// variables, one task id in SLURM_GTIDS).
func stepVarsBatch() vars {
	return vars{
		"SLURM_JOB_ID": "3", "SLURM_JOB_NODELIST": "vm", "SLURM_NTASKS": "2",
		"SLURM_TASKS_PER_NODE": "2", "SLURM_GTIDS": "0", "SLURM_PROCID": "0",
		"SLURM_LOCALID": "0", "SLURM_NODEID": "0", "SLURMD_NODENAME": "vm",
	}
}

func TestEnviron(t *testing.T) {
	l := Environ([]string{"A=1", "B=x=y", "A=2", "C="})
	for k, want := range map[string]string{"A": "2", "B": "x=y", "C": ""} {
		if v, ok := l(k); !ok || v != want {
			t.Errorf("%s = %q, %v; want %q", k, v, ok, want)
		}
	}
	if _, ok := l("D"); ok {
		t.Error("D should be unset")
	}
}
