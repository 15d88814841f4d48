package cuda

import (
	"fmt"
	"math"
	"unsafe"

	"github.com/hpcrun/hpcrun/tensor"
	"github.com/hpcrun/hpcrun/tensor/internal/check"
)

// kernels are the entry points of kernels.cu, looked up at Open, with the
// most threads a block the Go side launches each with: elementwise and
// softmax kernels elemThreads (softmaxThreads), one-block-per-row kernels
// up to maxRowThreads (rowThreads), bias_backward 32x32. The NVRTC test
// checks that each kernel's register count allows its largest launch.
var kernels = []struct {
	name       string
	maxThreads int
}{
	{"fill_f32", elemThreads}, {"add_f32", elemThreads}, {"add_bf16_from_bf16", elemThreads}, {"add_bf16", elemThreads}, {"axpy_f32", elemThreads},
	{"axpy_f32_from_bf16", elemThreads}, {"axpy_bf16", elemThreads}, {"axpy_bf16_from_bf16", elemThreads},
	{"scale_f32", elemThreads}, {"block2d_f32", elemThreads}, {"f32_to_bf16", elemThreads},
	{"round_bf16", elemThreads}, {"widen_bf16", elemThreads}, {"copy2d_bf16", elemThreads}, {"rope_bf16", elemThreads},
	{"add_bias_f32", elemThreads}, {"add_bias_bf16", elemThreads}, {"bias_backward_f32", 32 * 32}, {"bias_backward_f32_from_bf16", 32 * 32},
	{"embedding_forward_f32", maxRowThreads}, {"embedding_forward_bf16", maxRowThreads}, {"embedding_backward_f32", maxRowThreads},
	{"embedding_backward_f32_from_bf16", maxRowThreads},
	{"layernorm_forward_f32", maxRowThreads}, {"layernorm_forward_bf16", maxRowThreads}, {"layernorm_forward_f32_from_bf16", maxRowThreads},
	{"layernorm_forward_bf16_from_bf16", maxRowThreads}, {"layernorm_forward_f32_sum_bf16", maxRowThreads}, {"layernorm_forward_bf16_sum_bf16", maxRowThreads},
	{"layernorm_backward_f32", maxRowThreads}, {"layernorm_backward_f32_from_bf16", maxRowThreads},
	{"layernorm_backward_bf16", maxRowThreads}, {"layernorm_backward_bf16_from_bf16", maxRowThreads},
	{"layernorm_backward_f32_grad_bf16", maxRowThreads}, {"layernorm_backward_f32_from_bf16_grad_bf16", maxRowThreads},
	{"layernorm_backward_bf16_grad_bf16", maxRowThreads}, {"layernorm_backward_bf16_from_bf16_grad_bf16", maxRowThreads},
	{"layernorm_param_grads_f32", elemThreads},
	{"rmsnorm_forward_f32", maxRowThreads}, {"rmsnorm_forward_bf16", maxRowThreads}, {"rmsnorm_forward_f32_from_bf16", maxRowThreads},
	{"rmsnorm_forward_bf16_from_bf16", maxRowThreads}, {"rmsnorm_forward_f32_sum_bf16", maxRowThreads}, {"rmsnorm_forward_bf16_sum_bf16", maxRowThreads},
	{"rmsnorm_backward_f32", maxRowThreads}, {"rmsnorm_backward_f32_from_bf16", maxRowThreads},
	{"rmsnorm_backward_bf16", maxRowThreads}, {"rmsnorm_backward_bf16_from_bf16", maxRowThreads},
	{"rmsnorm_backward_f32_grad_bf16", maxRowThreads}, {"rmsnorm_backward_f32_from_bf16_grad_bf16", maxRowThreads},
	{"rmsnorm_backward_bf16_grad_bf16", maxRowThreads}, {"rmsnorm_backward_bf16_from_bf16_grad_bf16", maxRowThreads},
	{"rmsnorm_param_grads_f32", elemThreads}, {"rope_f32", elemThreads},
	{"swiglu_forward_f32", elemThreads}, {"swiglu_forward_bf16", elemThreads},
	{"swiglu_forward_f32_from_bf16", elemThreads}, {"swiglu_forward_bf16_from_bf16", elemThreads},
	{"swiglu_backward_f32", elemThreads}, {"swiglu_backward_f32_from_bf16", elemThreads},
	{"swiglu_backward_bf16", elemThreads}, {"swiglu_backward_bf16_from_bf16", elemThreads},
	{"gelu_forward_f32", elemThreads}, {"gelu_forward_bf16", elemThreads},
	{"gelu_forward_f32_from_bf16", elemThreads}, {"gelu_forward_bf16_from_bf16", elemThreads},
	{"gelu_backward_f32", elemThreads}, {"gelu_backward_f32_from_bf16", elemThreads},
	{"tanh_forward_f32", elemThreads}, {"tanh_forward_bf16", elemThreads},
	{"tanh_forward_f32_from_bf16", elemThreads}, {"tanh_forward_bf16_from_bf16", elemThreads},
	{"tanh_backward_f32", elemThreads}, {"tanh_backward_f32_from_bf16", elemThreads},
	{"bias_gelu_forward_f32", elemThreads}, {"bias_gelu_forward_bf16", elemThreads}, {"bias_gelu_forward_f32_from_bf16", elemThreads}, {"bias_gelu_forward_bf16_from_bf16", elemThreads},
	{"gelu_backward_in_place_f32", elemThreads}, {"gelu_backward_in_place_f32_from_bf16", elemThreads},
	{"gelu_backward_in_place_bf16", elemThreads}, {"gelu_backward_in_place_bf16_from_bf16", elemThreads},
	{"bias_tanh_forward_f32", elemThreads}, {"bias_tanh_forward_bf16", elemThreads}, {"bias_tanh_forward_f32_from_bf16", elemThreads}, {"bias_tanh_forward_bf16_from_bf16", elemThreads},
	{"tanh_backward_in_place_f32", elemThreads}, {"tanh_backward_in_place_f32_from_bf16", elemThreads},
	{"tanh_backward_in_place_bf16", elemThreads}, {"tanh_backward_in_place_bf16_from_bf16", elemThreads},
	{"softmax_forward_f32", softmaxThreads}, {"softmax_backward_f32", softmaxThreads},
	{"softmax_forward_bf16", softmaxThreads}, {"softmax_backward_f32_from_bf16", softmaxThreads},
	{"softmax_backward_bf16", softmaxThreads}, {"softmax_backward_bf16_from_bf16", softmaxThreads},
	{"ce_row_max_f32", maxRowThreads}, {"ce_sum_exp_f32", maxRowThreads},
	{"ce_target_logit_f32", elemThreads}, {"ce_loss_f32", elemThreads}, {"ce_backward_f32", maxRowThreads},
	{"ce_forward_f32", maxRowThreads}, {"ce_backward_in_place_f32", maxRowThreads},
	{"ce_row_max_f32_from_bf16", maxRowThreads}, {"ce_sum_exp_f32_from_bf16", maxRowThreads},
	{"ce_target_logit_f32_from_bf16", elemThreads}, {"ce_forward_f32_from_bf16", maxRowThreads},
	{"ce_backward_in_place_bf16_from_bf16", maxRowThreads}, {"fill_bf16", elemThreads},
	{"adamw_f32", elemThreads}, {"adamw_multi_f32", elemThreads}, {"sum_multi_f64", elemThreads},
	{"sum_squares_each_f64", elemThreads}, {"sum_blocks_f64", elemThreads}, {"clip_norm_f64", 1},
	{"sum_finish_f32", 1},
	{"flash_backward_delta", softmaxThreads}, {"flash_backward_delta_bf16", softmaxThreads},
	{"flash_forward_32", flashThreads}, {"flash_forward_64", flashThreads}, {"flash_forward_128", flashThreads},
	{"flash_backward_dkdv_32", flashThreads}, {"flash_backward_dkdv_64", flashThreads}, {"flash_backward_dkdv_128", flashThreads},
	{"flash_backward_dq_32", flashThreads}, {"flash_backward_dq_64", flashThreads}, {"flash_backward_dq_128", flashThreads},
	{"flash_forward_32_bf16", flashThreads}, {"flash_forward_64_bf16", flashThreads}, {"flash_forward_128_bf16", flashThreads},
	{"flash_backward_dkdv_32_bf16", flashThreads}, {"flash_backward_dkdv_64_bf16", flashThreads}, {"flash_backward_dkdv_128_bf16", flashThreads},
	{"flash_backward_dq_32_bf16", flashThreads}, {"flash_backward_dq_64_bf16", flashThreads}, {"flash_backward_dq_128_bf16", flashThreads},
}

