package plan

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"

	"github.com/hpcrun/hpcrun/nccl"
	"github.com/hpcrun/hpcrun/parallel"
	"github.com/hpcrun/hpcrun/tensor"
	"github.com/hpcrun/hpcrun/train"
)

// reduceSpy records the length of every all-reduce of rank 0's groups, by
// the order the groups were made in (the mesh makes tp's, then dp's).
type reduceSpy struct {
	nccl.Comm
	mu    *sync.Mutex
	group int
	calls map[int][]int
	made  *int
}

// Group implements nccl.Comm.
func (s reduceSpy) Group(ranks []int) (nccl.Comm, error) {
	c, err := s.Comm.Group(ranks)
	if err != nil || s.Comm.Rank() != 0 {
		return c, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	*s.made++
	return reduceSpy{c, s.mu, *s.made, s.calls, s.made}, nil
}

// AllReduce implements nccl.Comm.
func (s reduceSpy) AllReduce(buf []float32, op nccl.Op) error {
	if s.group > 0 {
		s.mu.Lock()
		s.calls[s.group] = append(s.calls[s.group], len(buf))
		s.mu.Unlock()
	}
	return s.Comm.AllReduce(buf, op)
}

// The plan's gradient buckets are the engine's: the data-parallel
// all-reduces of a step before the loss's mean (one float) are the plan's
// buckets, element for element, for models of several buckets.
func TestGradBucketsMatchEngine(t *testing.T) {
	const vocab = 1000
	for _, c := range []struct {
		model          string
		tp, dp, layers int
	}{{"gpt", 1, 2, 4}, {"bert", 1, 2, 4}, {"llama", 2, 2, 8}} {
		t.Run(fmt.Sprintf("%s_tp%d_dp%d", c.model, c.tp, c.dp), func(t *testing.T) {
			cfg := commLayout{tp: c.tp, dp: c.dp, accum: 1}.tinyConfig(t, c.model)
			cfg.Layers, cfg.Dim, cfg.Heads, cfg.Seq, cfg.BatchSize, cfg.Steps, cfg.EvalEvery = c.layers, 512, 8, 8, 1, 1, 0
			cfg.EvalSamples = c.dp
			vp, err := parallel.PadVocab(vocab, cfg.TP)
			if err != nil {
				t.Fatal(err)
			}
			var want []int
			sh, err := newShapes(cfg, vp, 0, cfg.Layers, cfg.NTasks, false)
			if err != nil {
				t.Fatal(err)
			}
			for _, b := range sh.buckets {
				want = append(want, int(b.Elems))
			}
			if len(want) < 3 {
				t.Fatalf("%d buckets: the test wants a model of several", len(want))
			}
			data := randomData(cfg, vocab, cfg.BatchSize*cfg.DP())
			data.Val = data.Train
			var mu sync.Mutex
			calls, made := map[int][]int{}, 0
			err = nccl.RunInProcess(cfg.NTasks, func(w nccl.Comm) error {
				_, err := train.Run(context.Background(), cfg, reduceSpy{w, &mu, 0, calls, &made}, train.Options{Device: tensor.NewCPU(), Data: data})
				return err
			})
			if err != nil {
				t.Fatal(err)
			}
			got := calls[2]
			if loss := slices.Index(got, 1); loss >= 0 {
				got = got[:loss]
			}
			if !slices.Equal(got, want) {
				t.Errorf("the engine's data-parallel all-reduces %v, the plan's buckets %v", got, want)
			}
		})
	}
}
