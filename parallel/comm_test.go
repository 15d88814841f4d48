package parallel

import (
	"math/rand/v2"
	"testing"

	"github.com/hpcrun/hpcrun/nccl"
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

// failingDeviceComm is an NCCL-like communicator whose device collectives
// must not be reached with host tensors.
type failingDeviceComm struct {
	nccl.Comm
	t *testing.T
}

func (f failingDeviceComm) AllReduceDevice(_, _ uintptr, _ int, _ nccl.DataType, _ nccl.Op, _ uintptr) error {
	f.t.Error("AllReduceDevice called for host tensors")
	return nil
}

func (f failingDeviceComm) AllGatherDevice(_, _ uintptr, _ int, _ nccl.DataType, _ uintptr) error {
	f.t.Error("AllGatherDevice called for host tensors")
	return nil
}

func (f failingDeviceComm) ReduceScatterDevice(_, _ uintptr, _ int, _ nccl.DataType, _ nccl.Op, _ uintptr) error {
	f.t.Error("ReduceScatterDevice called for host tensors")
	return nil
}

func (f failingDeviceComm) BroadcastDevice(_, _ uintptr, _ int, _ nccl.DataType, _ int, _ uintptr) error {
	f.t.Error("BroadcastDevice called for host tensors")
	return nil
}

func (f failingDeviceComm) SendDevice(_ uintptr, _ int, _ nccl.DataType, _ int, _ uintptr) error {
	f.t.Error("SendDevice called for host tensors")
	return nil
}

func (f failingDeviceComm) RecvDevice(_ uintptr, _ int, _ nccl.DataType, _ int, _ uintptr) error {
	f.t.Error("RecvDevice called for host tensors")
	return nil
}

func (f failingDeviceComm) SendRecvDevice(_, _ uintptr, _ int, _, _ nccl.DataType, _ int, _ uintptr) error {
	f.t.Error("SendRecvDevice called for host tensors")
	return nil
}

var _ nccl.DeviceComm = failingDeviceComm{}

// The device path is taken only for tensors in device memory on a streamed
// device: with an NCCL group and CPU tensors the collectives run on the
// host and still reduce.
func TestGroupDevicePathNeedsDeviceMemory(t *testing.T) {
	err := nccl.RunInProcess(2, func(c nccl.Comm) error {
		g := NewGroup(failingDeviceComm{c, t})
		dev := tensor.NewCPU()
		x, _ := dev.Alloc(3)
		dev.CopyFromHost(x, []float32{1, 2, float32(c.Rank())})
		if _, _, ok := g.onDevice(x); ok {
			t.Error("onDevice accepts a CPU tensor")
		}
		if err := g.AllReduce(x, nccl.Sum); err != nil {
			return err
		}
		if got := download(x); !equal(got, []float32{2, 4, 1}) {
			t.Errorf("rank %d: all-reduce gave %v", c.Rank(), got)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// Sequence parallelism on CPU tensors with an NCCL-type group takes the
// host path too: the sequence-parallel block check passes and no device
// collective is called.
func TestSequenceParallelHostPathWithDeviceComm(t *testing.T) {
	err := nccl.RunInProcess(2, func(c nccl.Comm) error {
		dev := tensor.NewCPU()
		for _, name := range []string{"BlockSP", "VocabParallelEmbeddingSP"} {
			cks, err := FindChecks(name)
			if err != nil {
				return err
			}
			r, err := cks[0].Run(dev, failingDeviceComm{c, t})
			if err != nil {
				return err
			}
			if !r.Pass() {
				t.Errorf("%s over a DeviceComm: %s max error %g", name, r.Fail, r.MaxErr())
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
