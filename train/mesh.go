package train

import (
	"fmt"

	"github.com/hpcrun/hpcrun/nccl"
	"github.com/hpcrun/hpcrun/parallel"
)

// mesh is this rank's place on the TP x DP grid, taken from
// parallel.Mesh (Megatron order: rank = tpRank + dpRank*tp; TP groups are
// consecutive ranks, DP groups strided by tp).
type mesh struct {
	tp, dp         nccl.Comm
	tpRank, dpRank int
	tpSize, dpSize int
}

func newMesh(world nccl.Comm, tp int) (*mesh, error) {
	m, err := parallel.NewMesh(world, tp)
	if err != nil {
		return nil, fmt.Errorf("mesh: %w", err)
	}
	return &mesh{tp: m.TP, dp: m.DP, tpRank: m.TPRank(), dpRank: m.DPRank(), tpSize: m.TPSize(), dpSize: m.DPSize()}, nil
}