// karg is one kernel argument in a 64-bit slot. cuLaunchKernel reads as
// many bytes as the parameter's C type has from the start of the slot, so
// on a little-endian machine a 4-byte int or float sits in the low half.
// The helper used must match the C parameter's type.
type karg uint64

func ptr(p uintptr) karg       { return karg(p) }
func i32(v int) karg           { return karg(uint32(int32(v))) }
func i64(v int) karg           { return karg(uint64(int64(v))) }
func f32(v float32) karg       { return karg(math.Float32bits(v)) }
func f64(v float64) karg       { return karg(math.Float64bits(v)) }
func tp(t *tensor.Tensor) karg { return karg(t.Ptr()) }

type dim3 struct{ x, y, z uint32 }

const elemThreads = 256

// grid1 is the grid of a grid-stride kernel over n units with threads per
// block: enough blocks to fill the device, no more than the work needs.
func (d *Device) grid1(n int, threads int) dim3 {
	b := (n + threads - 1) / threads
	b = min(b, d.sms*32)
	return dim3{uint32(max(b, 1)), 1, 1}
}

// maxRowThreads is the largest block of a one-block-per-row kernel
// (MAX_ROW_THREADS in kernels.cu, whose __launch_bounds__ allow it).
const maxRowThreads = 1024

// rowThreads is the block size of a one-block-per-row kernel over rows of
// c elements: a multiple of 32, at most maxRowThreads.
func rowThreads(c int) int {
	t := (c + 31) / 32 * 32
	return min(max(t, 32), maxRowThreads)
}

// launch enqueues kernel name. Called between enter and leave; a failed
// launch is recorded for Sync.
func (d *Device) launch(name string, grid, block dim3, args ...karg) {
	d.launchShared(name, grid, block, 0, args...)
}

// launchShared is launch with shared bytes of dynamic shared memory.
func (d *Device) launchShared(name string, grid, block dim3, shared int, args ...karg) {
	if len(args) > len(d.argv) {
		panic(fmt.Sprintf("cuda: %s has %d arguments, at most %d", name, len(args), len(d.argv)))
	}
	fn, ok := d.fn[name]
	if !ok {
		panic(fmt.Sprintf("cuda: kernel %s is not in the kernels list", name))
	}
	for i, a := range args {
		d.argv[i] = uint64(a)
	}
	r := call(d.l.cu.launchKernel, fn, uintptr(grid.x), uintptr(grid.y), uintptr(grid.z),
		uintptr(block.x), uintptr(block.y), uintptr(block.z), uintptr(shared), d.stream,
		uintptr(unsafe.Pointer(&d.argp[0])), 0)
	if r != 0 {
		d.fail(d.l.cuErr("cuLaunchKernel("+name+")", r))
	}
}

// elementwise launches a grid-stride kernel over n elements.
func (d *Device) elementwise(name string, n int, args ...karg) {
	if n == 0 {
		return
	}
	if d.enter() != nil {
		return
	}
	defer d.leave()
	d.launch(name, d.grid1(n, elemThreads), dim3{elemThreads, 1, 1}, args...)
}

// rowwise launches a one-block-per-row kernel over rows of c elements.
func (d *Device) rowwise(name string, rows, c int, args ...karg) {
	if rows == 0 {
		return
	}
	d.launch(name, dim3{uint32(min(rows, d.sms*32)), 1, 1}, dim3{uint32(rowThreads(c)), 1, 1}, args...)
}

// enterMasked enters the device (the caller leaves it when ok) and
// uploads a key mask for a kernel (0 for none), recording a failure for
// Sync.
func (d *Device) enterMasked(keyValid []int32) (uintptr, bool) {
	if d.enter() != nil {
		return 0, false
	}
	if keyValid == nil {
		return 0, true
	}
	p, ok := d.upIDs(keyValid)
	if !ok {
		d.leave()
	}
	return p, ok
}

