package cuda

import (
	"fmt"
	"math"

	"github.com/hpcrun/hpcrun/tensor"
)

// The fused attention kernels (kernels.cu, "fused causal attention"):
// FlashAttention-2 on tensor cores, one instantiation per head size.

// flashHeadSizes are the head sizes the fused kernels are built for:
// one instantiation of each kernel per size in kernels.cu.
var flashHeadSizes = tensor.FusedAttentionHeadSizes

const (
	flashRows    = 64  // FA_ROWS: query (key) rows a block
	flashThreads = 128 // FA_THREADS: four warps of 16 rows
	flashPad     = 8   // FA_PAD
)

// flashShared is the dynamic shared memory of a fused kernel on heads of
// hs: the forward stages its queries, keys and values (three bf16 tiles
// of flashRows x (hs+flashPad)); a backward kernel four tiles, and the
// dK/dV one two float rows besides.
func flashShared(name string, hs int) int {
	tile := flashRows * (hs + flashPad) * 2
	switch name {
	case "flash_forward":
		return 3 * tile
	case "flash_backward_dq":
		return 4 * tile
	}
	return 4*tile + 2*flashRows*4
}

// flashKernel is the entry point of kernel name for heads of hs and a
// qkv stored as dt.
func flashKernel(name string, hs int, dt tensor.DType) string {
	if dt == tensor.BFloat16 {
		return fmt.Sprintf("%s_%d_bf16", name, hs)
	}
	return fmt.Sprintf("%s_%d", name, hs)
}

// flashKernels are the fused kernels of the table, with their dynamic
// shared memory: Open raises each kernel's limit to it past 48 KiB.
func flashKernels() map[string]int {
	m := map[string]int{}
	for _, name := range []string{"flash_forward", "flash_backward_dkdv", "flash_backward_dq"} {
		for _, hs := range flashHeadSizes {
			for _, dt := range []tensor.DType{tensor.Float32, tensor.BFloat16} {
				m[flashKernel(name, hs, dt)] = flashShared(name, hs)
			}
		}
	}
	return m
}

// FusedAttentionUnsupported says why the device does not run its fused
// attention on heads of headSize, or "" when it does: it needs tensor
// cores with bf16 (sm_80 or newer), a matrix precision that already
// rounds (tf32 or bf16: at fp32 the unfused path keeps float32 products),
// and a head size it is built for.
func (d *Device) FusedAttentionUnsupported(headSize int) string {
	switch {
	case d.ccMajor < 8:
		return fmt.Sprintf("%s has no bf16 tensor cores (sm_80 or newer has)", d.Describe())
	case d.MatmulPrecision() == tensor.FP32:
		return "precision fp32: the fused kernels multiply bf16 operands (use --precision tf32 or bf16)"
	}
	return flashSupported(headSize)
}

// flashDims checks the fused attention's operands against l and returns
// B and T.
func flashDims(fn string, qkv, out, rowStats *tensor.Tensor, l tensor.HeadLayout, keyValid []int32) (b, t int) {
	if l.Heads < 1 || l.KVHeads < 1 || l.Heads%l.KVHeads != 0 {
		panic(fmt.Sprintf("cuda.%s: %d kv heads do not divide %d heads", fn, l.KVHeads, l.Heads))
	}
	if qkv.Rank() != 3 || qkv.Dim(2) != l.Row {
		panic(fmt.Sprintf("cuda.%s: qkv %v must be (B,T,%d)", fn, qkv, l.Row))
	}
	b, t = qkv.Dim(0), qkv.Dim(1)
	if out.Len() != b*t*l.Heads*l.HeadSize {
		panic(fmt.Sprintf("cuda.%s: out %v must hold (%d,%d,%d)", fn, out, b, t, l.Heads*l.HeadSize))
	}
	if rowStats.Len() != b*l.Heads*t {
		panic(fmt.Sprintf("cuda.%s: lse %v must hold (%d,%d,%d)", fn, rowStats, b, l.Heads, t))
	}
	if keyValid != nil && len(keyValid) != b*t {
		panic(fmt.Sprintf("cuda.%s: %d key-valid entries for (%d,%d)", fn, len(keyValid), b, t))
	}
	if why := flashSupported(l.HeadSize); why != "" {
		panic(fmt.Sprintf("cuda.%s: %s", fn, why))
	}
	return b, t
}

// flashSupported says why the kernels do not take heads of hs, or "".
func flashSupported(hs int) string {
	for _, s := range flashHeadSizes {
		if s == hs {
			return ""
		}
	}
	return fmt.Sprintf("head size %d: the fused kernels are built for %v", hs, flashHeadSizes)
}

