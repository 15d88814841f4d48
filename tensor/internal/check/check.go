// Package check holds the argument checks every tensor.Device runs, so that
// the CPU device (package tensor) and the CUDA device (tensor/cuda) reject a
// wrong shape with the same one-line "tensor.X: ..." panic. A backend calls
// check.X at the top of its method X, after its own ownership check (a
// tensor lives on this device and is not freed) and before it touches memory
// or enqueues work. The checks allocate nothing unless they panic. Those that
// return a value hand back what the kernel needs (usually its row count N) so
// a backend does not work it out again.
//
// It reads tensors through Shape and knows nothing of devices or kernels.
package check

import "fmt"

// Shape is what a check reads of a tensor; *tensor.Tensor is one. String
// describes the tensor in messages.
type Shape interface {
	// Len is the number of elements.
	Len() int
	// Rank is the number of dimensions.
	Rank() int
	// Dim is the size of dimension i; negative i counts from the end.
	Dim(i int) int
	// Cols is the last dimension (1 for a scalar).
	Cols() int
	fmt.Stringer
}

// CopyFromHost checks CopyFromHost: len(src) == dst.Len().
func CopyFromHost(dst Shape, src []float32) {
	if len(src) != dst.Len() {
		panic(fmt.Sprintf("tensor.CopyFromHost: len(src)=%d, dst %v has %d elements", len(src), dst, dst.Len()))
	}
}

// CopyToHost checks CopyToHost: len(dst) == src.Len().
func CopyToHost(dst []float32, src Shape) {
	if len(dst) != src.Len() {
		panic(fmt.Sprintf("tensor.CopyToHost: len(dst)=%d, src %v has %d elements", len(dst), src, src.Len()))
	}
}

// Copy checks Copy: dst and src have the same Len.
func Copy(dst, src Shape) { sameLen2("Copy", "dst", dst, "src", src) }

// Block2D checks Copy2D and Axpy2D (fn names which): both (rows,cols)
// blocks fit their tensors. It reports whether the blocks are empty, when
// there is nothing to do.
func Block2D(fn string, dst Shape, dstOff, ldDst int, src Shape, srcOff, ldSrc, rows, cols int) (empty bool) {
	e1 := checkBlock(fn, "dst", dst, dstOff, ldDst, rows, cols)
	e2 := checkBlock(fn, "src", src, srcOff, ldSrc, rows, cols)
	return e1 || e2
}

// Copy2DHalf checks Copy2D where dst or src is not float32 (their dtypes
// dt and st): a bfloat16 block copies only into bfloat16; then the
// block, as Block2D.
func Copy2DHalf(dst Shape, dt fmt.Stringer, dstOff, ldDst int, src Shape, st fmt.Stringer, srcOff, ldSrc, rows, cols int) (empty bool) {
	if dt.String() != st.String() {
		panic(fmt.Sprintf("tensor.Copy2D: dst is %v, src %v: a bfloat16 block copies only into bfloat16", dt, st))
	}
	return Block2D("Copy2D", dst, dstOff, ldDst, src, srcOff, ldSrc, rows, cols)
}

// Add checks Add: out, a and b have the same Len.
func Add(out, a, b Shape) { sameLen3("Add", "out", out, "a", a, "b", b) }

// Axpy checks Axpy: y and x have the same Len.
func Axpy(y, x Shape) { sameLen2("Axpy", "y", y, "x", x) }

// Gemm checks Gemm's offsets and then its layout as Sgemm does, with
// Sgemm's messages.
func Gemm(transA, transB bool, m, n, k int, a Shape, aOff, lda int, b Shape, bOff, ldb int, c Shape, cOff, ldc int) {
	lenA := operandLen("Gemm", "a", a, aOff)
	lenB := operandLen("Gemm", "b", b, bOff)
	lenC := operandLen("Gemm", "c", c, cOff)
	GemmLayout("Sgemm", transA, transB, m, n, k, lenA, lda, 0, lenB, ldb, 0, lenC, ldc, 0, 1)
}