// withIDs uploads ids and calls launch with their device address, inside
// the device's enter and leave (a failure recorded for Sync); skip
// launches nothing.
func (d *Device) withIDs(skip bool, ids []int32, launch func(ids karg)) {
	if skip || d.enter() != nil {
		return
	}
	defer d.leave()
	if p, ok := d.upIDs(ids); ok {
		launch(ptr(p))
	}
}

// upIDs uploads ids for a kernel, recording a failure for Sync.
func (d *Device) upIDs(ids []int32) (uintptr, bool) {
	p, err := d.upload(ids)
	if err != nil {
		d.fail(err)
		return 0, false
	}
	return p, true
}

// --- Fill, Zero, Add, Axpy, Scale ---

// Zero sets every element of t to 0 (of a bfloat16 t too).
func (d *Device) Zero(t *tensor.Tensor) {
	d.ownAny("Fill", t)
	if t.DType() != tensor.Float32 {
		d.Fill(t, 0)
		return
	}
	if t.Len() == 0 {
		return
	}
	if d.enter() != nil {
		return
	}
	defer d.leave()
	d.fail(d.l.cuErr("cuMemsetD32Async", call(d.l.cu.memsetD32Async, t.Ptr(), 0, uintptr(t.Len()), d.stream)))
}

// Fill sets every element of t to v (rounded once for a bfloat16 t).
func (d *Device) Fill(t *tensor.Tensor, v float32) {
	d.ownAny("Fill", t)
	d.elementwise(typed("fill", t.DType(), tensor.Float32), t.Len(), tp(t), f32(v), i64(t.Len()))
}

// Add is out = a + b elementwise; out may be bfloat16 (the float32 sum
// rounded once), and a where out is (widened).
func (d *Device) Add(out, a, b *tensor.Tensor) {
	d.ownAny("Add", out, a)
	d.own("Add", b)
	check.Add(out, a, b)
	check.ResidualSum("Add", a.DType(), out.DType(), tensor.BFloat16)
	d.elementwise(typed("add", out.DType(), a.DType()), out.Len(), tp(out), tp(a), tp(b), i64(out.Len()))
}

// Axpy is y += alpha*x elementwise; either may be bfloat16 (x widened, y
// rounded once).
func (d *Device) Axpy(y *tensor.Tensor, alpha float32, x *tensor.Tensor) {
	d.ownAny("Axpy", y, x)
	check.Axpy(y, x)
	d.elementwise(typed("axpy", y.DType(), x.DType()), y.Len(), tp(y), f32(alpha), tp(x), i64(y.Len()))
}

// Scale is x *= alpha elementwise.
func (d *Device) Scale(x *tensor.Tensor, alpha float32) {
	d.own("Scale", x)
	d.elementwise("scale_f32", x.Len(), tp(x), f32(alpha), i64(x.Len()))
}

// --- 2-D blocks ---

func (d *Device) block2D(fn string, dst *tensor.Tensor, dstOff, ldDst int, alpha float32, src *tensor.Tensor, srcOff, ldSrc, rows, cols int, accumulate bool) {
	d.own(fn, dst, src)
	if check.Block2D(fn, dst, dstOff, ldDst, src, srcOff, ldSrc, rows, cols) {
		return
	}
	acc := 0
	if accumulate {
		acc = 1
	}
	d.elementwise("block2d_f32", rows*cols,
		ptr(dst.Ptr()+uintptr(dstOff)*4), i64(ldDst), ptr(src.Ptr()+uintptr(srcOff)*4), i64(ldSrc),
		i64(rows), i32(cols), f32(alpha), i32(acc))
}

// Copy2D copies a (rows,cols) block: dst[dstOff+i*ldDst+j] = src[srcOff+i*ldSrc+j].
// dst and src may both be bfloat16.
func (d *Device) Copy2D(dst *tensor.Tensor, dstOff, ldDst int, src *tensor.Tensor, srcOff, ldSrc, rows, cols int) {
	if dst.DType() == tensor.Float32 && src.DType() == tensor.Float32 {
		d.block2D("Copy2D", dst, dstOff, ldDst, 1, src, srcOff, ldSrc, rows, cols, false)
		return
	}
	d.ownAny("Copy2D", dst, src)
	if check.Copy2DHalf(dst, dst.DType(), dstOff, ldDst, src, src.DType(), srcOff, ldSrc, rows, cols) {
		return
	}
	d.elementwise("copy2d_bf16", rows*cols,
		ptr(dst.Ptr()+uintptr(dstOff)*2), i64(ldDst), ptr(src.Ptr()+uintptr(srcOff)*2), i64(ldSrc), i64(rows), i32(cols))
}

// Axpy2D accumulates a (rows,cols) block: dst[dstOff+i*ldDst+j] += alpha*src[srcOff+i*ldSrc+j].
func (d *Device) Axpy2D(dst *tensor.Tensor, dstOff, ldDst int, alpha float32, src *tensor.Tensor, srcOff, ldSrc, rows, cols int) {
	d.block2D("Axpy2D", dst, dstOff, ldDst, alpha, src, srcOff, ldSrc, rows, cols, true)
}

// --- bias ---

// AddBias is out[i] += bias for every row. out is (N,OC), bias is (OC); a
// bfloat16 out is widened, added to and rounded again.
func (d *Device) AddBias(out, bias *tensor.Tensor) {
	d.ownAny("AddBias", out)
	d.own("AddBias", bias)
	check.AddBias(out, bias)
	d.elementwise(typed("add_bias", out.DType(), tensor.Float32), out.Len(), tp(out), tp(bias), i64(out.Len()), i32(bias.Len()))
}

