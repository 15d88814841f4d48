package tensor

import "fmt"

// Argument checks shared by every Device. A backend calls CheckX at the top
// of its method X, after its own ownership check (a tensor lives on this
// device and is not freed) and before it touches memory or enqueues work,
// so that a wrong shape panics with the same one-line "tensor.X: ..."
// message on every device. The checks allocate nothing unless they panic.
// Those that return a value hand back what the kernel needs (usually its
// row count N) so a backend does not work it out again.

// CheckCopyFromHost checks CopyFromHost: len(src) == dst.Len().
func CheckCopyFromHost(dst *Tensor, src []float32) {
	if len(src) != dst.n {
		panic(fmt.Sprintf("tensor.CopyFromHost: len(src)=%d, dst %v has %d elements", len(src), dst, dst.n))
	}
}

// CheckCopyToHost checks CopyToHost: len(dst) == src.Len().
func CheckCopyToHost(dst []float32, src *Tensor) {
	if len(dst) != src.n {
		panic(fmt.Sprintf("tensor.CopyToHost: len(dst)=%d, src %v has %d elements", len(dst), src, src.n))
	}
}

// CheckCopy checks Copy: dst and src have the same Len.
func CheckCopy(dst, src *Tensor) { sameLen2("Copy", "dst", dst, "src", src) }

// CheckBlock2D checks Copy2D and Axpy2D (fn names which): both (rows,cols)
// blocks fit their tensors. It reports whether the blocks are empty, when
// there is nothing to do.
func CheckBlock2D(fn string, dst *Tensor, dstOff, ldDst int, src *Tensor, srcOff, ldSrc, rows, cols int) (empty bool) {
	e1 := checkBlock(fn, "dst", dst, dstOff, ldDst, rows, cols)
	e2 := checkBlock(fn, "src", src, srcOff, ldSrc, rows, cols)
	return e1 || e2
}

// CheckAdd checks Add: out, a and b have the same Len.
func CheckAdd(out, a, b *Tensor) { sameLen3("Add", "out", out, "a", a, "b", b) }

// CheckAxpy checks Axpy: y and x have the same Len.
func CheckAxpy(y, x *Tensor) { sameLen2("Axpy", "y", y, "x", x) }

// CheckGemm checks Gemm's offsets and then its layout as Sgemm does, with
// Sgemm's messages.
func CheckGemm(transA, transB bool, m, n, k int, a *Tensor, aOff, lda int, b *Tensor, bOff, ldb int, c *Tensor, cOff, ldc int) {
	lenA := operandLen("Gemm", "a", a, aOff)
	lenB := operandLen("Gemm", "b", b, bOff)
	lenC := operandLen("Gemm", "c", c, cOff)
	checkGemm("Sgemm", transA, transB, m, n, k, lenA, lda, 0, lenB, ldb, 0, lenC, ldc, 0, 1)
}

// CheckGemmStridedBatched checks GemmStridedBatched's offsets and then its
// layout as SgemmStridedBatched does, with its messages.
func CheckGemmStridedBatched(transA, transB bool, m, n, k int, a *Tensor, aOff, lda, strideA int, b *Tensor, bOff, ldb, strideB int, c *Tensor, cOff, ldc, strideC, batch int) {
	lenA := operandLen("GemmStridedBatched", "a", a, aOff)
	lenB := operandLen("GemmStridedBatched", "b", b, bOff)
	lenC := operandLen("GemmStridedBatched", "c", c, cOff)
	checkGemm("SgemmStridedBatched", transA, transB, m, n, k, lenA, lda, strideA, lenB, ldb, strideB, lenC, ldc, strideC, batch)
}

// GemmSpan is the number of elements that batch GEMM operands reach from
// the start of the first: each is op(X), (rows,cols), stored with leading
// dimension ld (transposed when trans), stride elements apart. It is 0
// when the operands are empty.
func GemmSpan(trans bool, rows, cols, ld, stride, batch int) int {
	if trans {
		rows, cols = cols, rows
	}
	return span(rows, cols, ld, stride, batch)
}

// CheckAddBias checks AddBias and returns N, the rows of out.
func CheckAddBias(out, bias *Tensor) (n int) {
	return rowsOf("AddBias", "out", out, bias.n)
}

// CheckBiasBackward checks BiasBackward and returns N, the rows of dout.
func CheckBiasBackward(dbias, dout *Tensor) (n int) {
	return rowsOf("BiasBackward", "dout", dout, dbias.n)
}

