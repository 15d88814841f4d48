package tensor

import "fmt"

// Helpers built from Device calls: the same on every backend.

// MatMul computes c = alpha*op(a)*op(b) + beta*c on whole tensors seen as
// matrices (leading dimensions flattened into rows, the last dimension is the
// columns): op(a) is (m,k), op(b) is (k,n), c is (m,n).
func MatMul(c, a, b *Tensor, transA, transB bool, alpha, beta float32) {
	m, k := a.Rows(), a.Cols()
	if transA {
		m, k = k, m
	}
	kb, n := b.Rows(), b.Cols()
	if transB {
		kb, n = n, kb
	}
	if kb != k || c.Rows() != m || c.Cols() != n {
		panic(fmt.Sprintf("tensor.MatMul: op(a) is (%d,%d), op(b) is (%d,%d), c %v is (%d,%d)", m, k, kb, n, c, c.Rows(), c.Cols()))
	}
	c.Device().Gemm(transA, transB, m, n, k, alpha, a, 0, a.Cols(), b, 0, b.Cols(), beta, c, 0, c.Cols())
}

// LinearForward is out = inp @ weight^T + bias (bias may be nil), the layout
// of PyTorch's nn.Linear and llm.c's matmul_forward.
// out is (N,OC), inp is (N,C), weight is (OC,C), bias is (OC).
func LinearForward(out, inp, weight, bias *Tensor) {
	MatMul(out, inp, weight, false, true, 1, 0)
	if bias != nil {
		out.Device().AddBias(out, bias)
	}
}

// LinearBackward accumulates the gradients of LinearForward:
// dinp += dout @ weight, dweight += dout^T @ inp, dbias += column sums of
// dout. dinp and dbias may be nil when not needed.
// dout is (N,OC), inp and dinp are (N,C), weight and dweight are (OC,C).
func LinearBackward(dinp, dweight, dbias, dout, inp, weight *Tensor) {
	if dinp != nil {
		MatMul(dinp, dout, weight, false, false, 1, 1)
	}
	MatMul(dweight, dout, inp, true, false, 1, 1)
	if dbias != nil {
		dout.Device().BiasBackward(dbias, dout)
	}
}

// CrossEntropy runs the cross-entropy pieces in turn for an unsharded
// vocabulary: losses[i] = -log softmax(logits[i])[targets[i]], 0 where
// targets[i] < 0, keeping rowMax and sumExp for CrossEntropyBackward.
// logits is (N,V); losses, rowMax, sumExp, targetLogit are (N).
func CrossEntropy(losses, rowMax, sumExp, targetLogit, logits *Tensor, targets []int32) {
	d := logits.Device()
	d.CrossEntropyRowMax(rowMax, logits)
	d.CrossEntropySumExp(sumExp, logits, rowMax)
	d.CrossEntropyTargetLogit(targetLogit, logits, targets, 0)
	d.CrossEntropyLoss(losses, rowMax, sumExp, targetLogit, targets)
}
