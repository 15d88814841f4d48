package parallel

import (
	"fmt"
	"testing"

	"github.com/hpcrun/hpcrun/nccl"
	"github.com/hpcrun/hpcrun/tensor"
)

// TestSizesAreWhatLayersAllocate runs a block, the embeddings, an LM head
// and the loss forward and backward at tp 1, 2 and 2 with sequence
// parallelism, and checks that the bytes they allocate are their size
// tables' to the byte: the blocks' (BlockSizes) and the region's
// (SequenceParallelSizes, reserved first), then a shadow's Forward adds
// only its layers' Saved buffers.
func TestSizesAreWhatLayersAllocate(t *testing.T) {
	for _, tc := range []struct {
		tp int
		sp bool
	}{{1, false}, {2, false}, {2, true}} {
		t.Run(fmt.Sprintf("tp%d sp %v", tc.tp, tc.sp), func(t *testing.T) {
			err := nccl.RunInProcess(tc.tp, func(c nccl.Comm) error {
				return checkSizes(c, tc.sp)
			})
			if err != nil {
				t.Fatal(err)
			}
		})
	}
}

func checkSizes(c nccl.Comm, withSP bool) error {
	dev := tensor.NewCPU()
	tp := c.Size()
	var tpc nccl.Comm
	if tp > 1 {
		tpc = c
	}
	var sp *SequenceParallel
	if withSP {
		sp = NewSequenceParallel(tpc)
	}
	wte, err := NewVocabParallelEmbedding(dev, tpc, "wte", ckVocab, ckDim, ckSeed, 0)
	if err != nil {
		return err
	}
	wpe, err := NewPositionEmbedding(dev, "wpe", ckT, ckDim, ckSeed, 0)
	if err != nil {
		return err
	}
	if sp != nil {
		if err := wte.SetSequenceParallel(sp); err != nil {
			return err
		}
		wpe.SetSequenceParallel(sp)
	}
	blk, err := NewBlock(dev, tpc, "h.0", BlockConfig{Dim: ckDim, Heads: ckHeads, Causal: true, Seed: ckSeed, SP: sp})
	if err != nil {
		return err
	}
	head, err := NewLMHead(tpc, "lm_head", wte)
	if err != nil {
		return err
	}
	loss, err := NewVocabParallelCrossEntropy(tpc, "loss", wte.Padded)
	if err != nil {
		return err
	}
	tl := ckT
	if sp != nil {
		tl = ckT / tp
	}
	ids, targets := make([]int32, ckB*ckT), make([]int32, ckB*ckT)
	for i := range ids {
		ids[i], targets[i] = int32(i*7%ckVocab), int32(i*5%ckVocab)
	}
	block := BlockSizes(BlockShape{Dim: ckDim, Heads: ckHeads, TP: tp, SP: sp != nil}, ckB, ckT)
	emb := EmbeddingSizes(ckB, tl, ckDim)
	lmHead := ColumnSizes(LinearShape{In: ckDim, Out: wte.Padded, TP: tp, SP: sp != nil}, ckB, ckT)
	ce := CrossEntropySizes(ckB * ckT)

	base := dev.MemStats().Current
	var want int64
	grads := 0
	for _, p := range append(blk.Params(), wpe.Params()...) {
		if p.SeqReduce {
			grads += p.Grad.Len()
		}
	}
	if sp != nil {
		if err := sp.Reserve(dev, ckB, ckT, ckDim, grads); err != nil {
			return err
		}
		want += SequenceParallelSizes(ckB, ckT, ckDim, tp, grads).Len()
	}
	step := func(blk *Block, wte *VocabParallelEmbedding, wpe *PositionEmbedding) error {
		x, err := wte.Forward(ids, ckB, ckT)
		if err != nil {
			return err
		}
		if x, err = wpe.Forward(x); err != nil {
			return err
		}
		if x, err = blk.Forward(x, nil); err != nil {
			return err
		}
		logits, err := head.Forward(x)
		if err != nil {
			return err
		}
		if _, err := loss.Forward(logits, targets); err != nil {
			return err
		}
		var dlogits, dx, dout *tensor.Tensor
		ts, err := Allocate(dev, Buffers{buf("dlogits", logits.Shape()...), buf("dx", x.Shape()...), buf("dout", x.Shape()...)}, func(get func(string) *tensor.Tensor) {
			dlogits, dx, dout = get("dlogits"), get("dx"), get("dout")
		})
		if err != nil {
			return err
		}
		defer func() {
			for _, t := range ts {
				dev.Free(t)
			}
		}()
		if err := loss.Backward(dlogits, 1); err != nil {
			return err
		}
		if err := head.Backward(dlogits, dout); err != nil {
			return err
		}
		if err := blk.Backward(dout, dx); err != nil {
			return err
		}
		if err := wpe.Backward(dx, nil); err != nil {
			return err
		}
		if err := wte.Backward(dx); err != nil {
			return err
		}
		if sp != nil {
			return sp.ReduceGrads(append(blk.Params(), wpe.Params()...))
		}
		return nil
	}
	check := func(what string, want int64) error {
		if got := dev.MemStats().Current - base; got != 4*want {
			return fmt.Errorf("rank %d: %s: %d B allocated, the size tables say %d B", c.Rank(), what, got, 4*want)
		}
		return nil
	}
	if err := step(blk, wte, wpe); err != nil {
		return err
	}
	want += block.Len() + 2*emb.Len() + lmHead.Len() + ce.Len()
	if err := check("a step", want); err != nil {
		return err
	}
	if err := step(blk.Shadow(), wte.Shadow(), wpe.Shadow()); err != nil {
		return err
	}
	want += block.Saved.Len() + 2*emb.Saved.Len()
	return check("a step of the shadows", want)
}