// CheckEmbeddingForward checks EmbeddingForward and returns N, the rows of
// out.
func CheckEmbeddingForward(out *Tensor, ids []int32, table *Tensor) (n int) {
	c := table.Cols()
	n = rowsOf("EmbeddingForward", "out", out, c)
	if len(ids) != n {
		panic(fmt.Sprintf("tensor.EmbeddingForward: len(ids)=%d, out %v has %d rows of %d", len(ids), out, n, c))
	}
	return n
}

// CheckEmbeddingBackward checks EmbeddingBackward and returns N, the rows
// of dout.
func CheckEmbeddingBackward(dtable, dout *Tensor, ids []int32) (n int) {
	c := dtable.Cols()
	n = rowsOf("EmbeddingBackward", "dout", dout, c)
	if len(ids) != n {
		panic(fmt.Sprintf("tensor.EmbeddingBackward: len(ids)=%d, dout %v has %d rows of %d", len(ids), dout, n, c))
	}
	return n
}

// CheckLayerNormForward checks LayerNormForward and returns N, the rows of
// inp.
func CheckLayerNormForward(out, mean, rstd, inp, weight, bias *Tensor) (n int) {
	c := weight.n
	wantLen("LayerNormForward", "bias", bias, c)
	n = rowsOf("LayerNormForward", "inp", inp, c)
	wantLen("LayerNormForward", "out", out, inp.n)
	wantLen("LayerNormForward", "mean", mean, n)
	wantLen("LayerNormForward", "rstd", rstd, n)
	return n
}

// CheckLayerNormBackward checks LayerNormBackward and returns N, the rows
// of inp.
func CheckLayerNormBackward(dinp, dweight, dbias, dout, inp, weight, mean, rstd *Tensor) (n int) {
	c := weight.n
	wantLen("LayerNormBackward", "dweight", dweight, c)
	wantLen("LayerNormBackward", "dbias", dbias, c)
	n = rowsOf("LayerNormBackward", "inp", inp, c)
	wantLen("LayerNormBackward", "dinp", dinp, inp.n)
	wantLen("LayerNormBackward", "dout", dout, inp.n)
	wantLen("LayerNormBackward", "mean", mean, n)
	wantLen("LayerNormBackward", "rstd", rstd, n)
	return n
}

// CheckGELUForward checks GELUForward: out and inp have the same Len.
func CheckGELUForward(out, inp *Tensor) { sameLen2("GELUForward", "out", out, "inp", inp) }

// CheckGELUBackward checks GELUBackward: dinp, inp and dout have the same
// Len.
func CheckGELUBackward(dinp, inp, dout *Tensor) {
	sameLen3("GELUBackward", "dinp", dinp, "inp", inp, "dout", dout)
}

// CheckSoftmaxForward checks SoftmaxForward and returns the rows of inp
// (Tk elements each) and, when keyValid is given, the rows per batch item
// (0 otherwise).
func CheckSoftmaxForward(out, inp *Tensor, scale float32, keyValid []int32) (rows, perItem int) {
	sameLen2("SoftmaxForward", "out", out, "inp", inp)
	if inp.Rank() < 2 {
		panic(fmt.Sprintf("tensor.SoftmaxForward: inp %v must be at least (Tq,Tk)", inp))
	}
	if scale <= 0 {
		panic(fmt.Sprintf("tensor.SoftmaxForward: scale %g must be positive", scale))
	}
	tk := inp.Dim(-1)
	rows = rowsOf("SoftmaxForward", "inp", inp, tk)
	if keyValid != nil {
		b := inp.Dim(0)
		if inp.Rank() < 3 || len(keyValid) != b*tk {
			panic(fmt.Sprintf("tensor.SoftmaxForward: keyValid has %d entries, inp %v needs (B,Tk) = %d with a leading B", len(keyValid), inp, b*tk))
		}
		perItem = rows / max(b, 1)
	}
	return rows, perItem
}

// CheckSoftmaxBackward checks SoftmaxBackward and returns the rows of out.
func CheckSoftmaxBackward(dinp, dout, out *Tensor) (rows int) {
	sameLen3("SoftmaxBackward", "dinp", dinp, "dout", dout, "out", out)
	return rowsOf("SoftmaxBackward", "out", out, out.Cols())
}

// CheckCrossEntropyRowMax checks CrossEntropyRowMax and returns N, the rows
// of logits.
func CheckCrossEntropyRowMax(rowMax, logits *Tensor) (n int) {
	n = rowsOf("CrossEntropyRowMax", "logits", logits, logits.Cols())
	wantLen("CrossEntropyRowMax", "rowMax", rowMax, n)
	return n
}

