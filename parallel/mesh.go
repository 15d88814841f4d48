package parallel

import (
	"errors"
	"fmt"

	"github.com/hpcrun/hpcrun/internal/rankgrid"
	"github.com/hpcrun/hpcrun/nccl"
)

// Mesh lays the ranks of a world communicator out on one grid of shape
// (pp, dp, tp), with global rank = tp_rank + tp*(dp_rank + dp*pp_rank):
// tensor-parallel groups are runs of tp consecutive ranks (the fast
// dimension, so that they share a node), data-parallel groups are the ranks
// with the same tp_rank, strided by tp, and pipeline groups are the ranks
// with the same (dp_rank, tp_rank), strided by dp*tp: pipeline stage
// pp_rank holds the pp_rank-th slice of the model's blocks. The grid is
// rankgrid's; every group is read off it, never recomputed elsewhere.
type Mesh struct {
	World nccl.Comm // every rank of the job
	TP    nccl.Comm // the ranks sharing one model replica's shards
	DP    nccl.Comm // the ranks holding the same shard of different replicas
	// PP is this rank's pipeline: the pp stages of one (dp, tp) position,
	// numbered by stage (nil when pp = 1).
	PP nccl.Comm
	// Embed is the first and the last stage of this rank's pipeline, which
	// both hold the token embedding (tied to the LM head) and sum its
	// gradient; nil on the middle stages and when pp = 1.
	Embed nccl.Comm
	// ZeroShard is the data-parallel ranks ZeRO shards its state over (DP,
	// unless ShardZeRO cut it into groups), and ZeroReplicas the ranks
	// holding the same shard in the other groups (nil without).
	ZeroShard, ZeroReplicas nccl.Comm

	pp, dp, tp             int
	ppRank, dpRank, tpRank int
	grid                   [][][]int // [pp][dp][tp] -> global rank
}

// NewMesh splits world into tensor-parallel groups of tp consecutive ranks
// and data-parallel groups strided by tp. Every rank of world must call it
// with the same tp. tp must divide the world size.
func NewMesh(world nccl.Comm, tp int) (*Mesh, error) {
	return NewMeshPP(world, 1, tp)
}

// NewMeshPP lays world out on the (pp, dp, tp) grid: tensor-parallel groups
// of tp consecutive ranks, data-parallel groups strided by tp, pipeline
// groups strided by dp*tp. Every rank of world must call it with the same
// pp and tp; pp*tp must divide the world size.
func NewMeshPP(world nccl.Comm, pp, tp int) (*Mesh, error) {
	n := world.Size()
	if tp < 1 || pp < 1 {
		return nil, fmt.Errorf("mesh: pp %d, tp %d: each must be at least 1", pp, tp)
	}
	if n%(tp*pp) != 0 {
		return nil, fmt.Errorf("mesh: pp %d x tp %d does not divide the %d ranks: use ntasks = pp x dp x tp", pp, tp, n)
	}
	m := &Mesh{World: world, pp: pp, dp: n / (tp * pp), tp: tp}
	m.grid = make([][][]int, m.pp)
	for p := range m.grid {
		m.grid[p] = make([][]int, m.dp)
		for d := range m.grid[p] {
			m.grid[p][d] = make([]int, tp)
			for t := range m.grid[p][d] {
				m.grid[p][d][t] = rankgrid.Coords{TP: t, DP: d, PP: p}.Rank(tp, m.dp)
			}
		}
	}
	at := rankgrid.Of(world.Rank(), tp, m.dp)
	m.ppRank, m.dpRank, m.tpRank = at.PP, at.DP, at.TP
	var err error
	if m.TP, err = world.Group(m.TPRanks()); err != nil {
		return nil, fmt.Errorf("mesh: tensor-parallel group %v: %w", m.TPRanks(), err)
	}
	if m.DP, err = world.Group(m.DPRanks()); err != nil {
		m.TP.Close()
		return nil, fmt.Errorf("mesh: data-parallel group %v: %w", m.DPRanks(), err)
	}
	m.ZeroShard = m.DP
	if pp == 1 {
		return m, nil
	}
	if m.PP, err = world.Group(m.PPRanks()); err != nil {
		m.Close()
		return nil, fmt.Errorf("mesh: pipeline group %v: %w", m.PPRanks(), err)
	}
	if m.ppRank == 0 || m.ppRank == pp-1 {
		if m.Embed, err = m.PP.Group([]int{0, pp - 1}); err != nil {
			m.Close()
			return nil, fmt.Errorf("mesh: embedding group of pipeline %v: %w", m.PPRanks(), err)
		}
	}
	return m, nil
}

