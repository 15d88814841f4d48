package train

import (
	"fmt"

	"github.com/hpcrun/hpcrun/nccl"
	"github.com/hpcrun/hpcrun/tensor"
)

// mesh is this rank's place on the TP x DP grid, in Megatron order:
// rank = tpRank + dpRank*tp. TP groups are consecutive ranks, DP groups are
// strided by tp.
type mesh struct {
	tp, dp         nccl.Comm
	tpRank, dpRank int
	tpSize, dpSize int
}

func newMesh(world nccl.Comm, tp int) (*mesh, error) {
	n, r := world.Size(), world.Rank()
	if tp < 1 || n%tp != 0 {
		return nil, fmt.Errorf("mesh: %d ranks do not split into tensor-parallel groups of %d", n, tp)
	}
	m := &mesh{tpRank: r % tp, dpRank: r / tp, tpSize: tp, dpSize: n / tp}
	tpRanks := make([]int, tp)
	for i := range tpRanks {
		tpRanks[i] = m.dpRank*tp + i
	}
	dpRanks := make([]int, m.dpSize)
	for i := range dpRanks {
		dpRanks[i] = m.tpRank + i*tp
	}
	var err error
	if m.tp, err = world.Group(tpRanks); err != nil {
		return nil, fmt.Errorf("mesh: tensor-parallel group %v: %w", tpRanks, err)
	}
	if m.dp, err = world.Group(dpRanks); err != nil {
		m.tp.Close()
		return nil, fmt.Errorf("mesh: data-parallel group %v: %w", dpRanks, err)
	}
	return m, nil
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