// flashArgs are the layout and mask arguments the fused kernels share.
func flashArgs(l tensor.HeadLayout, t int, valid uintptr, causal bool) []karg {
	c := 0
	if causal {
		c = 1
	}
	return []karg{ptr(valid), i32(t), i32(l.Heads), i32(l.Heads / l.KVHeads), i32(l.Row), i32(l.KVStride),
		i32(l.Q), i32(l.K), i32(l.V), i32(c), f32(float32(1 / math.Sqrt(float64(l.HeadSize))))}
}

// FusedAttentionForward is tensor.FusedAttention's forward: out
// (B,T,Heads*HeadSize) and lse (B,Heads,T) from qkv laid out as l; qkv
// and out both float32 or both bfloat16 (out rounded on store).
func (d *Device) FusedAttentionForward(out, lse, qkv *tensor.Tensor, l tensor.HeadLayout, causal bool, keyValid []int32) {
	d.own("FusedAttentionForward", lse)
	d.ownAny("FusedAttentionForward", out, qkv)
	if out.DType() != qkv.DType() {
		panic(fmt.Sprintf("cuda.FusedAttentionForward: out %v and qkv %v: both float32 or both bfloat16", out, qkv))
	}
	b, t := flashDims("FusedAttentionForward", qkv, out, lse, l, keyValid)
	if b*t == 0 {
		return
	}
	valid, ok := d.enterMasked(keyValid)
	if !ok {
		return
	}
	defer d.leave()
	name := flashKernel("flash_forward", l.HeadSize, qkv.DType())
	grid := dim3{uint32((t + flashRows - 1) / flashRows), uint32(l.Heads), uint32(b)}
	args := append([]karg{tp(out), tp(lse), tp(qkv)}, flashArgs(l, t, valid, causal)...)
	d.launchShared(name, grid, dim3{flashThreads, 1, 1}, flashShared("flash_forward", l.HeadSize), args...)
}

// FusedAttentionBackward is tensor.FusedAttention's backward: it adds the
// gradient into dqkv; delta (B,Heads,T) is scratch. dqkv, dout and out
// are stored as qkv (a bfloat16 dqkv rounded once, as it is written).
func (d *Device) FusedAttentionBackward(dqkv, delta, dout, out, lse, qkv *tensor.Tensor, l tensor.HeadLayout, causal bool, keyValid []int32) {
	d.own("FusedAttentionBackward", delta, lse)
	d.ownAny("FusedAttentionBackward", dqkv, dout, out, qkv)
	for _, x := range []*tensor.Tensor{dqkv, dout, out} {
		if x.DType() != qkv.DType() {
			panic(fmt.Sprintf("cuda.FusedAttentionBackward: dqkv %v, dout %v and out %v must be stored as qkv %v", dqkv, dout, out, qkv))
		}
	}
	b, t := flashDims("FusedAttentionBackward", qkv, out, lse, l, keyValid)
	if dqkv.Len() != qkv.Len() || dout.Len() != out.Len() || delta.Len() != lse.Len() {
		panic(fmt.Sprintf("cuda.FusedAttentionBackward: dqkv %v, dout %v, delta %v must be as qkv %v, out %v, lse %v", dqkv, dout, delta, qkv, out, lse))
	}
	if b*t == 0 {
		return
	}
	valid, ok := d.enterMasked(keyValid)
	if !ok {
		return
	}
	defer d.leave()
	rows := b * t * l.Heads
	deltaKernel := "flash_backward_delta"
	if out.DType() == tensor.BFloat16 {
		deltaKernel += "_bf16"
	}
	d.launch(deltaKernel, d.grid1(rows, softmaxThreads/32), dim3{softmaxThreads, 1, 1},
		tp(delta), tp(out), tp(dout), i64(rows), i32(t), i32(l.Heads), i32(l.HeadSize))
	tiles := uint32((t + flashRows - 1) / flashRows)
	args := append([]karg{tp(dqkv), tp(qkv), tp(dout), tp(lse), tp(delta)}, flashArgs(l, t, valid, causal)...)
	for _, k := range []struct {
		name  string
		heads int
	}{{"flash_backward_dkdv", l.KVHeads}, {"flash_backward_dq", l.Heads}} {
		d.launchShared(flashKernel(k.name, l.HeadSize, qkv.DType()), dim3{tiles, uint32(k.heads), uint32(b)}, dim3{flashThreads, 1, 1},
			flashShared(k.name, l.HeadSize), args...)
	}
}

// defaultDynShared is the dynamic shared memory a kernel may launch with
// before cuFuncSetAttribute raises its limit.
const defaultDynShared = 48 << 10
