package check

import (
	"fmt"
	"strings"
	"testing"
)

// shape is a Shape without storage, described as tensor.Tensor describes
// itself.
type shape []int

func (s shape) Len() int {
	n := 1
	for _, d := range s {
		n *= d
	}
	return n
}
func (s shape) Rank() int { return len(s) }
func (s shape) Dim(i int) int {
	if i < 0 {
		i += len(s)
	}
	return s[i]
}
func (s shape) Cols() int {
	if len(s) == 0 {
		return 1
	}
	return s[len(s)-1]
}
func (s shape) String() string {
	return "Tensor(" + strings.Trim(strings.ReplaceAll(fmt.Sprint([]int(s)), " ", ","), "[]") + ") on test"
}

// mustPanic runs f and fails unless it panics with one line equal to want.
func mustPanic(t *testing.T, name, want string, f func()) {
	t.Helper()
	defer func() {
		t.Helper()
		p := recover()
		if p == nil {
			t.Errorf("%s: no panic, want %q", name, want)
			return
		}
		if msg := fmt.Sprint(p); msg != want {
			t.Errorf("%s: panic\n %q\nwant\n %q", name, msg, want)
		}
	}()
	f()
}

// TestMessages pins every check's message: the CPU and CUDA devices show
// these to callers, so they must not drift.
func TestMessages(t *testing.T) {
	x23, x32, x6, x3, x2, x4, x48 := shape{2, 3}, shape{3, 2}, shape{6}, shape{3}, shape{2}, shape{4}, shape{4, 8}
	cases := []struct {
		name, want string
		f          func()
	}{
		{"CopyFromHost", "tensor.CopyFromHost: len(src)=2, dst Tensor(6) on test has 6 elements", func() { CopyFromHost(x6, make([]float32, 2)) }},
		{"CopyToHost", "tensor.CopyToHost: len(dst)=2, src Tensor(6) on test has 6 elements", func() { CopyToHost(make([]float32, 2), x6) }},
		{"Copy", "tensor.Copy: src Tensor(3) on test has 3 elements, dst Tensor(6) on test has 6", func() { Copy(x6, x3) }},
		{"Block2D ld", "tensor.Copy2D: bad dst block: offset 0, ld 2, 2x3", func() { Block2D("Copy2D", x6, 0, 2, x6, 0, 3, 2, 3) }},
		{"Block2D end", "tensor.Axpy2D: dst block ends at element 13, dst Tensor(6) on test has 6", func() { Block2D("Axpy2D", x6, 4, 3, x6, 0, 3, 3, 3) }},
		{"Add", "tensor.Add: b Tensor(3) on test has 3 elements, out Tensor(2,3) on test has 6", func() { Add(x23, x23, x3) }},
		{"Axpy", "tensor.Axpy: x Tensor(2) on test has 2 elements, y Tensor(3) on test has 3", func() { Axpy(x3, x2) }},
		{"Gemm offset", "tensor.Gemm: offset 7 of a is outside its 6 elements", func() { Gemm(false, false, 1, 1, 1, x6, 7, 1, x6, 0, 1, x6, 0, 1) }},
		{"Gemm short", "tensor.Sgemm: len(c)=6, need 9 for C (3x3, ldc=3, strideC=0, batch=1)", func() { Gemm(false, false, 3, 3, 1, x6, 0, 1, x6, 0, 3, x6, 0, 3) }},
		{"GemmStridedBatched", "tensor.SgemmStridedBatched: strideC=0 with batch=2 would write every product to the same C", func() {
			GemmStridedBatched(false, false, 1, 1, 1, x6, 0, 1, 1, x6, 0, 1, 1, x6, 0, 1, 0, 2)
		}},
		{"GemmLayout lda", "tensor.Sgemm: lda=3 is less than the 4 columns of A (transA=false)", func() {
			GemmLayout("Sgemm", false, false, 3, 4, 4, 12, 3, 0, 16, 4, 0, 12, 4, 0, 1)
		}},
		{"AddBias", "tensor.AddBias: out Tensor(3) on test has 3 elements, not a multiple of 2", func() { AddBias(x3, x2) }},
		{"BiasBackward", "tensor.BiasBackward: dout Tensor(3) on test has 3 elements, not a multiple of 2", func() { BiasBackward(x2, x3) }},
		{"EmbeddingForward", "tensor.EmbeddingForward: len(ids)=1, out Tensor(2,2) on test has 2 rows of 2", func() { EmbeddingForward(shape{2, 2}, []int32{0}, x32) }},
		{"EmbeddingBackward", "tensor.EmbeddingBackward: len(ids)=1, dout Tensor(3,2) on test has 3 rows of 2", func() { EmbeddingBackward(x32, x32, []int32{0}) }},
		{"LayerNormForward", "tensor.LayerNormForward: mean Tensor(3) on test has 3 elements, want 4", func() { LayerNormForward(x48, x3, x4, x48, shape{8}, shape{8}) }},
		{"LayerNormBackward", "tensor.LayerNormBackward: dbias Tensor(7) on test has 7 elements, want 8", func() {
			LayerNormBackward(x48, shape{8}, shape{7}, x48, x48, shape{8}, x4, x4)
		}},
		{"ActivationForward", "tensor.ActivationForward: inp Tensor(3) on test has 3 elements, out Tensor(2) on test has 2", func() { ActivationForward(x2, x3) }},
		{"ActivationBackward", "tensor.ActivationBackward: dout Tensor(3) on test has 3 elements, dinp Tensor(2) on test has 2", func() { ActivationBackward(x2, x2, x3) }},
		{"SoftmaxForward rank", "tensor.SoftmaxForward: inp Tensor(6) on test must be at least (Tq,Tk)", func() { SoftmaxForward(x6, x6, 1, nil) }},
		{"SoftmaxForward scale", "tensor.SoftmaxForward: scale 0 must be positive", func() { SoftmaxForward(x23, x23, 0, nil) }},
		{"SoftmaxForward keyValid", "tensor.SoftmaxForward: keyValid has 3 entries, inp Tensor(2,3) on test needs (B,Tk) = 6 with a leading B", func() {
			SoftmaxForward(x23, x23, 1, []int32{1, 1, 1})
		}},
		{"SoftmaxBackward", "tensor.SoftmaxBackward: dout Tensor(3,2) on test has 6 elements, dinp Tensor(2) on test has 2", func() { SoftmaxBackward(x2, x32, x2) }},
		{"CrossEntropyRowMax", "tensor.CrossEntropyRowMax: rowMax Tensor(3) on test has 3 elements, want 2", func() { CrossEntropyRowMax(x3, x23) }},
		{"CrossEntropySumExp", "tensor.CrossEntropySumExp: rowMax Tensor(3) on test has 3 elements, want 2", func() { CrossEntropySumExp(x2, x23, x3) }},
		{"CrossEntropyTargetLogit", "tensor.CrossEntropyTargetLogit: len(targets)=1, logits Tensor(2,3) on test has 2 rows", func() {
			CrossEntropyTargetLogit(x2, x23, []int32{0})
		}},
		{"CrossEntropyLoss", "tensor.CrossEntropyLoss: len(targets)=1, losses Tensor(2) on test has 2 elements", func() {
			CrossEntropyLoss(x2, x2, x2, x2, []int32{0})
		}},
		{"CrossEntropyBackward", "tensor.CrossEntropyBackward: len(targets)=1, logits Tensor(2,3) on test has 2 rows", func() {
			CrossEntropyBackward(x23, x23, x2, x2, []int32{1})
		}},
		{"AdamW lengths", "tensor.AdamW: v Tensor(3) on test has 3 elements, param Tensor(6) on test has 6", func() { AdamW(x6, x6, x6, x3, nil, 1) }},
		{"AdamW step", "tensor.AdamW: Step is 0, it counts from 1", func() { AdamW(x6, x6, x6, x6, nil, 0) }},
		{"Len", "tensor.AttentionForward: out Tensor(6) on test has 6 elements, want 4", func() { Len("AttentionForward", "out", x6, 4) }},
	}
	for _, tc := range cases {
		mustPanic(t, tc.name, tc.want, tc.f)
	}
}