// BiasBackward is dbias += column sums of dout. dbias is (OC), dout is
// (N,OC), float32 or bfloat16.
func (d *Device) BiasBackward(dbias, dout *tensor.Tensor) {
	d.own("BiasBackward", dbias)
	d.ownAny("BiasBackward", dout)
	n := check.BiasBackward(dbias, dout)
	oc := dbias.Len()
	if oc == 0 {
		return
	}
	if d.enter() != nil {
		return
	}
	defer d.leave()
	cols := (oc + 31) / 32
	// Enough chunks of rows for two blocks an SM, each of 32 rows at least.
	chunks := max(1, min((2*d.sms+cols-1)/cols, (n+31)/32))
	part, err := d.part.get(d, int64(chunks)*int64(oc)*4)
	if err != nil {
		d.fail(err)
		return
	}
	d.launch(typed("bias_backward", tensor.Float32, dout.DType()), dim3{uint32(cols), uint32(chunks), 1}, dim3{32, 32, 1}, ptr(part), tp(dout), i64(n), i32(oc))
	d.launch("rmsnorm_param_grads_f32", d.grid1(oc, elemThreads), dim3{elemThreads, 1, 1}, tp(dbias), ptr(part), i32(chunks), i32(oc))
}

// --- embedding ---

// EmbeddingForward is out[i] = table[ids[i]-vocabStart], zeros for ids
// outside the table's slice. out is (N,C), ids is (N), table is (V,C); a
// bfloat16 out gets the rows rounded.
func (d *Device) EmbeddingForward(out *tensor.Tensor, ids []int32, table *tensor.Tensor, vocabStart int) {
	d.own("EmbeddingForward", table)
	d.ownAny("EmbeddingForward", out)
	n := check.EmbeddingForward(out, ids, table)
	c := table.Cols()
	d.withIDs(n == 0 || c == 0, ids, func(p karg) {
		d.rowwise(typed("embedding_forward", out.DType(), tensor.Float32), n, c, tp(out), p, tp(table), i64(n), i32(c), i64(table.Len()/c), i64(vocabStart))
	})
}

// EmbeddingBackward is dtable[ids[i]-vocabStart] += dout[i] for the ids in
// the table's slice. dtable is (V,C), dout is (N,C), ids is (N); a
// bfloat16 dout is widened.
func (d *Device) EmbeddingBackward(dtable, dout *tensor.Tensor, ids []int32, vocabStart int) {
	d.own("EmbeddingBackward", dtable)
	d.ownAny("EmbeddingBackward", dout)
	n := check.EmbeddingBackward(dtable, dout, ids)
	c := dtable.Cols()
	d.withIDs(n == 0 || c == 0, ids, func(p karg) {
		d.rowwise(typed("embedding_backward", tensor.Float32, dout.DType()), n, c, tp(dtable), tp(dout), p, i64(n), i32(c), i64(dtable.Len()/c), i64(vocabStart))
	})
}

// --- layernorm ---

// LayerNormForward normalizes the rows of inp. out, inp are (N,C); mean,
// rstd are (N); weight, bias are (C). A bfloat16 out holds the float32
// results rounded; a bfloat16 inp is widened.
func (d *Device) LayerNormForward(out, mean, rstd, inp, weight, bias *tensor.Tensor, eps float32) {
	d.ownAny("LayerNormForward", out, inp)
	d.own("LayerNormForward", mean, rstd, weight, bias)
	n := check.LayerNormForward(out, mean, rstd, inp, weight, bias)
	if n == 0 || d.enter() != nil {
		return
	}
	defer d.leave()
	d.rowwise(normKernel("layernorm_forward", out, inp, inp), n, weight.Len(), tp(out), tp(mean), tp(rstd), tp(inp), 0, 0, tp(weight), tp(bias), i64(n), i32(weight.Len()), f32(eps))
}

// AddLayerNormForward is sum = a + b, then LayerNormForward of sum, in one
// kernel. A bfloat16 sum holds a + b rounded, which is what is
// normalised; a may be bfloat16 where sum is.
func (d *Device) AddLayerNormForward(sum, out, mean, rstd, a, b, weight, bias *tensor.Tensor, eps float32) {
	d.ownAny("AddLayerNormForward", out, sum, a)
	d.own("AddLayerNormForward", mean, rstd, b, weight, bias)
	n := check.AddLayerNormForward(sum, out, mean, rstd, a, b, weight, bias)
	check.ResidualSum("AddLayerNormForward", a.DType(), sum.DType(), tensor.BFloat16)
	if n == 0 || d.enter() != nil {
		return
	}
	defer d.leave()
	d.rowwise(normKernel("layernorm_forward", out, a, sum), n, weight.Len(), tp(out), tp(mean), tp(rstd), tp(a), tp(b), tp(sum), tp(weight), tp(bias), i64(n), i32(weight.Len()), f32(eps))
}

// normKernel is the entry of a norm's forward kernel base with out, its
// input (or a residual add's a) inp and the add's sum stored as they are:
// typed's name, with _sum_bf16 for a bfloat16 sum of a float32 a.
func normKernel(base string, out, inp, sum *tensor.Tensor) string {
	name := typed(base, out.DType(), inp.DType())
	if inp.DType() == tensor.Float32 && sum.DType() == tensor.BFloat16 {
		name += "_sum_bf16"
	}
	return name
}

// normBackwardKernel is a norm's backward entry for its dtypes: typed's
// name by dinp's and inp's, with _grad_bf16 where dout is bfloat16.
func normBackwardKernel(base string, dinp, inp, dout *tensor.Tensor) string {
	name := typed(base, dinp.DType(), inp.DType())
	if dout.DType() == tensor.BFloat16 {
		name += "_grad_bf16"
	}
	return name
}

// LayerNormBackward accumulates the layernorm gradients. dinp, dout, inp are
// (N,C); dweight, dbias, weight are (C); mean, rstd are (N); inp may be
// bfloat16 (widened), dout too, and dinp (added to, rounded once). The
// weight and bias gradients are summed per block, then over blocks in a
// fixed order.
func (d *Device) LayerNormBackward(dinp, dweight, dbias, dout, inp, weight, mean, rstd *tensor.Tensor) {
	d.ownAny("LayerNormBackward", inp, dinp, dout)
	d.own("LayerNormBackward", dweight, dbias, weight, mean, rstd)
	n := check.LayerNormBackward(dinp, dweight, dbias, dout, inp, weight, mean, rstd)
	c := weight.Len()
	if n == 0 || c == 0 {
		return
	}
	if d.enter() != nil {
		return
	}
	defer d.leave()
	blocks := min(n, 2*d.sms)
	part, err := d.part.get(d, int64(blocks)*2*int64(c)*4)
	if err != nil {
		d.fail(err)
		return
	}
	d.launch(normBackwardKernel("layernorm_backward", dinp, inp, dout), dim3{uint32(blocks), 1, 1}, dim3{uint32(rowThreads(c)), 1, 1},
		tp(dinp), ptr(part), tp(dout), tp(inp), tp(weight), tp(mean), tp(rstd), i64(n), i32(c))
	d.launch("layernorm_param_grads_f32", d.grid1(c, elemThreads), dim3{elemThreads, 1, 1},
		tp(dweight), tp(dbias), ptr(part), i32(blocks), i32(c))
}

