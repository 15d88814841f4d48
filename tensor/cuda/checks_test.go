package cuda

import (
	"fmt"
	"strings"
	"testing"

	"github.com/hpcrun/hpcrun/tensor"
)

// The argument checks run before anything touches the GPU, so they are
// tested here on a Device that was never opened, with tensors at made-up
// addresses: every bad call must panic with the CPU device's message.
func TestChecksMatchCPU(t *testing.T) {
	gpu := &Device{}
	cpu := tensor.NewCPU()
	mk := func(d tensor.Device, shape ...int) *tensor.Tensor {
		if d == tensor.Device(cpu) {
			x, _ := cpu.Alloc(shape...)
			return x
		}
		n := 1
		for _, s := range shape {
			n *= s
		}
		return tensor.NewTensor(tensor.NewBuffer(d, n, nil, 1<<40), 0, shape...)
	}
	cases := []struct {
		name string
		call func(d tensor.Device, mk func(...int) *tensor.Tensor)
	}{
		{"Add lengths", func(d tensor.Device, mk func(...int) *tensor.Tensor) { d.Add(mk(3), mk(3), mk(4)) }},
		{"Axpy lengths", func(d tensor.Device, mk func(...int) *tensor.Tensor) { d.Axpy(mk(3), 1, mk(4)) }},
		{"Copy lengths", func(d tensor.Device, mk func(...int) *tensor.Tensor) { d.Copy(mk(3), mk(4)) }},
		{"CopyFromHost", func(d tensor.Device, mk func(...int) *tensor.Tensor) { d.CopyFromHost(mk(3), make([]float32, 2)) }},
		{"CopyToHost", func(d tensor.Device, mk func(...int) *tensor.Tensor) { d.CopyToHost(make([]float32, 2), mk(3)) }},
		{"Copy2D ld", func(d tensor.Device, mk func(...int) *tensor.Tensor) { d.Copy2D(mk(10), 0, 2, mk(10), 0, 3, 2, 3) }},
		{"Axpy2D end", func(d tensor.Device, mk func(...int) *tensor.Tensor) { d.Axpy2D(mk(10), 4, 3, 1, mk(10), 0, 3, 3, 3) }},
		{"AddBias", func(d tensor.Device, mk func(...int) *tensor.Tensor) { d.AddBias(mk(4, 5), mk(3)) }},
		{"BiasBackward", func(d tensor.Device, mk func(...int) *tensor.Tensor) { d.BiasBackward(mk(3), mk(4, 5)) }},
		{"EmbeddingForward ids", func(d tensor.Device, mk func(...int) *tensor.Tensor) {
			d.EmbeddingForward(mk(4, 8), []int32{1, 2}, mk(10, 8), 0)
		}},
		{"EmbeddingBackward rows", func(d tensor.Device, mk func(...int) *tensor.Tensor) {
			d.EmbeddingBackward(mk(10, 8), mk(5, 3), []int32{1}, 0)
		}},
		{"LayerNormForward mean", func(d tensor.Device, mk func(...int) *tensor.Tensor) {
			d.LayerNormForward(mk(4, 8), mk(3), mk(4), mk(4, 8), mk(8), mk(8), 1e-5)
		}},
		{"AddLayerNormForward addend", func(d tensor.Device, mk func(...int) *tensor.Tensor) {
			d.AddLayerNormForward(mk(4, 8), mk(4, 8), mk(4), mk(4), mk(4, 8), mk(3, 8), mk(8), mk(8), 1e-5)
		}},
		{"AddRMSNormForward rstd", func(d tensor.Device, mk func(...int) *tensor.Tensor) {
			d.AddRMSNormForward(mk(4, 8), mk(4, 8), mk(3), mk(4, 8), mk(4, 8), mk(8), 1e-5)
		}},
		{"LayerNormBackward dbias", func(d tensor.Device, mk func(...int) *tensor.Tensor) {
			d.LayerNormBackward(mk(4, 8), mk(8), mk(7), mk(4, 8), mk(4, 8), mk(8), mk(4), mk(4))
		}},
		{"ActivationBackward", func(d tensor.Device, mk func(...int) *tensor.Tensor) {
			d.ActivationBackward(tensor.GELU, mk(4), mk(4), mk(5))
		}},
		{"BiasActivationForward rows", func(d tensor.Device, mk func(...int) *tensor.Tensor) {
			d.BiasActivationForward(tensor.GELU, mk(4, 5), mk(4, 5), mk(3))
		}},
		{"BiasActivationForward out", func(d tensor.Device, mk func(...int) *tensor.Tensor) {
			d.BiasActivationForward(tensor.GELU, mk(4, 4), mk(4, 5), mk(5))
		}},
		{"ActivationBackwardInPlace", func(d tensor.Device, mk func(...int) *tensor.Tensor) {
			d.ActivationBackwardInPlace(tensor.GELU, mk(4), mk(5))
		}},
		{"ActivationForward unknown", func(d tensor.Device, mk func(...int) *tensor.Tensor) {
			d.ActivationForward(tensor.Activation(9), mk(4), mk(4))
		}},
		{"ActivationBackward unknown", func(d tensor.Device, mk func(...int) *tensor.Tensor) {
			d.ActivationBackward(-1, mk(4), mk(4), mk(4))
		}},
		{"SoftmaxForward rank", func(d tensor.Device, mk func(...int) *tensor.Tensor) { d.SoftmaxForward(mk(4), mk(4), 1, false, nil) }},
		{"SoftmaxForward scale", func(d tensor.Device, mk func(...int) *tensor.Tensor) {
			d.SoftmaxForward(mk(2, 4), mk(2, 4), 0, false, nil)
		}},
		{"SoftmaxForward keyValid", func(d tensor.Device, mk func(...int) *tensor.Tensor) {
			d.SoftmaxForward(mk(2, 3, 4), mk(2, 3, 4), 1, false, make([]int32, 7))
		}},
		{"SoftmaxBackward", func(d tensor.Device, mk func(...int) *tensor.Tensor) {
			d.SoftmaxBackward(mk(2, 4), mk(2, 4), mk(2, 5), 1)
		}},
		{"CrossEntropyRowMax", func(d tensor.Device, mk func(...int) *tensor.Tensor) { d.CrossEntropyRowMax(mk(3), mk(4, 10)) }},
		{"CrossEntropySumExp", func(d tensor.Device, mk func(...int) *tensor.Tensor) { d.CrossEntropySumExp(mk(4), mk(4, 10), mk(5)) }},
		{"CrossEntropyTargetLogit", func(d tensor.Device, mk func(...int) *tensor.Tensor) {
			d.CrossEntropyTargetLogit(mk(4), mk(4, 10), []int32{1, 2, 3}, 0)
		}},
		{"CrossEntropyLoss", func(d tensor.Device, mk func(...int) *tensor.Tensor) {
			d.CrossEntropyLoss(mk(4), mk(4), mk(4), mk(3), []int32{1, 2, 3, 4})
		}},
		{"CrossEntropyBackward", func(d tensor.Device, mk func(...int) *tensor.Tensor) {
			d.CrossEntropyBackward(mk(4, 10), mk(4, 10), mk(4), mk(4), []int32{1}, 0, 1)
		}},
		{"CrossEntropyForward", func(d tensor.Device, mk func(...int) *tensor.Tensor) {
			d.CrossEntropyForward(mk(4), mk(4), mk(3), mk(4, 10), []int32{1, 2, 3, 4})
		}},
		{"CrossEntropyBackwardInPlace cols", func(d tensor.Device, mk func(...int) *tensor.Tensor) {
			d.CrossEntropyBackwardInPlace(mk(4, 10), mk(4), mk(4), []int32{1, 2, 3, 4}, 0, 11, 1)
		}},
		{"AdamW step", func(d tensor.Device, mk func(...int) *tensor.Tensor) {
			d.AdamW(mk(4), mk(4), mk(4), mk(4), nil, tensor.AdamWParams{LR: 1, Step: 0}, nil)
		}},
		{"AdamW lengths", func(d tensor.Device, mk func(...int) *tensor.Tensor) {
			d.AdamW(mk(4), mk(4), mk(3), mk(4), nil, tensor.AdamWParams{LR: 1, Step: 1}, nil)
		}},
		{"AdamW empty scale", func(d tensor.Device, mk func(...int) *tensor.Tensor) {
			d.AdamW(mk(4), mk(4), mk(4), mk(4), nil, tensor.AdamWParams{LR: 1, Step: 1}, mk(4).View(0, 0))
		}},
		{"Gemm lda", func(d tensor.Device, mk func(...int) *tensor.Tensor) {
			d.Gemm(false, false, 2, 3, 4, 1, mk(8), 0, 3, mk(12), 0, 3, 0, mk(6), 0, 3)
		}},
		{"Gemm short b", func(d tensor.Device, mk func(...int) *tensor.Tensor) {
			d.Gemm(false, true, 2, 3, 4, 1, mk(8), 0, 4, mk(11), 0, 4, 0, mk(6), 0, 3)
		}},
		{"Gemm offset", func(d tensor.Device, mk func(...int) *tensor.Tensor) {
			d.Gemm(false, false, 2, 3, 4, 1, mk(8), 9, 4, mk(12), 0, 3, 0, mk(6), 0, 3)
		}},
		{"GemmStridedBatched overlap", func(d tensor.Device, mk func(...int) *tensor.Tensor) {
			d.GemmStridedBatched(false, false, 2, 3, 4, 1, mk(100), 0, 4, 8, mk(100), 0, 3, 12, 0, mk(100), 0, 3, 4, 3)
		}},
		{"GemmStridedBatched strideC 0", func(d tensor.Device, mk func(...int) *tensor.Tensor) {
			d.GemmStridedBatched(false, false, 2, 3, 4, 1, mk(100), 0, 4, 8, mk(100), 0, 3, 12, 0, mk(100), 0, 3, 0, 2)
		}},
	}
	for _, tt := range cases {
		want := panicOf(func() { tt.call(cpu, func(s ...int) *tensor.Tensor { return mk(cpu, s...) }) })
		got := panicOf(func() { tt.call(gpu, func(s ...int) *tensor.Tensor { return mk(gpu, s...) }) })
		if want == "" {
			t.Errorf("%s: the CPU device does not panic; fix the case", tt.name)
			continue
		}
		if norm(got) != norm(want) {
			t.Errorf("%s:\n cuda panics %q\n  cpu panics %q", tt.name, got, want)
		}
	}
}

// Tensors of another device are refused before any launch.
func TestForeignTensorPanics(t *testing.T) {
	gpu := &Device{}
	x, _ := tensor.NewCPU().Alloc(4)
	msg := panicOf(func() { gpu.Add(x, x, x) })
	if !strings.Contains(msg, "tensor.Add: tensor Tensor(4) on cpu is not on this cuda device") {
		t.Errorf("panic %q", msg)
	}
}

func panicOf(f func()) (msg string) {
	defer func() {
		if p := recover(); p != nil {
			msg = fmt.Sprint(p)
		}
	}()
	f()
	return ""
}

// norm drops the device names from a message.
func norm(s string) string {
	return strings.NewReplacer(" on cuda:0", " on DEV", " on cpu", " on DEV").Replace(s)
}