// CheckCrossEntropySumExp checks CrossEntropySumExp and returns N, the rows
// of logits.
func CheckCrossEntropySumExp(sumExp, logits, rowMax *Tensor) (n int) {
	n = rowsOf("CrossEntropySumExp", "logits", logits, logits.Cols())
	wantLen("CrossEntropySumExp", "sumExp", sumExp, n)
	wantLen("CrossEntropySumExp", "rowMax", rowMax, n)
	return n
}

// CheckCrossEntropyTargetLogit checks CrossEntropyTargetLogit and returns
// N, the rows of logits.
func CheckCrossEntropyTargetLogit(out, logits *Tensor, targets []int32) (n int) {
	n = rowsOf("CrossEntropyTargetLogit", "logits", logits, logits.Cols())
	wantLen("CrossEntropyTargetLogit", "out", out, n)
	if len(targets) != n {
		panic(fmt.Sprintf("tensor.CrossEntropyTargetLogit: len(targets)=%d, logits %v has %d rows", len(targets), logits, n))
	}
	return n
}

// CheckCrossEntropyLoss checks CrossEntropyLoss and returns N, the Len of
// losses.
func CheckCrossEntropyLoss(losses, rowMax, sumExp, targetLogit *Tensor, targets []int32) (n int) {
	n = losses.n
	wantLen("CrossEntropyLoss", "rowMax", rowMax, n)
	wantLen("CrossEntropyLoss", "sumExp", sumExp, n)
	wantLen("CrossEntropyLoss", "targetLogit", targetLogit, n)
	if len(targets) != n {
		panic(fmt.Sprintf("tensor.CrossEntropyLoss: len(targets)=%d, losses %v has %d elements", len(targets), losses, n))
	}
	return n
}

// CheckCrossEntropyBackward checks CrossEntropyBackward and returns N, the
// rows of logits.
func CheckCrossEntropyBackward(dlogits, logits, rowMax, sumExp *Tensor, targets []int32) (n int) {
	sameLen2("CrossEntropyBackward", "dlogits", dlogits, "logits", logits)
	n = rowsOf("CrossEntropyBackward", "logits", logits, logits.Cols())
	wantLen("CrossEntropyBackward", "rowMax", rowMax, n)
	wantLen("CrossEntropyBackward", "sumExp", sumExp, n)
	if len(targets) != n {
		panic(fmt.Sprintf("tensor.CrossEntropyBackward: len(targets)=%d, logits %v has %d rows", len(targets), logits, n))
	}
	return n
}

// CheckAdamW checks AdamW: the four tensors have the same Len and p.Step
// counts from 1.
func CheckAdamW(param, grad, m, v *Tensor, p AdamWParams) {
	sameLen3("AdamW", "param", param, "grad", grad, "m", m)
	sameLen2("AdamW", "param", param, "v", v)
	if p.Step < 1 {
		panic(fmt.Sprintf("tensor.AdamW: Step is %d, it counts from 1", p.Step))
	}
}

// --- helpers ---

// sameLen2 panics unless b has the Len of a.
func sameLen2(fn, na string, a *Tensor, nb string, b *Tensor) {
	if b.n != a.n {
		panic(fmt.Sprintf("tensor.%s: %s %v has %d elements, %s %v has %d", fn, nb, b, b.n, na, a, a.n))
	}
}

// sameLen3 panics unless b and c have the Len of a.
func sameLen3(fn, na string, a *Tensor, nb string, b *Tensor, nc string, c *Tensor) {
	sameLen2(fn, na, a, nb, b)
	sameLen2(fn, na, a, nc, c)
}

// wantLen panics unless t has n elements.
func wantLen(fn, name string, t *Tensor, n int) {
	if t.n != n {
		panic(fmt.Sprintf("tensor.%s: %s %v has %d elements, want %d", fn, name, t, t.n, n))
	}
}

// rowsOf returns the row count of t for rows of length cols, panicking when
// t's Len is not a multiple of cols.
func rowsOf(fn, name string, t *Tensor, cols int) int {
	if cols <= 0 {
		if t.n == 0 {
			return 0
		}
		panic(fmt.Sprintf("tensor.%s: rows of %d elements in %s %v", fn, cols, name, t))
	}
	if t.n%cols != 0 {
		panic(fmt.Sprintf("tensor.%s: %s %v has %d elements, not a multiple of %d", fn, name, t, t.n, cols))
	}
	return t.n / cols
}