// --- Llama: RMSNorm, rotary embeddings, SwiGLU ---

// RMSNormForward normalizes the rows of inp by their root mean square.
// out, inp are (N,C); rstd is (N); weight is (C). A bfloat16 out holds
// the float32 results rounded; a bfloat16 inp is widened.
func (d *Device) RMSNormForward(out, rstd, inp, weight *tensor.Tensor, eps float32) {
	d.ownAny("RMSNormForward", out, inp)
	d.own("RMSNormForward", rstd, weight)
	n := check.RMSNormForward(out, rstd, inp, weight)
	if n == 0 || d.enter() != nil {
		return
	}
	defer d.leave()
	d.rowwise(normKernel("rmsnorm_forward", out, inp, inp), n, weight.Len(), tp(out), tp(rstd), tp(inp), 0, 0, tp(weight), i64(n), i32(weight.Len()), f32(eps))
}

// AddRMSNormForward is sum = a + b, then RMSNormForward of sum, in one
// kernel; sum and a as AddLayerNormForward's.
func (d *Device) AddRMSNormForward(sum, out, rstd, a, b, weight *tensor.Tensor, eps float32) {
	d.ownAny("AddRMSNormForward", out, sum, a)
	d.own("AddRMSNormForward", rstd, b, weight)
	n := check.AddRMSNormForward(sum, out, rstd, a, b, weight)
	check.ResidualSum("AddRMSNormForward", a.DType(), sum.DType(), tensor.BFloat16)
	if n == 0 || d.enter() != nil {
		return
	}
	defer d.leave()
	d.rowwise(normKernel("rmsnorm_forward", out, a, sum), n, weight.Len(), tp(out), tp(rstd), tp(a), tp(b), tp(sum), tp(weight), i64(n), i32(weight.Len()), f32(eps))
}

// RMSNormBackward accumulates the RMSNorm gradients. dinp, dout, inp are
// (N,C); dweight, weight are (C); rstd is (N); inp, dout and dinp may be
// bfloat16, as LayerNormBackward's. The weight gradient is summed per
// block, then over blocks in a fixed order.
func (d *Device) RMSNormBackward(dinp, dweight, dout, inp, weight, rstd *tensor.Tensor) {
	d.ownAny("RMSNormBackward", inp, dinp, dout)
	d.own("RMSNormBackward", dweight, weight, rstd)
	n := check.RMSNormBackward(dinp, dweight, dout, inp, weight, rstd)
	c := weight.Len()
	if n == 0 || c == 0 {
		return
	}
	if d.enter() != nil {
		return
	}
	defer d.leave()
	blocks := min(n, 2*d.sms)
	part, err := d.part.get(d, int64(blocks)*int64(c)*4)
	if err != nil {
		d.fail(err)
		return
	}
	d.launch(normBackwardKernel("rmsnorm_backward", dinp, inp, dout), dim3{uint32(blocks), 1, 1}, dim3{uint32(rowThreads(c)), 1, 1},
		tp(dinp), ptr(part), tp(dout), tp(inp), tp(weight), tp(rstd), i64(n), i32(c))
	d.launch("rmsnorm_param_grads_f32", d.grid1(c, elemThreads), dim3{elemThreads, 1, 1},
		tp(dweight), ptr(part), i32(blocks), i32(c))
}

func (d *Device) rope(fn string, x, table *tensor.Tensor, seqLen, period, rotated int, sign float32) {
	d.ownAny(fn, x)
	d.own(fn, table)
	rows, heads := check.RoPE(fn, x, table, seqLen, period, rotated)
	hd := table.Cols()
	d.elementwise(typed("rope", x.DType(), tensor.Float32), rows*heads*hd/2, tp(x), tp(table), i64(rows), i32(seqLen), i32(heads), i32(hd), i32(period), i32(rotated), f32(sign))
}

// RoPEForward rotates the heads of x (N,W) in place by their positions'
// angles in table (positions,hd).
func (d *Device) RoPEForward(x, table *tensor.Tensor, seqLen, period, rotated int) {
	d.rope("RoPEForward", x, table, seqLen, period, rotated, 1)
}

// RoPEBackward rotates the gradient dx (N,W) back in place.
func (d *Device) RoPEBackward(dx, table *tensor.Tensor, seqLen, period, rotated int) {
	d.rope("RoPEBackward", dx, table, seqLen, period, rotated, -1)
}

// SwiGLUForward is out = silu(gate)*up. out is (N,F), inp (N,2F) rows of
// [gate | up]; either may be bfloat16 (a bfloat16 out holds the float32
// results rounded).
func (d *Device) SwiGLUForward(out, inp *tensor.Tensor) {
	d.ownAny("SwiGLUForward", out, inp)
	_, f := check.SwiGLUForward(out, inp)
	d.elementwise(typed("swiglu_forward", out.DType(), inp.DType()), out.Len(), tp(out), tp(inp), i64(out.Len()), i32(f))
}

// SwiGLUBackward accumulates [dgate | dup] into dinp (N,2F) from dout (N,F)
// and the forward's inp (N,2F); inp may be bfloat16, and dinp and dout
// both.
func (d *Device) SwiGLUBackward(dinp, inp, dout *tensor.Tensor) {
	d.ownAny("SwiGLUBackward", dinp, inp, dout)
	_, f := check.SwiGLUBackward(dinp, inp, dout)
	check.SameDType("SwiGLUBackward", "dinp", dinp.DType(), "dout", dout.DType())
	d.elementwise(typed("swiglu_backward", dinp.DType(), inp.DType()), dout.Len(), tp(dinp), tp(inp), tp(dout), i64(dout.Len()), i32(f))
}

