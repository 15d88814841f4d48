// Package rankgrid lays a job's ranks out on the (pp, dp, tp) grid in
// Megatron's order, rank = tp_rank + tp*(dp_rank + dp*pp_rank): the one
// rule that parallel.Mesh builds its groups from and that the metrics and
// the dashboard read a rank's position with when it wrote none.
package rankgrid

// Coords is a rank's position on the grid: its tensor-parallel rank, its
// data-parallel replica and its pipeline stage.
type Coords struct{ TP, DP, PP int }

// Of is the position of rank on a grid of tp x dp ranks a stage; a tp or
// dp below 1 counts as 1.
func Of(rank, tp, dp int) Coords {
	tp, dp = max(tp, 1), max(dp, 1)
	return Coords{TP: rank % tp, DP: rank / tp % dp, PP: rank / (tp * dp)}
}

// Rank is the global rank at c on a grid of tp x dp ranks a stage.
func (c Coords) Rank(tp, dp int) int { return c.TP + tp*(c.DP+dp*c.PP) }
