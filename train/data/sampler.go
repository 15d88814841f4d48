package data

import (
	"fmt"
	"math/rand/v2"
)

// Sampler splits the indices of a dataset among the data-parallel ranks, as
// PyTorch's DistributedSampler: every epoch it shuffles all indices with a
// generator seeded by seed and the epoch (the same order on every rank), or
// keeps them in order when Shuffle is false, evens the list to a multiple of
// the replica count (dropping the tail, or repeating the head), and gives
// rank r the indices r, r+replicas, ...
// Tensor-parallel ranks of one data-parallel group use the same dpRank and so
// see the same samples; different data-parallel ranks see disjoint ones.
type Sampler struct {
	N        int   // dataset size
	Replicas int   // data-parallel degree
	Rank     int   // this rank's data-parallel index
	Seed     int64 // shuffle seed
	Shuffle  bool
	DropLast bool // drop the tail instead of padding with repeated samples
}

// NewSampler checks its arguments and returns a sampler that shuffles every
// epoch when shuffle is true and drops the tail that does not divide among the
// replicas (the trainer drops short batches too).
func NewSampler(n, replicas, rank int, seed int64, shuffle bool) (*Sampler, error) {
	if replicas < 1 || rank < 0 || rank >= replicas {
		return nil, fmt.Errorf("sampler: rank %d of %d replicas", rank, replicas)
	}
	if n < replicas {
		return nil, fmt.Errorf("sampler: %d samples for %d data-parallel ranks: give more samples or fewer ranks", n, replicas)
	}
	return &Sampler{N: n, Replicas: replicas, Rank: rank, Seed: seed, Shuffle: shuffle, DropLast: true}, nil
}

// Len is the number of indices each rank gets per epoch.
func (s *Sampler) Len() int {
	if s.DropLast {
		return s.N / s.Replicas
	}
	return (s.N + s.Replicas - 1) / s.Replicas
}

// Epoch returns this rank's indices for epoch e.
func (s *Sampler) Epoch(e int) []int {
	idx := make([]int, s.N)
	for i := range idx {
		idx[i] = i
	}
	if s.Shuffle {
		r := rand.New(rand.NewPCG(uint64(s.Seed), uint64(e)))
		r.Shuffle(len(idx), func(i, j int) { idx[i], idx[j] = idx[j], idx[i] })
	}
	total := s.Len() * s.Replicas
	if total <= len(idx) {
		idx = idx[:total]
	} else {
		for i := 0; len(idx) < total; i++ {
			idx = append(idx, idx[i%s.N])
		}
	}
	out := make([]int, 0, s.Len())
	for i := s.Rank; i < total; i += s.Replicas {
		out = append(out, idx[i])
	}
	return out
}