// checkBlock panics unless a (rows,cols) block with leading dimension ld
// from element off fits in t; it reports whether the block is empty.
func checkBlock(fn, name string, t *Tensor, off, ld, rows, cols int) (empty bool) {
	if rows < 0 || cols < 0 || ld < cols || off < 0 {
		panic(fmt.Sprintf("tensor.%s: bad %s block: offset %d, ld %d, %dx%d", fn, name, off, ld, rows, cols))
	}
	if rows == 0 || cols == 0 {
		return true
	}
	if end := off + (rows-1)*ld + cols; end > t.n {
		panic(fmt.Sprintf("tensor.%s: %s block ends at element %d, %s %v has %d", fn, name, end, name, t, t.n))
	}
	return false
}

// operandLen is the number of elements of GEMM operand t from offset off on.
func operandLen(fn, name string, t *Tensor, off int) int {
	if off < 0 || off > t.n {
		panic(fmt.Sprintf("tensor.%s: offset %d of %s is outside its %d elements", fn, off, name, t.n))
	}
	return t.n - off
}

// gemmPanic panics with fn's one-line GEMM argument message.
func gemmPanic(fn, format string, args ...any) {
	panic(fmt.Sprintf("tensor.%s: %s", fn, fmt.Sprintf(format, args...)))
}

// checkGemm panics with a one-line message that names the bad argument of
// a GEMM routine fn; lenX are the elements of operand X from its first
// matrix on, and batch is 1 for a single product.
func checkGemm(fn string, transA, transB bool, m, n, k int, lenA, lda, strideA, lenB, ldb, strideB, lenC, ldc, strideC, batch int) {
	if m < 0 || n < 0 || k < 0 || batch < 0 {
		gemmPanic(fn, "negative dimension m=%d n=%d k=%d batch=%d", m, n, k, batch)
	}
	if strideA < 0 || strideB < 0 || strideC < 0 {
		gemmPanic(fn, "negative stride strideA=%d strideB=%d strideC=%d", strideA, strideB, strideC)
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
		gemmPanic(fn, "lda=%d is less than the %d columns of A (transA=%v)", lda, ac, transA)
	}
	if ldb < max(1, bc) {
		gemmPanic(fn, "ldb=%d is less than the %d columns of B (transB=%v)", ldb, bc, transB)
	}
	if ldc < max(1, n) {
		gemmPanic(fn, "ldc=%d is less than the %d columns of C", ldc, n)
	}
	if m == 0 || n == 0 || batch == 0 {
		return
	}
	if batch > 1 && strideC > 0 && strideC < (m-1)*ldc+n && !cInterleaves(n, ldc, strideC, batch) {
		gemmPanic(fn, "strideC=%d makes the (%d,%d) C matrices overlap (ldc=%d): use strideC >= %d for separate blocks, or n <= strideC and (batch-1)*strideC+n <= ldc for side-by-side columns", strideC, m, n, ldc, (m-1)*ldc+n)
	}
	if batch > 1 && strideC == 0 {
		gemmPanic(fn, "strideC=0 with batch=%d would write every product to the same C", batch)
	}
	if k > 0 {
		if need := span(ar, ac, lda, strideA, batch); lenA < need {
			gemmPanic(fn, "len(a)=%d, need %d for A (%dx%d, lda=%d, strideA=%d, batch=%d)", lenA, need, ar, ac, lda, strideA, batch)
		}
		if need := span(br, bc, ldb, strideB, batch); lenB < need {
			gemmPanic(fn, "len(b)=%d, need %d for B (%dx%d, ldb=%d, strideB=%d, batch=%d)", lenB, need, br, bc, ldb, strideB, batch)
		}
	}
	if need := span(m, n, ldc, strideC, batch); lenC < need {
		gemmPanic(fn, "len(c)=%d, need %d for C (%dx%d, ldc=%d, strideC=%d, batch=%d)", lenC, need, m, n, ldc, strideC, batch)
	}
}

// cInterleaves reports whether batch (m,n) C matrices strideC apart sit
// side by side within rows of width ldc without touching: matrix i holds
// columns [i*strideC, i*strideC+n) of every row, as the heads of a (B,T,C)
// attention output do (strideC = hs, ldc = C).
func cInterleaves(n, ldc, strideC, batch int) bool {
	return strideC >= n && (batch-1)*strideC+n <= ldc
}

// span is the elements batch (rows,cols) matrices with leading dimension ld,
// stride apart, reach from the first one's start.
func span(rows, cols, ld, stride, batch int) int {
	if rows == 0 || cols == 0 || batch == 0 {
		return 0
	}
	return (batch-1)*stride + (rows-1)*ld + cols
}
