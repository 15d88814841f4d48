package parallel

import (
	"fmt"

	"github.com/hpcrun/hpcrun/internal/units"
)

// Placement checks that the tensor-parallel groups of ntasks ranks laid out
// as Mesh lays them (tp consecutive ranks) fit inside a node of a job of
// nodes nodes, tasksPerNode tasks each, where their every-layer
// all-reduces stay off the network, and says in words where the tp, dp and
// pp groups go.
func Placement(nodes, tasksPerNode, ntasks, tp, pp int) (string, error) {
	pp = max(pp, 1)
	dp := ntasks / max(tp, 1) / pp
	stages := ""
	if pp > 1 {
		where := "inside a node"
		if (pp-1)*dp*tp >= tasksPerNode {
			where = "across nodes"
		}
		stages = fmt.Sprintf("; %d pipeline stages of %d consecutive ranks, pp groups of %d %s", pp, dp*tp, pp, where)
	}
	if nodes == 1 {
		return fmt.Sprintf("placement: 1 node x %s; tp groups of %d and dp groups of %d inside the node%s", units.Count(tasksPerNode, "task"), tp, dp, stages), nil
	}
	if tasksPerNode%tp != 0 {
		return "", fmt.Errorf("tp %d does not divide the %d tasks of a node: tensor-parallel groups would straddle nodes and their all-reduces cross the network in every layer; give every node a multiple of %d tasks (--nodes, --ntasks-per-node)",
			tp, tasksPerNode, tp)
	}
	dpWhere := fmt.Sprintf("across nodes (%d per node)", tasksPerNode/tp)
	if (dp-1)*tp < tasksPerNode {
		dpWhere = "inside a node"
	}
	return fmt.Sprintf("placement: %d nodes x %s; tp groups of %d inside a node, dp groups of %d %s%s",
		nodes, units.Count(tasksPerNode, "task"), tp, dp, dpWhere, stages), nil
}