// typed is the kernel of base for an output and an input of these dtypes
// (kernels.cu): base_f32, base_bf16 (a bfloat16 output), with
// _from_bf16 for a bfloat16 input.
func typed(base string, out, in tensor.DType) string {
	name := base + "_f32"
	if out == tensor.BFloat16 {
		name = base + "_bf16"
	}
	if in == tensor.BFloat16 {
		name += "_from_bf16"
	}
	return name
}

// --- activations ---

// activationKernels are each tensor.Activation's kernels' base names
// (typed adds the dtypes): forward, backward, with the bias first, and the
// backward in place.
var activationKernels = [...][4]string{
	tensor.GELU: {"gelu_forward", "gelu_backward", "bias_gelu_forward", "gelu_backward_in_place"},
	tensor.Tanh: {"tanh_forward", "tanh_backward", "bias_tanh_forward", "tanh_backward_in_place"},
}

// The kernels of an activation (activationKernels' columns).
const (
	activationForward = iota
	activationBackward
	biasActivationForward
	activationBackwardInPlace
)

// activationKernel is f's kernel of a kind (activationForward, ...) for
// an output and an input of these dtypes; fn names the method in the
// panic of an unknown f.
func activationKernel(fn string, f tensor.Activation, kind int, out, in tensor.DType) string {
	if f < 0 || int(f) >= len(activationKernels) {
		panic(fmt.Sprintf("tensor.%s: unknown activation %d", fn, int(f)))
	}
	return typed(activationKernels[f][kind], out, in)
}

// ActivationForward is out = f(inp) elementwise; either may be bfloat16
// (a bfloat16 out holds the float32 results rounded).
func (d *Device) ActivationForward(f tensor.Activation, out, inp *tensor.Tensor) {
	d.ownAny("ActivationForward", out, inp)
	check.ActivationForward(out, inp)
	d.elementwise(activationKernel("ActivationForward", f, activationForward, out.DType(), inp.DType()), out.Len(), tp(out), tp(inp), i64(out.Len()))
}

// ActivationBackward is dinp += f'(inp)*dout; inp may be bfloat16.
func (d *Device) ActivationBackward(f tensor.Activation, dinp, inp, dout *tensor.Tensor) {
	d.own("ActivationBackward", dinp, dout)
	d.ownAny("ActivationBackward", inp)
	check.ActivationBackward(dinp, inp, dout)
	d.elementwise(activationKernel("ActivationBackward", f, activationBackward, tensor.Float32, inp.DType()), inp.Len(), tp(dinp), tp(inp), tp(dout), i64(inp.Len()))
}

// BiasActivationForward is pre += bias (each row), then out = f(pre), in
// one kernel; either may be bfloat16.
func (d *Device) BiasActivationForward(f tensor.Activation, out, pre, bias *tensor.Tensor) {
	d.ownAny("BiasActivationForward", out, pre)
	d.own("BiasActivationForward", bias)
	check.BiasActivationForward(out, pre, bias)
	d.elementwise(activationKernel("BiasActivationForward", f, biasActivationForward, out.DType(), pre.DType()), out.Len(), tp(out), tp(pre), tp(bias), i64(out.Len()), i32(bias.Len()))
}

// ActivationBackwardInPlace is dout = f'(inp)*dout; either may be
// bfloat16.
func (d *Device) ActivationBackwardInPlace(f tensor.Activation, dout, inp *tensor.Tensor) {
	d.ownAny("ActivationBackwardInPlace", dout, inp)
	check.ActivationBackwardInPlace(dout, inp)
	d.elementwise(activationKernel("ActivationBackwardInPlace", f, activationBackwardInPlace, dout.DType(), inp.DType()), inp.Len(), tp(dout), tp(inp), i64(inp.Len()))
}

// --- softmax ---

const softmaxThreads = 256 // 8 warps, one row each

// SoftmaxForward is the masked row softmax of scale*inp. inp, out are
// (B,...,Tq,Tk), out float32 or bfloat16; keyValid is (B,Tk) or nil.
func (d *Device) SoftmaxForward(out, inp *tensor.Tensor, scale float32, causal bool, keyValid []int32) {
	d.own("SoftmaxForward", inp)
	d.ownAny("SoftmaxForward", out)
	rows, perItem := check.SoftmaxForward(out, inp, scale, keyValid)
	tk, tq := inp.Dim(-1), inp.Dim(-2)
	if rows == 0 {
		return
	}
	valid, ok := d.enterMasked(keyValid)
	if !ok {
		return
	}
	defer d.leave()
	causalArg := 0
	if causal {
		causalArg = 1
	}
	d.launch(typed("softmax_forward", out.DType(), tensor.Float32), d.grid1(rows, softmaxThreads/32), dim3{softmaxThreads, 1, 1},
		tp(out), tp(inp), f32(scale), i64(rows), i32(tq), i32(tk), i32(causalArg), ptr(valid), i64(perItem))
}

// SoftmaxBackward is dinp += scale*out*(dout - rowsum(dout*out)). All are
// (B,...,Tq,Tk); out may be bfloat16, and dinp (widened,
// added to and rounded).
func (d *Device) SoftmaxBackward(dinp, dout, out *tensor.Tensor, scale float32) {
	d.own("SoftmaxBackward", dout)
	d.ownAny("SoftmaxBackward", dinp, out)
	rows := check.SoftmaxBackward(dinp, dout, out)
	tk := out.Cols()
	if rows == 0 {
		return
	}
	if d.enter() != nil {
		return
	}
	defer d.leave()
	d.launch(typed("softmax_backward", dinp.DType(), out.DType()), d.grid1(rows, softmaxThreads/32), dim3{softmaxThreads, 1, 1},
		tp(dinp), tp(dout), tp(out), f32(scale), i64(rows), i32(tk))
}

// --- cross-entropy ---

