package train

import (
	"math"
	"testing"

	"github.com/hpcrun/hpcrun/nccl"
	"github.com/hpcrun/hpcrun/parallel"
	"github.com/hpcrun/hpcrun/tensor"
	"github.com/hpcrun/hpcrun/train/data"
)

// TestGradientsMatchFiniteDifferences checks the explicit backward pass of
// both models against central differences of the loss, for a sample of
// entries of every parameter.
func TestGradientsMatchFiniteDifferences(t *testing.T) {
	for _, model := range []string{"bert", "gpt"} {
		t.Run(model, func(t *testing.T) {
			cfg := smallConfig(model)
			cfg.Layers, cfg.Dim, cfg.Seq, cfg.BatchSize = 1, 16, 8, 2
			if model == "gpt" {
				cfg.Data = textFile(t)
			}
			ds, err := data.Prepare(cfg)
			if err != nil {
				t.Fatal(err)
			}
			world := nccl.NewInProcess(1)[0]
			m, err := parallel.NewMesh(world, 1)
			if err != nil {
				t.Fatal(err)
			}
			mod, err := newModel(cfg, ds, m, tensor.NewCPU())
			if err != nil {
				t.Fatal(err)
			}
			defer mod.Close()
			// Larger weights than the init's make attention far from
			// uniform, so that every gradient is large enough to check.
			for _, p := range mod.Params() {
				if p.Decay {
					for i, v := range p.Data.Host() {
						p.Data.Host()[i] = 8 * v
					}
				}
			}
			var b data.Batch
			ds.Train.Gather(&b, []int{0, 1})
			if model == "bert" {
				b.Lengths[1] = 5 // exercise the padding mask
			}
			mod.MarkGradsStale()
			if _, err := mod.Forward(&b, true); err != nil {
				t.Fatal(err)
			}
			if err := mod.Backward(1); err != nil {
				t.Fatal(err)
			}
			checked := 0
			for _, p := range mod.Params() {
				w, g := p.Data.Host(), p.Grad.Host()
				stride := max(1, len(w)/5)
				for i := 0; i < len(w); i += stride {
					if model == "gpt" && p.Name == "wte.weight" && i >= 256*cfg.Dim {
						break
					}
					// Small: the residual stream starts tiny (std 0.02), so
					// the loss is strongly curved along biases added to it.
					const eps = 1e-3
					old := w[i]
					w[i] = old + eps
					lp, _ := mod.Forward(&b, false)
					w[i] = old - eps
					lm, _ := mod.Forward(&b, false)
					w[i] = old
					num := (lp - lm) / (2 * float64(eps))
					if d := math.Abs(num - float64(g[i])); d > 5e-4+0.03*math.Abs(num) {
						t.Errorf("%s[%d]: backward %.6g, finite difference %.6g", p.Name, i, g[i], num)
					}
					checked++
				}
			}
			t.Logf("%d gradient entries checked", checked)
		})
	}
}
