package parallel

import (
	"fmt"

	"github.com/hpcrun/hpcrun/nccl"
)

// KVReplicas makes the group of this rank's tensor-parallel peers that
// hold the same key/value heads when tp is a multiple of kvHeads (KVSplit):
// the tp/kvHeads consecutive ranks of tp that this rank's group of query
// heads is cut over. It is nil when every rank holds its own key/value
// heads. Every rank of tp calls it with the same heads.
func KVReplicas(tp nccl.Comm, heads, kvHeads int) (nccl.Comm, error) {
	g := NewGroup(tp)
	_, r, err := KVSplit(heads, kvHeads, g.Size())
	if err != nil || r == 1 {
		return nil, err
	}
	first := g.Rank() / r * r
	ranks := make([]int, r)
	for i := range ranks {
		ranks[i] = first + i
	}
	c, err := tp.Group(ranks)
	if err != nil {
		return nil, fmt.Errorf("key/value replicas %v of tp: %w", ranks, err)
	}
	return c, nil
}

// ReduceReplicas sums, over replicas (KVReplicas's group; nil: nothing to
// sum), the gradients of the parameter rows that ranks share
// (Shard.Replicas): each rank's Backward left there the part of its own
// outputs (its query heads'), and the replicas must take the same step.
// One all-reduce per parameter, in place, after the last Backward of a
// step.
func ReduceReplicas(replicas *Group, params []*Param) error {
	if replicas.Size() == 1 {
		return nil
	}
	for _, p := range params {
		off, n := p.Shard.SharedRange(p.Full)
		if n == 0 {
			continue
		}
		if err := replicas.AllReduce(p.grad().View(off, n), nccl.Sum); err != nil {
			return fmt.Errorf("%s: key/value replicas: %w", p.Name, err)
		}
	}
	return nil
}