// CrossEntropyRowMax is rowMax[i] = max_j logits[i,j]. logits is (N,V),
// float32 or bfloat16; rowMax is (N).
func (d *Device) CrossEntropyRowMax(rowMax, logits *tensor.Tensor) {
	d.own("CrossEntropyRowMax", rowMax)
	d.ownAny("CrossEntropyRowMax", logits)
	n := check.CrossEntropyRowMax(rowMax, logits)
	v := logits.Cols()
	if n == 0 {
		return
	}
	if d.enter() != nil {
		return
	}
	defer d.leave()
	d.rowwise(typed("ce_row_max", tensor.Float32, logits.DType()), n, v, tp(rowMax), tp(logits), i64(n), i32(v))
}

// CrossEntropySumExp is sumExp[i] = sum_j exp(logits[i,j]-rowMax[i]).
// logits is (N,V), float32 or bfloat16; sumExp and rowMax are (N).
func (d *Device) CrossEntropySumExp(sumExp, logits, rowMax *tensor.Tensor) {
	d.own("CrossEntropySumExp", sumExp, rowMax)
	d.ownAny("CrossEntropySumExp", logits)
	n := check.CrossEntropySumExp(sumExp, logits, rowMax)
	v := logits.Cols()
	if n == 0 {
		return
	}
	if d.enter() != nil {
		return
	}
	defer d.leave()
	d.rowwise(typed("ce_sum_exp", tensor.Float32, logits.DType()), n, v, tp(sumExp), tp(logits), tp(rowMax), i64(n), i32(v))
}

// CrossEntropyTargetLogit is out[i] = logits[i,targets[i]-vocabStart] for
// targets in the slice, else 0. logits is (N,V), float32 or bfloat16 (the
// logit widened); out and targets are (N).
func (d *Device) CrossEntropyTargetLogit(out, logits *tensor.Tensor, targets []int32, vocabStart int) {
	d.own("CrossEntropyTargetLogit", out)
	d.ownAny("CrossEntropyTargetLogit", logits)
	n := check.CrossEntropyTargetLogit(out, logits, targets)
	v := logits.Cols()
	d.withIDs(n == 0, targets, func(p karg) {
		d.launch(typed("ce_target_logit", tensor.Float32, logits.DType()), d.grid1(n, elemThreads), dim3{elemThreads, 1, 1}, tp(out), tp(logits), p, i64(n), i32(v), i64(vocabStart))
	})
}

// CrossEntropyLoss is losses[i] = log(sumExp[i]) + rowMax[i] - targetLogit[i],
// 0 where targets[i] < 0. All are (N).
func (d *Device) CrossEntropyLoss(losses, rowMax, sumExp, targetLogit *tensor.Tensor, targets []int32) {
	d.own("CrossEntropyLoss", losses, rowMax, sumExp, targetLogit)
	n := check.CrossEntropyLoss(losses, rowMax, sumExp, targetLogit, targets)
	d.withIDs(n == 0, targets, func(p karg) {
		d.launch("ce_loss_f32", d.grid1(n, elemThreads), dim3{elemThreads, 1, 1}, tp(losses), tp(rowMax), tp(sumExp), tp(targetLogit), p, i64(n))
	})
}

// CrossEntropyBackward is dlogits += dloss*(softmax(logits) - onehot(targets)).
// dlogits, logits are (N,V); rowMax, sumExp, targets are (N).
func (d *Device) CrossEntropyBackward(dlogits, logits, rowMax, sumExp *tensor.Tensor, targets []int32, vocabStart int, dloss float32) {
	d.own("CrossEntropyBackward", dlogits, logits, rowMax, sumExp)
	n := check.CrossEntropyBackward(dlogits, logits, rowMax, sumExp, targets)
	v := logits.Cols()
	d.withIDs(n == 0, targets, func(p karg) {
		d.rowwise("ce_backward_f32", n, v, tp(dlogits), tp(logits), tp(rowMax), tp(sumExp), p, i64(n), i32(v), i64(vocabStart), f32(dloss))
	})
}

// CrossEntropyForward is the unsharded cross-entropy in one kernel:
// rowMax, sumExp and losses as the pieces give them. logits is (N,V),
// float32 or bfloat16; losses, rowMax, sumExp and targets are (N).
func (d *Device) CrossEntropyForward(losses, rowMax, sumExp, logits *tensor.Tensor, targets []int32) {
	d.own("CrossEntropyForward", losses, rowMax, sumExp)
	d.ownAny("CrossEntropyForward", logits)
	n := check.CrossEntropyForward(losses, rowMax, sumExp, logits, targets)
	v := logits.Cols()
	d.withIDs(n == 0, targets, func(p karg) {
		d.rowwise(typed("ce_forward", tensor.Float32, logits.DType()), n, v, tp(losses), tp(rowMax), tp(sumExp), tp(logits), p, i64(n), i32(v))
	})
}

// CrossEntropyBackwardInPlace overwrites logits[:, :cols] with
// dloss*(softmax(logits) - onehot(targets)), 0 on rows without a target;
// bfloat16 logits get the float32 gradient rounded.
func (d *Device) CrossEntropyBackwardInPlace(logits, rowMax, sumExp *tensor.Tensor, targets []int32, vocabStart, cols int, dloss float32) {
	d.own("CrossEntropyBackwardInPlace", rowMax, sumExp)
	d.ownAny("CrossEntropyBackwardInPlace", logits)
	n := check.CrossEntropyBackwardInPlace(logits, rowMax, sumExp, targets, cols)
	v := logits.Cols()
	d.withIDs(n == 0 || cols == 0, targets, func(p karg) {
		d.rowwise(typed("ce_backward_in_place", logits.DType(), logits.DType()), n, cols, tp(logits), tp(rowMax), tp(sumExp), p, i64(n), i32(v), i32(cols), i64(vocabStart), f32(dloss))
	})
}

// --- optimizer and norms ---