// GemmStridedBatched checks GemmStridedBatched's offsets and then its
// layout as SgemmStridedBatched does, with its messages.
func GemmStridedBatched(transA, transB bool, m, n, k int, a Shape, aOff, lda, strideA int, b Shape, bOff, ldb, strideB int, c Shape, cOff, ldc, strideC, batch int) {
	lenA := operandLen("GemmStridedBatched", "a", a, aOff)
	lenB := operandLen("GemmStridedBatched", "b", b, bOff)
	lenC := operandLen("GemmStridedBatched", "c", c, cOff)
	GemmLayout("SgemmStridedBatched", transA, transB, m, n, k, lenA, lda, strideA, lenB, ldb, strideB, lenC, ldc, strideC, batch)
}

// AddBias checks AddBias and returns N, the rows of out.
func AddBias(out, bias Shape) (n int) {
	return rowsOf("AddBias", "out", out, bias.Len())
}

// BiasBackward checks BiasBackward and returns N, the rows of dout.
func BiasBackward(dbias, dout Shape) (n int) {
	return rowsOf("BiasBackward", "dout", dout, dbias.Len())
}

// EmbeddingForward checks EmbeddingForward and returns N, the rows of
// out.
func EmbeddingForward(out Shape, ids []int32, table Shape) (n int) {
	c := table.Cols()
	n = rowsOf("EmbeddingForward", "out", out, c)
	if len(ids) != n {
		panic(fmt.Sprintf("tensor.EmbeddingForward: len(ids)=%d, out %v has %d rows of %d", len(ids), out, n, c))
	}
	return n
}

// EmbeddingBackward checks EmbeddingBackward and returns N, the rows
// of dout.
func EmbeddingBackward(dtable, dout Shape, ids []int32) (n int) {
	c := dtable.Cols()
	n = rowsOf("EmbeddingBackward", "dout", dout, c)
	if len(ids) != n {
		panic(fmt.Sprintf("tensor.EmbeddingBackward: len(ids)=%d, dout %v has %d rows of %d", len(ids), dout, n, c))
	}
	return n
}

// LayerNormForward checks LayerNormForward and returns N, the rows of
// inp.
func LayerNormForward(out, mean, rstd, inp, weight, bias Shape) (n int) {
	c := weight.Len()
	Len("LayerNormForward", "bias", bias, c)
	n = rowsOf("LayerNormForward", "inp", inp, c)
	Len("LayerNormForward", "out", out, inp.Len())
	Len("LayerNormForward", "mean", mean, n)
	Len("LayerNormForward", "rstd", rstd, n)
	return n
}

// AddLayerNormForward checks AddLayerNormForward and returns N, the rows
// of sum.
func AddLayerNormForward(sum, out, mean, rstd, a, b, weight, bias Shape) (n int) {
	sameLen3("AddLayerNormForward", "sum", sum, "a", a, "b", b)
	return LayerNormForward(out, mean, rstd, sum, weight, bias)
}

// AddRMSNormForward checks AddRMSNormForward and returns N, the rows of
// sum.
func AddRMSNormForward(sum, out, rstd, a, b, weight Shape) (n int) {
	sameLen3("AddRMSNormForward", "sum", sum, "a", a, "b", b)
	return RMSNormForward(out, rstd, sum, weight)
}

// LayerNormBackward checks LayerNormBackward and returns N, the rows
// of inp.
func LayerNormBackward(dinp, dweight, dbias, dout, inp, weight, mean, rstd Shape) (n int) {
	c := weight.Len()
	Len("LayerNormBackward", "dweight", dweight, c)
	Len("LayerNormBackward", "dbias", dbias, c)
	n = rowsOf("LayerNormBackward", "inp", inp, c)
	Len("LayerNormBackward", "dinp", dinp, inp.Len())
	Len("LayerNormBackward", "dout", dout, inp.Len())
	Len("LayerNormBackward", "mean", mean, n)
	Len("LayerNormBackward", "rstd", rstd, n)
	return n
}

// ActivationForward checks ActivationForward: out and inp have the same
// Len.
func ActivationForward(out, inp Shape) { sameLen2("ActivationForward", "out", out, "inp", inp) }

// ActivationBackward checks ActivationBackward: dinp, inp and dout have
// the same Len.
func ActivationBackward(dinp, inp, dout Shape) {
	sameLen3("ActivationBackward", "dinp", dinp, "inp", inp, "dout", dout)
}

