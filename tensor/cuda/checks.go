package cuda

import (
	"fmt"

	"github.com/hpcrun/hpcrun/tensor"
)

// Argument checks with the CPU device's messages ("tensor.Fn: ..."): a
// wrong shape panics the same way on every backend, before anything is
// enqueued.

// own panics unless every tensor is a live tensor of this device.
func (d *Device) own(fn string, ts ...*tensor.Tensor) {
	for _, t := range ts {
		if t == nil {
			panic(fmt.Sprintf("tensor.%s: nil tensor", fn))
		}
		if t.Device() != tensor.Device(d) {
			panic(fmt.Sprintf("tensor.%s: tensor %v is not on this cuda device", fn, t))
		}
		if t.Buffer().Freed() {
			panic(fmt.Sprintf("tensor.%s: tensor %v was freed", fn, t))
		}
	}
}

// sameLen panics unless the tensors, given as name, tensor pairs, all have
// the Len of the first.
func sameLen(fn string, pairs ...any) {
	first := pairs[1].(*tensor.Tensor)
	for i := 2; i < len(pairs); i += 2 {
		if t := pairs[i+1].(*tensor.Tensor); t.Len() != first.Len() {
			panic(fmt.Sprintf("tensor.%s: %s %v has %d elements, %s %v has %d", fn, pairs[i], t, t.Len(), pairs[0], first, first.Len()))
		}
	}
}

// wantLen panics unless t has n elements.
func wantLen(fn, name string, t *tensor.Tensor, n int) {
	if t.Len() != n {
		panic(fmt.Sprintf("tensor.%s: %s %v has %d elements, want %d", fn, name, t, t.Len(), n))
	}
}

// rowsOf is t's row count for rows of cols elements.
func rowsOf(fn, name string, t *tensor.Tensor, cols int) int {
	if cols <= 0 {
		if t.Len() == 0 {
			return 0
		}
		panic(fmt.Sprintf("tensor.%s: rows of %d elements in %s %v", fn, cols, name, t))
	}
	if t.Len()%cols != 0 {
		panic(fmt.Sprintf("tensor.%s: %s %v has %d elements, not a multiple of %d", fn, name, t, t.Len(), cols))
	}
	return t.Len() / cols
}

// checkBlock panics unless a (rows,cols) block with leading dimension ld
// from element off fits in t; it reports whether the block is empty.
func checkBlock(fn, name string, t *tensor.Tensor, off, ld, rows, cols int) (empty bool) {
	if rows < 0 || cols < 0 || ld < cols || off < 0 {
		panic(fmt.Sprintf("tensor.%s: bad %s block: offset %d, ld %d, %dx%d", fn, name, off, ld, rows, cols))
	}
	if rows == 0 || cols == 0 {
		return true
	}
	if end := off + (rows-1)*ld + cols; end > t.Len() {
		panic(fmt.Sprintf("tensor.%s: %s block ends at element %d, %s %v has %d", fn, name, end, name, t, t.Len()))
	}
	return false
}

// gemmOperand is one matrix argument of a GEMM: the tensor, the element
// offset of its first matrix and the elements from there on.
func gemmOperand(fn, name string, t *tensor.Tensor, off int) int {
	if off < 0 || off > t.Len() {
		panic(fmt.Sprintf("tensor.%s: offset %d of %s is outside its %d elements", fn, off, name, t.Len()))
	}
	return t.Len() - off
}

// checkGemm is Sgemm's argument check on lengths (lenX are the elements
// from the operand's offset on); batch is 1 for Gemm.
func checkGemm(fn string, transA, transB bool, m, n, k int, lenA, lda, strideA, lenB, ldb, strideB, lenC, ldc, strideC, batch int) {
	bad := func(format string, args ...any) {
		panic(fmt.Sprintf("tensor.%s: %s", fn, fmt.Sprintf(format, args...)))
	}
	if m < 0 || n < 0 || k < 0 || batch < 0 {
		bad("negative dimension m=%d n=%d k=%d batch=%d", m, n, k, batch)
	}
	if strideA < 0 || strideB < 0 || strideC < 0 {
		bad("negative stride strideA=%d strideB=%d strideC=%d", strideA, strideB, strideC)
	}
	ar, ac := m, k
	if transA {
		ar, ac = k, m
	}
	br, bc := k, n
	if transB {
		br, bc = n, k
	}
	if lda < max(1, ac) {
		bad("lda=%d is less than the %d columns of A (transA=%v)", lda, ac, transA)
	}
	if ldb < max(1, bc) {
		bad("ldb=%d is less than the %d columns of B (transB=%v)", ldb, bc, transB)
	}
	if ldc < max(1, n) {
		bad("ldc=%d is less than the %d columns of C", ldc, n)
	}
	if m == 0 || n == 0 || batch == 0 {
		return
	}
	interleaved := strideC >= n && (batch-1)*strideC+n <= ldc
	if batch > 1 && strideC > 0 && strideC < (m-1)*ldc+n && !interleaved {
		bad("strideC=%d makes the (%d,%d) C matrices overlap (ldc=%d): use strideC >= %d for separate blocks, or n <= strideC and (batch-1)*strideC+n <= ldc for side-by-side columns", strideC, m, n, ldc, (m-1)*ldc+n)
	}
	if batch > 1 && strideC == 0 {
		bad("strideC=0 with batch=%d would write every product to the same C", batch)
	}
	if k > 0 {
		if need := span(ar, ac, lda, strideA, batch); lenA < need {
			bad("len(a)=%d, need %d for A (%dx%d, lda=%d, strideA=%d, batch=%d)", lenA, need, ar, ac, lda, strideA, batch)
		}
		if need := span(br, bc, ldb, strideB, batch); lenB < need {
			bad("len(b)=%d, need %d for B (%dx%d, ldb=%d, strideB=%d, batch=%d)", lenB, need, br, bc, ldb, strideB, batch)
		}
	}
	if need := span(m, n, ldc, strideC, batch); lenC < need {
		bad("len(c)=%d, need %d for C (%dx%d, ldc=%d, strideC=%d, batch=%d)", lenC, need, m, n, ldc, strideC, batch)
	}
}

// span is the elements batch (rows,cols) matrices with leading dimension ld,
// stride apart, reach from the first one's start.
func span(rows, cols, ld, stride, batch int) int {
	if rows == 0 || cols == 0 || batch == 0 {
		return 0
	}
	return (batch-1)*stride + (rows-1)*ld + cols
}
