package parallel

import (
	"fmt"
	"math"
	"math/rand/v2"
	"sync"
	"testing"

	"github.com/hpcrun/hpcrun/nccl"
	"github.com/hpcrun/hpcrun/tensor"
)

// TestBlockForwardCached: a GPT and a Llama block (grouped heads, scaled
// RoPE) fed one sequence in pieces through a key/value cache (a prefill
// of 3, single tokens, a piece of 2 after cached positions) give the
// outputs of Forward over the whole causal sequence within 1e-5, at tp 1
// and 2, with float32 and with bfloat16 activations (the fused Q,K,V
// rows, so the cached keys and values, stored as bf16); a piece past the
// cache's positions is refused.
func TestBlockForwardCached(t *testing.T) {
	const tt, c = 7, 16
	pieces := []int{3, 1, 1, 2}
	type cachedBlock interface {
		Forward(x *tensor.Tensor, keyValid []int32) (*tensor.Tensor, error)
		NewKVCache(max int) (*KVCache, error)
		ForwardCached(x *tensor.Tensor, c *KVCache) (*tensor.Tensor, error)
	}
	makers := map[string]func(dev tensor.Device, tp nccl.Comm, act tensor.DType) (cachedBlock, error){
		"gpt": func(dev tensor.Device, tp nccl.Comm, act tensor.DType) (cachedBlock, error) {
			return NewBlock(dev, tp, "h.0", BlockConfig{Dim: c, Heads: 4, Causal: true, Seed: 3, Std: 0.3, Activations: act})
		},
		"llama": func(dev tensor.Device, tp nccl.Comm, act tensor.DType) (cachedBlock, error) {
			return NewLlamaBlock(dev, tp, "model.layers.0", LlamaBlockConfig{Dim: c, Heads: 4, KVHeads: 2, Hidden: 24, Eps: 1e-5, Seed: 9, Std: 0.3,
				RoPE: RoPE{Theta: 100, Scaling: &RoPEScaling{Factor: 4, LowFreqFactor: 1, HighFreqFactor: 2, OriginalMaxPositions: 4}}, Activations: act})
		},
	}
	for _, name := range []string{"gpt", "llama"} {
		for _, c2 := range []struct {
			tp  int
			act tensor.DType
		}{{1, tensor.Float32}, {2, tensor.Float32}, {1, tensor.BFloat16}, {2, tensor.BFloat16}} {
			tp, act := c2.tp, c2.act
			t.Run(fmt.Sprintf("%s tp %d %s", name, tp, act), func(t *testing.T) {
				var mu sync.Mutex
				err := nccl.RunInProcess(tp, func(comm nccl.Comm) error {
					dev := tensor.NewCPU()
					blk, err := makers[name](dev, comm, act)
					if err != nil {
						return err
					}
					r := rand.New(rand.NewPCG(5, 6))
					x, xv := uploadRand(t, dev, r, 1, tt, c)
					full, err := blk.Forward(x, nil)
					if err != nil {
						return err
					}
					want := make([]float32, full.Len())
					dev.CopyToHost(want, full)
					cache, err := blk.NewKVCache(tt)
					if err != nil {
						return err
					}
					defer cache.Release()
					if cache.k.DType() != act {
						return fmt.Errorf("the cache keeps its keys as %v, want %v", cache.k.DType(), act)
					}
					pos := 0
					worst := 0.0
					for _, n := range pieces {
						in, err := dev.Alloc(1, n, c)
						if err != nil {
							return err
						}
						dev.CopyFromHost(in, xv[pos*c:(pos+n)*c])
						out, err := blk.ForwardCached(in, cache)
						if err != nil {
							return err
						}
						got := make([]float32, out.Len())
						dev.CopyToHost(got, out)
						for i, g := range got {
							worst = math.Max(worst, math.Abs(float64(g-want[pos*c+i])))
						}
						pos += n
						if cache.Len() != pos {
							return fmt.Errorf("cache holds %d positions after %d", cache.Len(), pos)
						}
					}
					in, _ := dev.Alloc(1, tt-pos+1, c)
					if _, err := blk.ForwardCached(in, cache); err == nil {
						return fmt.Errorf("%d positions past a cache of %d: no error", tt+1, tt)
					}
					mu.Lock()
					defer mu.Unlock()
					if worst > 1e-5 {
						t.Errorf("rank %d: cached outputs differ from Forward's by up to %.3g", comm.Rank(), worst)
					}
					t.Logf("rank %d: max |cached - full| %.2g", comm.Rank(), worst)
					return nil
				})
				if err != nil {
					t.Fatal(err)
				}
			})
		}
	}
}