// AdamW runs one AdamW step on param with its grad and moments m, v, the
// gradients scaled by scale[0] (ClipNorm's, read on the device; 1 when
// scale is nil).
func (d *Device) AdamW(param, grad, m, v, half *tensor.Tensor, p tensor.AdamWParams, scale *tensor.Tensor) {
	d.own("AdamW", param, grad, m, v)
	var halfPtr uintptr
	if half != nil {
		d.ownHalf("AdamW", half)
		check.AdamW(param, grad, m, v, half, p.Step)
		halfPtr = half.Ptr()
	} else {
		check.AdamW(param, grad, m, v, nil, p.Step)
	}
	var scalePtr uintptr
	if scale != nil {
		d.own("AdamW", scale)
		check.AdamWScale(scale)
		scalePtr = scale.Ptr()
	}
	bc1 := float32(1 - math.Pow(float64(p.Beta1), float64(p.Step)))
	bc2 := float32(1 - math.Pow(float64(p.Beta2), float64(p.Step)))
	d.elementwise("adamw_f32", param.Len(), tp(param), tp(grad), tp(m), tp(v), ptr(halfPtr), i64(param.Len()),
		f32(p.LR), f32(p.Beta1), f32(p.Beta2), f32(p.Eps), f32(p.WeightDecay), f32(bc1), f32(bc2), ptr(scalePtr))
}

const sumBlocks = 128 // partial sums per tensor in sumPartials

// sumPartials enqueues the float64 partial sums of each of ts (square: of
// their squares) into the sumPart scratch, one tensor's after another, in
// one launch, and returns how many each has (0 for an empty one): as many
// as a grid of its own would have blocks, up to sumBlocks.
func (d *Device) sumPartials(ts []*tensor.Tensor, square bool) (part uintptr, counts []int, err error) {
	part, err = d.sumPart.get(d, int64(len(ts))*sumBlocks*8)
	if err != nil {
		return 0, nil, err
	}
	counts = make([]int, len(ts))
	var table []tableEntry
	for i, t := range ts {
		if t.Len() == 0 {
			continue
		}
		counts[i] = min(int(d.grid1(t.Len(), elemThreads).x), sumBlocks)
		table = append(table, tableEntry{ptrs: [4]uintptr{t.Ptr()}, n: t.Len(), blocks: counts[i]})
	}
	if len(table) == 0 {
		return part, counts, nil
	}
	p, blocks, err := d.uploadTable(table)
	if err != nil {
		return 0, nil, err
	}
	sq := 0
	if square {
		sq = 1
	}
	d.launch("sum_multi_f64", dim3{uint32(blocks), 1, 1}, dim3{elemThreads, 1, 1}, ptr(part), ptr(p), i32(len(table)), i32(sq))
	return part, counts, nil
}

// tableEntry is one tensor of a kernel's tensor table (kernels.cu's
// table_find): its pointers, element count, blocks and a float.
type tableEntry struct {
	ptrs   [4]uintptr
	n      int
	blocks int
	value  float32
	fifth  uintptr // a fifth pointer (AdamW's bfloat16 copy), 0 for none
}

// uploadTable enqueues the table of es to the device and returns its
// address and the blocks of the flat grid that walks it.
func (d *Device) uploadTable(es []tableEntry) (uintptr, int, error) {
	words := make([]int32, 0, 18*len(es))
	put := func(v uint64) { words = append(words, int32(uint32(v)), int32(uint32(v>>32))) }
	first := 0
	for _, e := range es {
		for _, p := range e.ptrs {
			put(uint64(p))
		}
		put(uint64(e.n))
		put(uint64(first))
		put(uint64(e.blocks))
		put(uint64(math.Float32bits(e.value)))
		put(uint64(e.fifth))
		first += e.blocks
	}
	p, err := d.upload(words)
	return p, first, err
}

// AdamWMany is tensor.MultiTensorAdamW's update: AdamW on every params[i]
// with grads[i], ms[i], vs[i] at hyper[i], in one launch; the hyper
// parameters may differ in their weight decay only.
func (d *Device) AdamWMany(params, grads, ms, vs, halves []*tensor.Tensor, hyper []tensor.AdamWParams, scale *tensor.Tensor) {
	if len(grads) != len(params) || len(ms) != len(params) || len(vs) != len(params) || len(hyper) != len(params) || (halves != nil && len(halves) != len(params)) {
		panic(fmt.Sprintf("cuda.AdamWMany: %d params, %d grads, %d m, %d v, %d halves, %d hyper parameters", len(params), len(grads), len(ms), len(vs), len(halves), len(hyper)))
	}
	if len(params) == 0 {
		return
	}
	var table []tableEntry
	p0 := hyper[0]
	for i, p := range params {
		d.own("AdamWMany", p, grads[i], ms[i], vs[i])
		var half uintptr
		if halves != nil && halves[i] != nil {
			d.ownHalf("AdamWMany", halves[i])
			check.AdamW(p, grads[i], ms[i], vs[i], halves[i], hyper[i].Step)
			half = halves[i].Ptr()
		} else {
			check.AdamW(p, grads[i], ms[i], vs[i], nil, hyper[i].Step)
		}
		h := hyper[i]
		h.WeightDecay = p0.WeightDecay
		if h != p0 {
			panic(fmt.Sprintf("cuda.AdamWMany: tensor %d's hyper parameters %+v differ from the first's %+v in more than weight decay", i, hyper[i], p0))
		}
		if p.Len() > 0 {
			table = append(table, tableEntry{ptrs: [4]uintptr{p.Ptr(), grads[i].Ptr(), ms[i].Ptr(), vs[i].Ptr()}, n: p.Len(),
				blocks: int(d.grid1(p.Len(), elemThreads).x), value: hyper[i].WeightDecay, fifth: half})
		}
	}
	var scalePtr uintptr
	if scale != nil {
		d.own("AdamWMany", scale)
		check.AdamWScale(scale)
		scalePtr = scale.Ptr()
	}
	if len(table) == 0 || d.enter() != nil {
		return
	}
	defer d.leave()
	tab, blocks, err := d.uploadTable(table)
	if err != nil {
		d.fail(err)
		return
	}
	bc1 := float32(1 - math.Pow(float64(p0.Beta1), float64(p0.Step)))
	bc2 := float32(1 - math.Pow(float64(p0.Beta2), float64(p0.Step)))
	d.launch("adamw_multi_f32", dim3{uint32(blocks), 1, 1}, dim3{elemThreads, 1, 1}, ptr(tab), i32(len(table)),
		f32(p0.LR), f32(p0.Beta1), f32(p0.Beta2), f32(p0.Eps), f32(bc1), f32(bc2), ptr(scalePtr))
}
