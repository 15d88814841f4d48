package train

import (
	"math"
	"testing"

	"github.com/hpcrun/hpcrun/nccl"
	"github.com/hpcrun/hpcrun/parallel"
	"github.com/hpcrun/hpcrun/tensor"
)

func newParam(t *testing.T, dev tensor.Device, name string, grad []float32, replicated bool) *parallel.Param {
	t.Helper()
	w, err := dev.Alloc(len(grad))
	if err != nil {
		t.Fatal(err)
	}
	g, _ := dev.Alloc(len(grad))
	dev.CopyFromHost(g, grad)
	sh := parallel.Shard{Parts: 1}
	if !replicated {
		sh = parallel.Shard{Parts: 2}
	}
	return &parallel.Param{Name: name, Data: w, Grad: g, Full: []int{len(grad) * sh.Parts}, Shard: sh, Decay: true}
}

// TestGradNormUnderTP splits a sharded gradient over two TP ranks and keeps
// a replicated one whole on both: the norm must be the unsharded model's.
func TestGradNormUnderTP(t *testing.T) {
	sharded := []float32{1, 2, 3, 4}
	replicated := []float32{5, 6}
	want := math.Sqrt(1 + 4 + 9 + 16 + 25 + 36)
	err := nccl.RunInProcess(2, func(c nccl.Comm) error {
		dev := tensor.NewCPU()
		r := c.Rank()
		ps := []*parallel.Param{
			newParam(t, dev, "w", sharded[2*r:2*r+2], false),
			newParam(t, dev, "ln", replicated, true),
		}
		got, err := normOf(dev, ps, c, 0)
		if err != nil {
			return err
		}
		if math.Abs(got-want) > 1e-6 {
			t.Errorf("rank %d: norm %g, want %g", r, got, want)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

func TestGradSyncAveragesInBuckets(t *testing.T) {
	err := nccl.RunInProcess(2, func(c nccl.Comm) error {
		dev := tensor.NewCPU()
		r := float32(c.Rank())
		ps := []*parallel.Param{
			newParam(t, dev, "a", []float32{r, 2 * r, 3}, false),
			newParam(t, dev, "b", []float32{10 * r}, false),
			newParam(t, dev, "c", []float32{r, r, r, r, r}, true),
		}
		s := NewGradSync(dev, c, ps, 4, false)
		if s.Buckets() != 2 {
			t.Errorf("%d buckets, want 2 ([a b] [c])", s.Buckets())
		}
		if err := s.Sync(); err != nil {
			return err
		}
		want := [][]float32{{0.5, 1, 3}, {5}, {0.5, 0.5, 0.5, 0.5, 0.5}}
		for i, p := range ps {
			for j, v := range p.Grad.Host() {
				if v != want[i][j] {
					t.Errorf("%s[%d] = %g, want %g", p.Name, j, v, want[i][j])
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

func TestAdamWClips(t *testing.T) {
	dev := tensor.NewCPU()
	p := newParam(t, dev, "w", []float32{30, 40}, false)
	p.Decay = false
	o, err := NewAdamW(dev, []*parallel.Param{p}, 0, 1)
	if err != nil {
		t.Fatal(err)
	}
	g, err := newGradNorm(dev, 1, 1, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := g.compute([]*tensor.Tensor{p.Grad}); err != nil {
		t.Fatal(err)
	}
	if norm, _ := g.read(); norm != 50 {
		t.Fatalf("norm %g", norm)
	}
	if s := g.scale().Host()[0]; s != float32(1/(50+1e-6)) {
		t.Fatalf("clip scale %g, want 1/(50+1e-6)", s)
	}
	o.StepScaled(0.1, g.scale())
	// Adam's first step moves every weight by lr*sign(g), whatever the
	// scale: clipping must not change that.
	for i, w := range p.Data.Host() {
		if math.Abs(float64(w)+0.1) > 1e-5 {
			t.Errorf("w[%d] = %g after one step, want -0.1", i, w)
		}
	}
}

// normOf is the gradient norm of params summed over the TP group tp, by
// the training step's rule.
func normOf(dev tensor.Device, params []*parallel.Param, tp nccl.Comm, clip float64) (float64, error) {
	tpg := parallel.NewDeviceGroup(tp, dev)
	g, err := newGradNorm(dev, len(params), clip, nil, tpg)
	if err != nil {
		return 0, err
	}
	defer g.close()
	if err := g.compute(normViews(params, nil, tpg.Rank(), func(i int) (*tensor.Tensor, int) { return params[i].Grad, 0 })); err != nil {
		return 0, err
	}
	return g.read()
}
