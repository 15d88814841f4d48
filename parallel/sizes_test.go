package parallel

import (
	"fmt"
	"math"
	"slices"
	"strings"
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
	wte, err := NewVocabParallelEmbedding(dev, tpc, "wte", ckVocab, ckDim, ckSeed, 0, nil)
	if err != nil {
		return err
	}
	wpe, err := NewPositionEmbedding(dev, "wpe", ckT, ckDim, ckSeed, 0, nil)
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
	head, err := NewLMHead(tpc, "lm_head", wte, tensor.Float32)
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
	emb := EmbeddingSizes(ckB, tl, ckDim, tensor.Float32)
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
		if err := sp.Reserve(dev, ckB, ckT, ckDim, grads, tensor.Float32); err != nil {
			return err
		}
		want += SequenceParallelSizes(ckB, ckT, ckDim, tp, grads, tensor.Float32).Len()
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
		var dlogits, dout *tensor.Tensor
		ts, err := Allocate(dev, Buffers{buf("dlogits", logits.Shape()...), buf("dout", x.Shape()...)}, func(get func(string) *tensor.Tensor) {
			dlogits, dout = get("dlogits"), get("dout")
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
		if err := blk.BackwardInPlace(dout); err != nil { // the model's residual path
			return err
		}
		if err := wpe.Backward(dout, nil); err != nil {
			return err
		}
		if err := wte.Backward(dout); err != nil {
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

// TestRecomputeIsBitIdentical runs two blocks sharing their buffers
// (ShareBuffers) forward and backward under each recomputation, at tp 1,
// 2 and 2 with sequence parallelism, for a causal and a masked attention:
// the output, the input gradient and every parameter gradient are those
// without recomputation to the bit, and the bytes allocated are the
// table's, each block's Saved and the Scratch once (and a shadow of each
// block adds its Saved).
func TestRecomputeIsBitIdentical(t *testing.T) {
	for _, tc := range []struct {
		tp     int
		sp     bool
		causal bool
		llama  bool
	}{{1, false, true, false}, {2, false, false, false}, {2, true, true, false}, {1, false, true, true}, {2, false, true, true}, {2, true, true, true}} {
		t.Run(fmt.Sprintf("tp%d sp %v causal %v llama %v", tc.tp, tc.sp, tc.causal, tc.llama), func(t *testing.T) {
			err := nccl.RunInProcess(tc.tp, func(c nccl.Comm) error {
				var ref [][]float32
				for _, mode := range []Recompute{RecomputeNone, RecomputeSelective, RecomputeFull} {
					got, err := runRecompute(c, tc.sp, tc.causal, tc.llama, mode)
					if err != nil {
						return fmt.Errorf("recompute %d: %w", mode, err)
					}
					if ref == nil {
						ref = got
						continue
					}
					for i := range ref {
						for j := range ref[i] {
							if math.Float32bits(got[i][j]) != math.Float32bits(ref[i][j]) {
								return fmt.Errorf("rank %d, recompute %d: tensor %d differs at %d: %g, without recomputation %g", c.Rank(), mode, i, j, got[i][j], ref[i][j])
							}
						}
					}
				}
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
		})
	}
}

// runRecompute returns the output, the input gradient and the parameter
// gradients of two blocks under mode, checking the bytes they allocate
// against the table; then a shadow of each runs the same and must give
// the same.
func runRecompute(c nccl.Comm, withSP, causal, llama bool, mode Recompute) ([][]float32, error) {
	dev := tensor.NewCPU()
	tp := c.Size()
	var tpc nccl.Comm
	if tp > 1 {
		tpc = c
	}
	var sp *SequenceParallel
	tl := ckT
	if withSP {
		sp, tl = NewSequenceParallel(tpc), ckT/tp
	}
	var blocks []recomputeBlock
	var params []*Param
	for l := range 2 {
		var b recomputeBlock
		var err error
		if llama {
			b, err = NewLlamaBlock(dev, tpc, fmt.Sprintf("model.layers.%d", l), LlamaBlockConfig{Dim: ckDim, Heads: 2 * ckHeads, KVHeads: ckHeads, Hidden: 3 * ckDim / 2,
				Eps: 1e-5, Seed: ckSeed, Std: 0.2, SP: sp, Recompute: mode})
		} else {
			b, err = NewBlock(dev, tpc, fmt.Sprintf("h.%d", l), BlockConfig{Dim: ckDim, Heads: ckHeads, Causal: causal, Seed: ckSeed, Std: 0.2, SP: sp, Recompute: mode})
		}
		if err != nil {
			return nil, err
		}
		if l > 0 {
			b.share(blocks[0])
		}
		blocks, params = append(blocks, b), append(params, b.Params()...)
	}
	var keyValid []int32
	if !causal {
		keyValid = make([]int32, ckB*ckT)
		for i := range keyValid {
			if i%ckT < ckT-1-i/ckT {
				keyValid[i] = 1
			}
		}
	}
	var x, dout, dx *tensor.Tensor
	io, err := Allocate(dev, Buffers{buf("x", ckB, tl, ckDim), buf("dout", ckB, tl, ckDim), buf("dx", ckB, tl, ckDim)}, func(get func(string) *tensor.Tensor) {
		x, dout, dx = get("x"), get("dout"), get("dx")
	})
	if err != nil {
		return nil, err
	}
	host := make([]float32, x.Len())
	for i := range host {
		host[i] = float32((i+c.Rank()*131)%17)/17 - 0.5
	}
	dev.CopyFromHost(x, host)
	for i := range host {
		host[i] = float32((i+c.Rank()*71)%13)/13 - 0.5
	}
	dev.CopyFromHost(dout, host)
	grads := 0
	for _, p := range params {
		if p.SeqReduce {
			grads += p.Grad.Len()
		}
	}
	base := dev.MemStats().Current
	table := BlockSizes(BlockShape{Dim: ckDim, Heads: ckHeads, TP: tp, SP: withSP, Recompute: mode}, ckB, ckT)
	if llama {
		table = LlamaBlockSizes(LlamaBlockShape{Dim: ckDim, Heads: 2 * ckHeads, KVHeads: ckHeads, Hidden: 3 * ckDim / 2, TP: tp, SP: withSP, Recompute: mode}, ckB, ckT)
	}
	want := 2*table.Saved.Len() + table.Scratch.Len()
	if sp != nil {
		if err := sp.Reserve(dev, ckB, ckT, ckDim, grads, tensor.Float32); err != nil {
			return nil, err
		}
		want += SequenceParallelSizes(ckB, ckT, ckDim, tp, grads, tensor.Float32).Len()
	}
	var out [][]float32
	run := func(blocks []recomputeBlock) error {
		ZeroGrads(params)
		dev.Zero(dx)
		h := x
		for _, b := range blocks {
			if h, err = b.Forward(h, keyValid); err != nil {
				return err
			}
		}
		out = append(out[:0], download(h))
		d := dout
		for i := len(blocks) - 1; i >= 0; i-- {
			dev.Zero(dx)
			if err := blocks[i].Backward(d, dx); err != nil {
				return err
			}
			if i > 0 {
				dev.Copy(dout, dx) // the next block's output gradient
			}
		}
		dev.CopyFromHost(dout, host)
		if sp != nil {
			if err := sp.ReduceGrads(params); err != nil {
				return err
			}
		}
		out = append(out, download(dx))
		for _, p := range params {
			out = append(out, download(p.Grad))
		}
		return nil
	}
	if err := run(blocks); err != nil {
		return nil, err
	}
	if got := dev.MemStats().Current - base; got != 4*want {
		return nil, fmt.Errorf("rank %d: %d B allocated, the table says %d B", c.Rank(), got, 4*want)
	}
	first := append([][]float32(nil), out...)
	shadows := []recomputeBlock{blocks[0].shadow(), blocks[1].shadow()}
	if err := run(shadows); err != nil {
		return nil, err
	}
	if got := dev.MemStats().Current - base; got != 4*(want+2*table.Saved.Len()) {
		return nil, fmt.Errorf("rank %d: %d B allocated with the shadows, the table says %d B", c.Rank(), got, 4*(want+2*table.Saved.Len()))
	}
	for i := range first {
		if !slices.Equal(first[i], out[i]) {
			return nil, fmt.Errorf("rank %d: the shadows' tensor %d differs", c.Rank(), i)
		}
	}
	for _, t := range io {
		dev.Free(t)
	}
	return first, nil
}

// recomputeBlock is a GPT or a Llama block in runRecompute.
type recomputeBlock interface {
	Forward(x *tensor.Tensor, keyValid []int32) (*tensor.Tensor, error)
	Backward(dout, dx *tensor.Tensor) error
	Params() []*Param
	share(with recomputeBlock)
	shadow() recomputeBlock
}

func (b *Block) share(with recomputeBlock)      { b.ShareBuffers(with.(*Block)) }
func (b *Block) shadow() recomputeBlock         { return b.Shadow() }
func (b *LlamaBlock) share(with recomputeBlock) { b.ShareBuffers(with.(*LlamaBlock)) }
func (b *LlamaBlock) shadow() recomputeBlock    { return b.Shadow() }

// TestBF16ActivationDTypes: at bfloat16 activations the buffers only
// products and the activation and attention kernels read are BFloat16
// (the MLP's hidden one and its pre-activation, fc's output, and the
// hidden one's gradient, which GELU's backward overwrites, a Llama's
// gradients of h and of gate_up_proj's output; the fused Q,K,V
// projection's output, the unfused attention's probabilities and the
// gradient of its scores, dpre, the heads' output y and its gradient dy,
// the gradient of the Q,K,V projection's output dqkv, but for a grouped
// Llama's unfused attention, which sums a group's heads into it; the
// norms' outputs of a pre-norm block, with or without sequence
// parallelism, which all-gathers them as bf16, and its residual stream,
// r and out, and the gradients of r and of a norm's output, dr and dh),
// everything else Float32; in
// BERT's post-norm layers (the norm output is the residual stream) the
// norms' outputs, the residual stream and its gradient stay Float32, and
// the output projections round that gradient (dout_half), which a
// pre-norm block's receive as bf16 (no dout_half). Bytes count 2 a
// BFloat16 element.
func TestBF16ActivationDTypes(t *testing.T) {
	mlp := map[string]bool{"attn.dpre": true, "mlp.h": true, "mlp.dh": true, "mlp.c_fc.out_local": true, "attn.c_attn.out_local": true, "attn.att": true, "attn.y": true, "attn.dy": true, "attn.dqkv": true}
	half := map[string]bool{"ln_1.out": true, "ln_2.out": true, "r": true, "out": true, "dr": true, "dh": true}
	for k := range mlp {
		half[k] = true
	}
	mlp["attn.c_proj.dout_half"], mlp["mlp.c_proj.dout_half"] = true, true
	for _, c := range []struct {
		name string
		s    BlockShape
		want map[string]bool
	}{
		{"pre-norm", BlockShape{Dim: 8, Heads: 2, TP: 1, Activations: tensor.BFloat16}, half},
		{"sp", BlockShape{Dim: 8, Heads: 2, TP: 2, SP: true, Activations: tensor.BFloat16}, half},
		{"post-norm", BlockShape{Dim: 8, Heads: 2, TP: 1, PostNorm: true, Activations: tensor.BFloat16}, mlp},
		{"fp32", BlockShape{Dim: 8, Heads: 2, TP: 1}, nil},
	} {
		z := BlockSizes(c.s, 2, 4)
		if c.s.PostNorm && c.s.Activations == tensor.BFloat16 {
			rounds := 0
			for _, b := range z.Scratch {
				if strings.HasSuffix(b.Name, "dout_half") {
					rounds++
				}
			}
			if rounds != 2 {
				t.Errorf("%s: %d output projections round the float32 stream's gradient (dout_half), want 2", c.name, rounds)
			}
		}
		var bytes int64
		for _, b := range append(z.Saved, z.Scratch...) {
			want := tensor.Float32
			if c.want[b.Name] {
				want = tensor.BFloat16
			}
			if b.DType != want {
				t.Errorf("%s: %s is %s, want %s", c.name, b.Name, b.DType, want)
			}
			if strings.HasSuffix(b.Name, "dout_half") && !c.s.PostNorm {
				t.Errorf("%s: %s: the stream's gradient arrives as the activations, nothing to round", c.name, b.Name)
			}
			bytes += b.Len() * int64(want.Size())
		}
		if z.Bytes() != bytes {
			t.Errorf("%s: Bytes %d, want %d", c.name, z.Bytes(), bytes)
		}
	}
	for _, c := range []struct {
		kvHeads  int
		fused    bool
		halfDQKV bool
	}{{1, false, false}, {2, false, true}, {1, true, true}} {
		l := LlamaBlockSizes(LlamaBlockShape{Dim: 64, Heads: 2, KVHeads: c.kvHeads, Hidden: 12, TP: 1, FusedAttention: c.fused, Activations: tensor.BFloat16}, 2, 4)
		for _, b := range append(l.Saved, l.Scratch...) {
			isHalf := b.Name == "mlp.h" || b.Name == "mlp.gate_up_proj.out_local" || b.Name == "self_attn.qkv_proj.out_local" || b.Name == "self_attn.att" || b.Name == "self_attn.y" ||
				b.Name == "input_layernorm.out" || b.Name == "post_attention_layernorm.out" || b.Name == "mlp.dh" || b.Name == "mlp.dgate_up" || b.Name == "self_attn.dpre" ||
				b.Name == "self_attn.dy" || (b.Name == "self_attn.dqkv" && c.halfDQKV) || b.Name == "r" || b.Name == "out" || b.Name == "dr" || b.Name == "dh"
			if (b.DType == tensor.BFloat16) != isHalf || strings.HasSuffix(b.Name, "dout_half") {
				t.Errorf("llama, %d kv heads, fused %v: %s is %s", c.kvHeads, c.fused, b.Name, b.DType)
			}
		}
	}
}
