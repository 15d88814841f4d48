package parallel

import (
	"math/rand/v2"
	"testing"

	"github.com/hpcrun/hpcrun/tensor"
)

// identityCols is the former column copy of devices without host memory:
// a GEMM of src's columns with a (cols, cols) identity matrix.
func identityCols(dev tensor.Device, dst *tensor.Tensor, dstCol int, src *tensor.Tensor, srcCol, cols int) {
	eye, _ := dev.Alloc(cols, cols)
	defer dev.Free(eye)
	one := make([]float32, cols*cols)
	for i := 0; i < cols; i++ {
		one[i*cols+i] = 1
	}
	dev.CopyFromHost(eye, one)
	dev.Gemm(false, false, src.Rows(), cols, cols, 1, src, srcCol, src.Cols(), eye, 0, cols, 0, dst, dstCol, dst.Cols())
}

func randTensor(t *testing.T, dev tensor.Device, r *rand.Rand, shape ...int) *tensor.Tensor {
	t.Helper()
	x, err := dev.Alloc(shape...)
	if err != nil {
		t.Fatal(err)
	}
	v := make([]float32, x.Len())
	for i := range v {
		v[i] = float32(r.NormFloat64())
	}
	dev.CopyFromHost(x, v)
	return x
}

// copyCols and addCols (strided Copy2D / Axpy2D) give exactly what the
// identity GEMM gave, and allocate nothing.
func TestColumnCopiesMatchIdentityGemm(t *testing.T) {
	dev := tensor.NewCPU()
	r := rand.New(rand.NewPCG(1, 2))
	for _, c := range []struct{ rows, srcCols, dstCols, srcCol, dstCol, cols int }{
		{1, 4, 4, 0, 0, 4}, {7, 12, 5, 4, 1, 3}, {33, 96, 32, 64, 0, 32}, {5, 8, 20, 0, 12, 8},
	} {
		src := randTensor(t, dev, r, c.rows, c.srcCols)
		want, got := randTensor(t, dev, r, c.rows, c.dstCols), randTensor(t, dev, r, c.rows, c.dstCols)
		dev.Copy(got, want)
		identityCols(dev, want, c.dstCol, src, c.srcCol, c.cols)
		before := dev.MemStats().Current
		copyCols(got, c.dstCol, src, c.srcCol, c.cols)
		if after := dev.MemStats().Current; after != before {
			t.Errorf("%+v: copyCols allocated %d bytes", c, after-before)
		}
		if w, g := download(want), download(got); !equal(w, g) {
			t.Errorf("%+v: copyCols differs from the identity GEMM", c)
		}

		// addCols: din (rows, cols) += columns [srcCol, srcCol+cols) of src.
		din := randTensor(t, dev, r, c.rows, c.cols)
		tmp, _ := dev.Alloc(c.rows, c.cols)
		identityCols(dev, tmp, 0, src, c.srcCol, c.cols)
		wantAdd := download(din)
		for i, v := range download(tmp) {
			wantAdd[i] += v
		}
		if err := addCols(din, src, c.srcCol); err != nil {
			t.Fatal(err)
		}
		if g := download(din); !equal(wantAdd, g) {
			t.Errorf("%+v: addCols differs from the identity GEMM plus Axpy", c)
		}
	}
	if err := addCols(randTensor(t, dev, r, 2, 3), randTensor(t, dev, r, 2, 4), 2); err == nil {
		t.Error("addCols past the last column accepted")
	}
}

func equal(a, b []float32) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
