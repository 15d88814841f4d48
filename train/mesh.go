package train

import (
	"fmt"

	"github.com/hpcrun/hpcrun/nccl"
	"github.com/hpcrun/hpcrun/parallel"
	"github.com/hpcrun/hpcrun/tensor"
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

// allReduce sums t over comm in place: Megatron's g in the forward pass (the
// end of a row-parallel layer) and f in the backward pass.
func allReduce(dev tensor.Device, comm nccl.Comm, t *tensor.Tensor, op nccl.Op, stage []float32) error {
	if comm.Size() == 1 {
		return nil
	}
	if t.Buffer().Host() != nil {
		return comm.AllReduce(t.Host(), op)
	}
	buf := stage[:t.Len()]
	dev.CopyToHost(buf, t)
	if err := comm.AllReduce(buf, op); err != nil {
		return err
	}
	dev.CopyFromHost(t, buf)
	return nil
}