// TPSize is the tensor-parallel degree.
func (m *Mesh) TPSize() int { return m.tp }

// DPSize is the data-parallel degree: the number of model replicas.
func (m *Mesh) DPSize() int { return m.dp }

// PPSize is the pipeline-parallel degree: the number of stages.
func (m *Mesh) PPSize() int { return m.pp }

// PPRank is this rank's pipeline stage.
func (m *Mesh) PPRank() int { return m.ppRank }

// PPRanks lists the global ranks of this rank's pipeline, by stage.
func (m *Mesh) PPRanks() []int {
	out := make([]int, m.pp)
	for p := range out {
		out[p] = m.grid[p][m.dpRank][m.tpRank]
	}
	return out
}

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

// String describes the layout, e.g. "rank 3: tp 1/2 dp 1/2 (tp group [2 3], dp group [1 3])",
// with the stage and the pipeline group when pp > 1.
func (m *Mesh) String() string {
	s := fmt.Sprintf("rank %d: tp %d/%d dp %d/%d (tp group %v, dp group %v)",
		m.World.Rank(), m.tpRank, m.tp, m.dpRank, m.dp, m.TPRanks(), m.DPRanks())
	if m.pp > 1 {
		s += fmt.Sprintf(" pp %d/%d (pp group %v)", m.ppRank, m.pp, m.PPRanks())
	}
	return s
}

// Close releases the groups (not the world communicator).
func (m *Mesh) Close() error {
	var errs []error
	if m.ZeroReplicas != nil {
		errs = append(errs, m.ZeroReplicas.Close(), m.ZeroShard.Close())
	}
	for _, c := range []nccl.Comm{m.Embed, m.PP, m.DP, m.TP} {
		if c != nil {
			errs = append(errs, c.Close())
		}
	}
	return errors.Join(errs...)
}

// ShardZeRO splits the data-parallel group for hybrid sharding: ZeroShard
// becomes this rank's group of shards consecutive data-parallel ranks,
// over which ZeRO shards its state, and ZeroReplicas the ranks holding the
// same shard in the other groups (nil when shards is the whole
// data-parallel degree: then ZeroShard is DP). Every rank of DP must call
// it with the same shards.
func (m *Mesh) ShardZeRO(shards int) error {
	if shards < 1 || m.dp%shards != 0 {
		return fmt.Errorf("mesh: ZeRO groups of %d ranks do not divide the data-parallel degree %d", shards, m.dp)
	}
	if shards == m.dp {
		return nil
	}
	first := m.dpRank / shards * shards
	var own, same []int
	for d := range m.dp {
		if d/shards*shards == first {
			own = append(own, d)
		}
		if d%shards == m.dpRank%shards {
			same = append(same, d)
		}
	}
	shard, err := m.DP.Group(own)
	if err != nil {
		return fmt.Errorf("mesh: ZeRO shard group %v of the data-parallel ranks: %w", own, err)
	}
	replicas, err := m.DP.Group(same)
	if err != nil {
		shard.Close()
		return fmt.Errorf("mesh: ZeRO replica group %v of the data-parallel ranks: %w", same, err)
	}
	m.ZeroShard, m.ZeroReplicas = shard, replicas
	return nil
}
