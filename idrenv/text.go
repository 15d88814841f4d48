package idrenv

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
)

// WriteText writes e as hpcrun env does: aligned "key  value" lines, keys
// as in the JSON.
func (e Env) WriteText(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	row := func(k string, v any) { fmt.Fprintf(tw, "%s\t%v\n", k, v) }
	row("source", e.Source)
	row("rank", e.Rank)
	row("world_size", e.WorldSize)
	row("local_rank", e.LocalRank)
	row("local_world_size", e.LocalWorldSize)
	row("node_rank", e.NodeRank)
	row("num_nodes", e.NumNodes)
	row("node", e.Node)
	if len(e.Nodes) > 0 {
		row("nodes", strings.Join(e.Nodes, ","))
		row("tasks_per_node", CompressTasksPerNode(e.TasksPerNode))
	}
	port := fmt.Sprint(e.MasterPort)
	if e.MasterPort == 0 {
		port = "0 (any free port)"
	}
	row("master_addr", e.MasterAddr)
	row("master_port", port)
	row("is_master", e.IsMaster)
	row("job_id", orDash(e.JobID))
	row("step_id", orDash(e.StepID))
	row("restart_count", e.RestartCount)
	if e.CPUsPerTask == 0 {
		row("cpus_per_task", "- (not set by the launcher)")
	} else {
		row("cpus_per_task", e.CPUsPerTask)
	}
	switch {
	case e.GPU < 0:
		row("gpu", "none visible")
	case e.GPUs == nil:
		row("gpu", fmt.Sprintf("%d (local rank; no GPU variables set)", e.GPU))
	default:
		row("gpu", fmt.Sprintf("%d (launcher lists %s)", e.GPU, strings.Join(e.GPUs, ",")))
	}
	return tw.Flush()
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
