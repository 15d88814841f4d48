package idrenv

import (
	"bytes"
	"strings"
	"testing"
)

// TestWriteText writes a two-node step's rank and a process alone: every
// key as in the JSON, "-" and words where a value is not set.
func TestWriteText(t *testing.T) {
	e := Env{Source: SlurmStep, Rank: 2, WorldSize: 3, LocalWorldSize: 1, NodeRank: 1, NumNodes: 2, Node: "jz002",
		Nodes: []string{"jz001", "jz002"}, TasksPerNode: []int{2, 1}, MasterAddr: "jz001", MasterPort: 31000,
		JobID: "42", StepID: "0", CPUsPerTask: 4, GPU: 0, GPUs: []string{"3"}}
	var b bytes.Buffer
	if err := e.WriteText(&b); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"source            slurm-step\n", "rank              2\n", "nodes             jz001,jz002\n",
		"tasks_per_node    2,1\n", "master_port       31000\n", "job_id            42\n",
		"cpus_per_task     4\n", "gpu               0 (launcher lists 3)\n",
	} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("lacks %q:\n%s", want, b.String())
		}
	}
	b.Reset()
	(Env{Source: Single, WorldSize: 1, GPU: -1}).WriteText(&b)
	for _, want := range []string{"master_port       0 (any free port)\n", "job_id            -\n", "cpus_per_task     - (not set by the launcher)\n", "gpu               none visible\n"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("alone: lacks %q:\n%s", want, b.String())
		}
	}
	if strings.Contains(b.String(), "\nnodes ") {
		t.Errorf("alone: lists nodes:\n%s", b.String())
	}
}