// BiasActivationForward checks BiasActivationForward and returns N, the
// rows of pre: out and pre have the same Len, a multiple of bias's.
func BiasActivationForward(out, pre, bias Shape) (n int) {
	sameLen2("BiasActivationForward", "out", out, "pre", pre)
	return rowsOf("BiasActivationForward", "pre", pre, bias.Len())
}

// ActivationBackwardInPlace checks ActivationBackwardInPlace: dout and
// inp have the same Len.
func ActivationBackwardInPlace(dout, inp Shape) {
	sameLen2("ActivationBackwardInPlace", "dout", dout, "inp", inp)
}

// SoftmaxForward checks SoftmaxForward and returns the rows of inp
// (Tk elements each) and, when keyValid is given, the rows per batch item
// (0 otherwise).
func SoftmaxForward(out, inp Shape, scale float32, keyValid []int32) (rows, perItem int) {
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

// SoftmaxBackward checks SoftmaxBackward and returns the rows of out.
func SoftmaxBackward(dinp, dout, out Shape) (rows int) {
	sameLen3("SoftmaxBackward", "dinp", dinp, "dout", dout, "out", out)
	return rowsOf("SoftmaxBackward", "out", out, out.Cols())
}

// CrossEntropyRowMax checks CrossEntropyRowMax and returns N, the rows
// of logits.
func CrossEntropyRowMax(rowMax, logits Shape) (n int) {
	n = rowsOf("CrossEntropyRowMax", "logits", logits, logits.Cols())
	Len("CrossEntropyRowMax", "rowMax", rowMax, n)
	return n
}

// CrossEntropySumExp checks CrossEntropySumExp and returns N, the rows
// of logits.
func CrossEntropySumExp(sumExp, logits, rowMax Shape) (n int) {
	n = rowsOf("CrossEntropySumExp", "logits", logits, logits.Cols())
	Len("CrossEntropySumExp", "sumExp", sumExp, n)
	Len("CrossEntropySumExp", "rowMax", rowMax, n)
	return n
}

// CrossEntropyTargetLogit checks CrossEntropyTargetLogit and returns
// N, the rows of logits.
func CrossEntropyTargetLogit(out, logits Shape, targets []int32) (n int) {
	n = rowsOf("CrossEntropyTargetLogit", "logits", logits, logits.Cols())
	Len("CrossEntropyTargetLogit", "out", out, n)
	if len(targets) != n {
		panic(fmt.Sprintf("tensor.CrossEntropyTargetLogit: len(targets)=%d, logits %v has %d rows", len(targets), logits, n))
	}
	return n
}

// CrossEntropyLoss checks CrossEntropyLoss and returns N, the Len of
// losses.
func CrossEntropyLoss(losses, rowMax, sumExp, targetLogit Shape, targets []int32) (n int) {
	n = losses.Len()
	Len("CrossEntropyLoss", "rowMax", rowMax, n)
	Len("CrossEntropyLoss", "sumExp", sumExp, n)
	Len("CrossEntropyLoss", "targetLogit", targetLogit, n)
	if len(targets) != n {
		panic(fmt.Sprintf("tensor.CrossEntropyLoss: len(targets)=%d, losses %v has %d elements", len(targets), losses, n))
	}
	return n
}

// CrossEntropyBackward checks CrossEntropyBackward and returns N, the
// rows of logits.
func CrossEntropyBackward(dlogits, logits, rowMax, sumExp Shape, targets []int32) (n int) {
	sameLen2("CrossEntropyBackward", "dlogits", dlogits, "logits", logits)
	n = rowsOf("CrossEntropyBackward", "logits", logits, logits.Cols())
	Len("CrossEntropyBackward", "rowMax", rowMax, n)
	Len("CrossEntropyBackward", "sumExp", sumExp, n)
	if len(targets) != n {
		panic(fmt.Sprintf("tensor.CrossEntropyBackward: len(targets)=%d, logits %v has %d rows", len(targets), logits, n))
	}
	return n
}

// CrossEntropyForward checks CrossEntropyForward and returns N, the rows
// of logits.
func CrossEntropyForward(losses, rowMax, sumExp, logits Shape, targets []int32) (n int) {
	n = rowsOf("CrossEntropyForward", "logits", logits, logits.Cols())
	Len("CrossEntropyForward", "losses", losses, n)
	Len("CrossEntropyForward", "rowMax", rowMax, n)
	Len("CrossEntropyForward", "sumExp", sumExp, n)
	if len(targets) != n {
		panic(fmt.Sprintf("tensor.CrossEntropyForward: len(targets)=%d, logits %v has %d rows", len(targets), logits, n))
	}
	return n
}

// CrossEntropyBackwardInPlace checks CrossEntropyBackwardInPlace and
// returns N, the rows of logits.
func CrossEntropyBackwardInPlace(logits, rowMax, sumExp Shape, targets []int32, cols int) (n int) {
	n = rowsOf("CrossEntropyBackwardInPlace", "logits", logits, logits.Cols())
	Len("CrossEntropyBackwardInPlace", "rowMax", rowMax, n)
	Len("CrossEntropyBackwardInPlace", "sumExp", sumExp, n)
	if len(targets) != n {
		panic(fmt.Sprintf("tensor.CrossEntropyBackwardInPlace: len(targets)=%d, logits %v has %d rows", len(targets), logits, n))
	}
	if cols < 0 || cols > logits.Cols() {
		panic(fmt.Sprintf("tensor.CrossEntropyBackwardInPlace: cols %d outside [0,%d] of logits %v", cols, logits.Cols(), logits))
	}
	return n
}

// AdamW checks AdamW: the four tensors have the same Len and step (the
// AdamWParams' Step) counts from 1.
func AdamW(param, grad, m, v, half Shape, step int) {
	sameLen3("AdamW", "param", param, "grad", grad, "m", m)
	sameLen2("AdamW", "param", param, "v", v)
	if half != nil {
		sameLen2("AdamW", "param", param, "half", half)
	}
	if step < 1 {
		panic(fmt.Sprintf("tensor.AdamW: Step is %d, it counts from 1", step))
	}
}

// AdamWScale checks AdamW's scale tensor, when there is one: it has an
// element.
func AdamWScale(scale Shape) {
	if scale.Len() < 1 {
		panic(fmt.Sprintf("tensor.AdamW: scale %v is empty", scale))
	}
}

// --- helpers ---

// sameLen2 panics unless b has the Len of a.
func sameLen2(fn, na string, a Shape, nb string, b Shape) {
	if b.Len() != a.Len() {
		panic(fmt.Sprintf("tensor.%s: %s %v has %d elements, %s %v has %d", fn, nb, b, b.Len(), na, a, a.Len()))
	}
}

// sameLen3 panics unless b and c have the Len of a.
func sameLen3(fn, na string, a Shape, nb string, b Shape, nc string, c Shape) {
	sameLen2(fn, na, a, nb, b)
	sameLen2(fn, na, a, nc, c)
}

// Len panics unless t has n elements, with fn's message naming t.
func Len(fn, name string, t Shape, n int) {
	if t.Len() != n {
		panic(fmt.Sprintf("tensor.%s: %s %v has %d elements, want %d", fn, name, t, t.Len(), n))
	}
}

// rowsOf returns the row count of t for rows of length cols, panicking when
// t's Len is not a multiple of cols.
func rowsOf(fn, name string, t Shape, cols int) int {
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
func checkBlock(fn, name string, t Shape, off, ld, rows, cols int) (empty bool) {
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

// operandLen is the number of elements of GEMM operand t from offset off on.
func operandLen(fn, name string, t Shape, off int) int {
	if off < 0 || off > t.Len() {
		panic(fmt.Sprintf("tensor.%s: offset %d of %s is outside its %d elements", fn, off, name, t.Len()))
	}
	return t.Len() - off
}

// gemmPanic panics with fn's one-line GEMM argument message.
func gemmPanic(fn, format string, args ...any) {
	panic(fmt.Sprintf("tensor.%s: %s", fn, fmt.Sprintf(format, args...)))
}

// GemmLayout checks the layout of a GEMM routine fn (Sgemm,
// SgemmStridedBatched, a peer's Sgemm on slices) and panics with a one-line
// message that names the bad argument; lenX are the elements of operand X from its first
// matrix on, and batch is 1 for a single product.
func GemmLayout(fn string, transA, transB bool, m, n, k int, lenA, lda, strideA, lenB, ldb, strideB, lenC, ldc, strideC, batch int) {
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

// RMSNormForward checks RMSNormForward and returns N, the rows of inp.
func RMSNormForward(out, rstd, inp, weight Shape) (n int) {
	c := weight.Len()
	n = rowsOf("RMSNormForward", "inp", inp, c)
	Len("RMSNormForward", "out", out, inp.Len())
	Len("RMSNormForward", "rstd", rstd, n)
	return n
}

// RMSNormBackward checks RMSNormBackward and returns N, the rows of inp.
func RMSNormBackward(dinp, dweight, dout, inp, weight, rstd Shape) (n int) {
	c := weight.Len()
	Len("RMSNormBackward", "dweight", dweight, c)
	n = rowsOf("RMSNormBackward", "inp", inp, c)
	Len("RMSNormBackward", "dinp", dinp, inp.Len())
	Len("RMSNormBackward", "dout", dout, inp.Len())
	Len("RMSNormBackward", "rstd", rstd, n)
	return n
}

// RoPE checks RoPEForward and RoPEBackward (fn names which): x's rows are
// whole heads of the table's width hd (even), seqLen divides the rows and
// the table has seqLen positions, and 0 <= rotated <= period. It returns
// the rows of x and the heads of a row.
func RoPE(fn string, x, table Shape, seqLen, period, rotated int) (rows, heads int) {
	hd := table.Cols()
	if hd < 2 || hd%2 != 0 {
		panic(fmt.Sprintf("tensor.%s: table %v: heads of %d channels, want an even number", fn, table, hd))
	}
	if period < 1 || rotated < 0 || rotated > period {
		panic(fmt.Sprintf("tensor.%s: %d rotated heads of every %d", fn, rotated, period))
	}
	w := x.Cols()
	if w%hd != 0 || (w/hd)%period != 0 {
		panic(fmt.Sprintf("tensor.%s: x %v: rows of %d are not groups of %d heads of %d", fn, x, w, period, hd))
	}
	rows = rowsOf(fn, "x", x, w)
	if seqLen < 1 || rows%seqLen != 0 {
		panic(fmt.Sprintf("tensor.%s: x %v has %d rows, not sequences of %d", fn, x, rows, seqLen))
	}
	if table.Len() < seqLen*hd {
		panic(fmt.Sprintf("tensor.%s: table %v has fewer than %d positions", fn, table, seqLen))
	}
	return rows, w / hd
}

// SwiGLUForward checks SwiGLUForward and returns N and F: out is (N,F),
// inp (N,2F).
func SwiGLUForward(out, inp Shape) (n, f int) {
	f = out.Cols()
	n = rowsOf("SwiGLUForward", "out", out, f)
	Len("SwiGLUForward", "inp", inp, 2*out.Len())
	return n, f
}

// SwiGLUBackward checks SwiGLUBackward and returns N and F: dinp and inp
// are (N,2F), dout (N,F).
func SwiGLUBackward(dinp, inp, dout Shape) (n, f int) {
	f = dout.Cols()
	n = rowsOf("SwiGLUBackward", "dout", dout, f)
	Len("SwiGLUBackward", "inp", inp, 2*dout.Len())
	Len("SwiGLUBackward", "dinp", dinp, 2*dout.Len())
	return n, f
}

// ResidualSum panics unless a residual add's sum, stored as sum, can take
// its input a, stored as a: a half (bfloat16) a needs a half sum; a wider
// a goes into either.
func ResidualSum[T comparable](fn string, a, sum, half T) {
	if a == half && sum != half {
		panic(fmt.Sprintf("tensor.%s: a is %v but sum is %v: a %v residual input needs a %v sum", fn, a, sum, half, half))
	}
}

// SameDType panics unless two operands of fn, named aName and bName, store
// the same dtype (a and b).
func SameDType[T comparable](fn, aName string, a T, bName string, b T) {
	if a != b {
		panic(fmt.Sprintf("tensor.%s: %s stores %v and %s %v; they must store one dtype", fn, aName, a, bName, b))
	}
}
