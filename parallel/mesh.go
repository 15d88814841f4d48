package parallel

import (
	"errors"
	"fmt"

	"github.com/hpcrun/hpcrun/nccl"
)

// Mesh lays the ranks of a world communicator out on one grid of shape
// (pp, dp, tp), with global rank = tp_rank + tp*(dp_rank + dp*pp_rank):
// tensor-parallel groups are runs of tp consecutive ranks (the fast
// dimension, so that they share a node), data-parallel groups are the ranks
// with the same tp_rank, strided by tp. Every group is read off the grid,
// never recomputed elsewhere. The pipeline dimension is always 1 for now.
type Mesh struct {
	World nccl.Comm // every rank of the job
	TP    nccl.Comm // the ranks sharing one model replica's shards
	DP    nccl.Comm // the ranks holding the same shard of different replicas

	pp, dp, tp             int
	ppRank, dpRank, tpRank int
	grid                   [][][]int // [pp][dp][tp] -> global rank
}

// NewMesh splits world into tensor-parallel groups of tp consecutive ranks
// and data-parallel groups strided by tp. Every rank of world must call it
// with the same tp. tp must divide the world size.
func NewMesh(world nccl.Comm, tp int) (*Mesh, error) {
	n := world.Size()
	if tp < 1 {
		return nil, fmt.Errorf("mesh: tp %d: must be at least 1", tp)
	}
	if n%tp != 0 {
		return nil, fmt.Errorf("mesh: tp %d does not divide the %d ranks: use ntasks = tp x data-parallel degree", tp, n)
	}
	m := &Mesh{World: world, pp: 1, dp: n / tp, tp: tp}
	m.grid = make([][][]int, m.pp)
	for p := range m.grid {
		m.grid[p] = make([][]int, m.dp)
		for d := range m.grid[p] {
			m.grid[p][d] = make([]int, tp)
			for t := range m.grid[p][d] {
				r := t + tp*(d+m.dp*p)
				m.grid[p][d][t] = r
				if r == world.Rank() {
					m.ppRank, m.dpRank, m.tpRank = p, d, t
				}
			}
		}
	}
	var err error
	if m.TP, err = world.Group(m.TPRanks()); err != nil {
		return nil, fmt.Errorf("mesh: tensor-parallel group %v: %w", m.TPRanks(), err)
	}
	if m.DP, err = world.Group(m.DPRanks()); err != nil {
		m.TP.Close()
		return nil, fmt.Errorf("mesh: data-parallel group %v: %w", m.DPRanks(), err)
	}
	return m, nil
}

// TPSize is the tensor-parallel degree.
func (m *Mesh) TPSize() int { return m.tp }

// DPSize is the data-parallel degree: the number of model replicas.
func (m *Mesh) DPSize() int { return m.dp }

// PPSize is the pipeline-parallel degree (always 1 for now).
func (m *Mesh) PPSize() int { return m.pp }

// TPRank is this rank's position in its tensor-parallel group.
func (m *Mesh) TPRank() int { return m.tpRank }

// DPRank is this rank's position in its data-parallel group: which replica
// it belongs to, and which slice of the data it reads.
func (m *Mesh) DPRank() int { return m.dpRank }

// TPRanks lists the global ranks of this rank's tensor-parallel group.
func (m *Mesh) TPRanks() []int {
	return append([]int(nil), m.grid[m.ppRank][m.dpRank]...)
}

// DPRanks lists the global ranks of this rank's data-parallel group.
func (m *Mesh) DPRanks() []int {
	out := make([]int, m.dp)
	for d := range out {
		out[d] = m.grid[m.ppRank][d][m.tpRank]
	}
	return out
}

// String describes the layout, e.g. "rank 3: tp 1/2 dp 1/2 (tp group [2 3], dp group [1 3])".
func (m *Mesh) String() string {
	return fmt.Sprintf("rank %d: tp %d/%d dp %d/%d (tp group %v, dp group %v)",
		m.World.Rank(), m.tpRank, m.tp, m.dpRank, m.dp, m.TPRanks(), m.DPRanks())
}

// Close releases the TP and DP groups (not the world communicator).
func (m *Mesh) Close() error {
	return errors.Join(m.TP.Close(), m.DP.Close())
}