// TestGoodArgs checks that right shapes pass, return the row counts the
// kernels use, and allocate nothing.
func TestGoodArgs(t *testing.T) {
	x48, x8, x4, att := Shape(shape{4, 8}), Shape(shape{8}), Shape(shape{4}), Shape(shape{2, 3, 4, 4})
	table, c44 := Shape(shape{10, 8}), Shape(shape{4, 4})
	ids := make([]int32, 4)
	keyValid := make([]int32, 8)
	var rows, perItem, n int
	var empty bool
	f := func() {
		n = LayerNormForward(x48, x4, x4, x48, x8, x8)
		n += LayerNormBackward(x48, x8, x8, x48, x48, x8, x4, x4)
		n += EmbeddingForward(x48, ids, table)
		n += CrossEntropyBackward(x48, x48, x4, x4, ids)
		rows, perItem = SoftmaxForward(att, att, 0.5, keyValid)
		empty = Block2D("Copy2D", x48, 0, 8, x48, 0, 8, 0, 8)
		Gemm(false, true, 4, 4, 8, x48, 0, 8, x48, 0, 8, c44, 0, 4)
		AdamW(x8, x8, x8, x8, nil, 1)
	}
	f()
	if n != 16 || rows != 24 || perItem != 12 || !empty {
		t.Fatalf("n=%d rows=%d perItem=%d empty=%v, want 16 24 12 true", n, rows, perItem, empty)
	}
	if allocs := testing.AllocsPerRun(10, f); allocs != 0 {
		t.Errorf("%v allocations per run of the checks", allocs)
	}
}

// TestSpan checks span, the elements batch GEMM operands reach from the
// start of the first: (rows, cols) matrices ld apart in rows and stride
// apart.
func TestSpan(t *testing.T) {
	for _, tc := range []struct {
		rows, cols, ld, stride, batch int
		want                          int
	}{
		{3, 4, 5, 0, 1, 14},
		{4, 3, 5, 0, 1, 18},
		{3, 4, 4, 12, 2, 24},
		{0, 4, 4, 12, 2, 0},
	} {
		if got := span(tc.rows, tc.cols, tc.ld, tc.stride, tc.batch); got != tc.want {
			t.Errorf("span(%d, %d, %d, %d, %d) = %d, want %d", tc.rows, tc.cols, tc.ld, tc.stride, tc.batch, got, tc.want)
		}
	}
}
