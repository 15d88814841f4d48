package parallel

import (
	"fmt"
	"testing"

	"github.com/hpcrun/hpcrun/nccl"
	"github.com/hpcrun/hpcrun/tensor"
)

// stagedDevice is a device whose tensors are not host memory (as a GPU's
// are not): its buffers live beside the CPU's, reached only through
// copies, so that parallel.Group must stage them through the host.
type stagedDevice struct {
	*tensor.CPUDevice
	mem map[*tensor.Buffer][]float32
}

func newStaged() *stagedDevice {
	return &stagedDevice{CPUDevice: tensor.NewCPU(), mem: map[*tensor.Buffer][]float32{}}
}

func (d *stagedDevice) AllocAs(dt tensor.DType, shape ...int) (*tensor.Tensor, error) {
	if dt != tensor.Float32 {
		return nil, fmt.Errorf("staged device: %s: float32 only", dt)
	}
	return d.Alloc(shape...)
}

func (d *stagedDevice) Alloc(shape ...int) (*tensor.Tensor, error) {
	n := 1
	for _, s := range shape {
		n *= s
	}
	b := tensor.NewBuffer(d, n, nil, 0)
	d.mem[b] = make([]float32, n)
	return tensor.NewTensor(b, 0, shape...), nil
}

func (d *stagedDevice) at(t *tensor.Tensor) []float32 {
	return d.mem[t.Buffer()][t.Offset() : t.Offset()+t.Len()]
}

func (d *stagedDevice) CopyToHost(dst []float32, src *tensor.Tensor)   { copy(dst, d.at(src)) }
func (d *stagedDevice) CopyFromHost(dst *tensor.Tensor, src []float32) { copy(d.at(dst), src) }
func (d *stagedDevice) Copy(dst, src *tensor.Tensor)                   { copy(d.at(dst), d.at(src)) }
func (d *stagedDevice) Copy2D(dst *tensor.Tensor, dstOff, ldDst int, src *tensor.Tensor, srcOff, ldSrc, rows, cols int) {
	to, from := d.mem[dst.Buffer()][dst.Offset():], d.mem[src.Buffer()][src.Offset():]
	for i := range rows {
		copy(to[dstOff+i*ldDst:dstOff+i*ldDst+cols], from[srcOff+i*ldSrc:srcOff+i*ldSrc+cols])
	}
}

// Every Group operation, on host memory and staged, out of place and in
// place (NCCL's layouts), gives what the definition says on 3 ranks.
func TestGroupOperations(t *testing.T) {
	for _, kind := range []string{"host", "staged"} {
		err := nccl.RunInProcess(3, func(c nccl.Comm) error {
			var dev tensor.Device = tensor.NewCPU()
			if kind == "staged" {
				dev = newStaged()
			}
			g, r := NewDeviceGroup(c, dev), float32(c.Rank())
			put := func(v ...float32) *tensor.Tensor {
				x, _ := dev.Alloc(len(v))
				dev.CopyFromHost(x, v)
				return x
			}
			get := func(x *tensor.Tensor) []float32 {
				v := make([]float32, x.Len())
				dev.CopyToHost(v, x)
				return v
			}
			check := func(what string, got, want []float32) {
				if !equal(got, want) {
					t.Errorf("%s rank %d %s: %v, want %v", kind, c.Rank(), what, got, want)
				}
			}
			x := put(1, r, 2*r)
			if err := g.AllReduce(x, nccl.Sum); err != nil {
				return err
			}
			check("all-reduce", get(x), []float32{3, 3, 6})
			out := put(0, 0, 0, 0, 0, 0)
			if err := g.AllGather(out, put(r, -r)); err != nil {
				return err
			}
			check("all-gather", get(out), []float32{0, 0, 1, -1, 2, -2})
			in := put(0, 0, 0, 0, 0, 0)
			dev.CopyFromHost(in.View(2*c.Rank(), 2), []float32{r, -r})
			if err := g.AllGather(in, in.View(2*c.Rank(), 2)); err != nil {
				return err
			}
			check("all-gather in place", get(in), []float32{0, 0, 1, -1, 2, -2})
			s, rs := put(1, 2, 3, 4, 5, 6), put(0, 0)
			if err := g.ReduceScatter(rs, s, nccl.Sum); err != nil {
				return err
			}
			k := float32(2 * c.Rank())
			check("reduce-scatter", get(rs), []float32{3 * (k + 1), 3 * (k + 2)})
			if err := g.ReduceScatter(s.View(2*c.Rank(), 2), s, nccl.Avg); err != nil {
				return err
			}
			check("reduce-scatter in place", get(s.View(2*c.Rank(), 2)), []float32{k + 1, k + 2})
			b := put(r, r)
			if err := g.Broadcast(b, 2); err != nil {
				return err
			}
			check("broadcast", get(b), []float32{2, 2})
			cols, scratch := put(0, 0, 0, 0, 0, 0), put(0, 0, 0, 0, 0, 0)
			if err := g.AllGatherCols(cols.Reshape(2, 3), put(r, 10+r).Reshape(2, 1), scratch); err != nil {
				return err
			}
			check("all-gather columns", get(cols), []float32{0, 1, 2, 10, 11, 12})
			// A ring of exchanges: each rank trades with the next.
			next, prev := (c.Rank()+1)%3, (c.Rank()+2)%3
			if c.Rank()%2 == 0 {
				if err := g.Send(put(r), next); err != nil {
					return err
				}
			}
			got := put(-1)
			if c.Rank()%2 == 1 || c.Rank() == 0 {
				if err := g.Recv(got, prev); err != nil {
					return err
				}
				check("recv", get(got), []float32{float32(prev)})
			}
			if c.Rank() == 1 {
				if err := g.Send(put(r), next); err != nil {
					return err
				}
			}
			if c.Rank() == 2 {
				if err := g.Recv(got, prev); err != nil {
					return err
				}
				check("recv", get(got), []float32{float32(prev)})
			}
			if c.Rank() < 2 {
				peer := 1 - c.Rank()
				got := put(-1, -1)
				if err := g.SendRecv(put(r, r), got, peer); err != nil {
					return err
				}
				check(fmt.Sprint("exchange with ", peer), get(got), []float32{float32(peer), float32(peer)})
			}
			return nil
		})
		if err != nil {
			t.Fatal(kind, err)
		}
	}
	// A group of one copies where a larger group would gather.
	dev := tensor.NewCPU()
	x, _ := dev.Alloc(4)
	dev.CopyFromHost(x, []float32{0, 0, 7, 8})
	if err := (*Group)(nil).AllGather(x.View(0, 2), x.View(2, 2)); err != nil || !equal(x.Host(), []float32{7, 8, 7, 8}) {
		t.Errorf("size-1 all-gather of another view: %v, %v", x.Host(), err)
	}
}

// A bfloat16 all-gather through the host collectives moves every
// element's bits (an odd count a rank, padded on the wire; a NaN payload
// kept), out of place and in place, at 2 bytes an element (rounded up to
// a whole float32 word a rank) where float32 would take 4.
func TestGroupAllGatherBF16(t *testing.T) {
	const n, ranks = 5, 3
	err := nccl.RunInProcess(ranks, func(c nccl.Comm) error {
		dev := tensor.NewCPU()
		g := NewDeviceGroup(c, dev)
		value := func(r, i int) uint16 { return uint16(0x3f80 + 17*r + i) }
		in, _ := dev.AllocAs(tensor.BFloat16, n)
		for i := range n {
			in.HostBF16()[i] = value(c.Rank(), i)
		}
		in.HostBF16()[n-1] = 0x7fc1 + uint16(c.Rank()) // NaNs with payloads
		want := func(r, i int) uint16 {
			if i == n-1 {
				return 0x7fc1 + uint16(r)
			}
			return value(r, i)
		}
		out, _ := dev.AllocAs(tensor.BFloat16, ranks*n)
		before := c.Stats().AllGather.Bytes
		if err := g.AllGather(out, in); err != nil {
			return err
		}
		if got := c.Stats().AllGather.Bytes - before; got != ranks*(n+1)*2 {
			t.Errorf("rank %d: the all-gather moved %d bytes, want %d (2 an element, padded)", c.Rank(), got, ranks*(n+1)*2)
		}
		inPlace, _ := dev.AllocAs(tensor.BFloat16, ranks*n)
		mine := inPlace.View(c.Rank()*n, n)
		dev.Copy(mine, in)
		if err := g.AllGather(inPlace, mine); err != nil {
			return err
		}
		for _, res := range []*tensor.Tensor{out, inPlace} {
			for r := range ranks {
				for i := range n {
					if got := res.HostBF16()[r*n+i]; got != want(r, i) {
						t.Errorf("rank %d: element %d of rank %d is %#x, want %#x", c.Rank(), i, r, got, want(r, i))
					}
				}
			}
		}
		f, _ := dev.Alloc(n)
		if err := g.AllGather(out, f); err == nil {
			t.Errorf("rank %d: a float32 tensor gathered into a bfloat16 one: no error", c.Rank())
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestGroupAllReduceBF16: a bfloat16 all-reduce through the host
// collectives sums in rank order with every step rounded to bfloat16
// (averages: each term scaled by 1/n first, as NCCL's), carries 2 bytes
// an element (padded to an even count), and refuses a reduction other
// than sum or average.
// TestGroupReduceScatterBF16 reduce-scatters bfloat16 tensors of odd
// blocks (each block packed from a word of its own) on in-process ranks:
// each rank's block is the rank-order sum rounded at every step (the
// average's terms scaled by 1/n and rounded first), from the definition,
// in place too; 2 bytes an element move (an odd block padded); Max and a
// float32 out are refused.
func TestGroupReduceScatterBF16(t *testing.T) {
	const n, ranks = 5, 3 // elements a block
	err := nccl.RunInProcess(ranks, func(c nccl.Comm) error {
		dev := tensor.NewCPU()
		g := NewDeviceGroup(c, dev)
		// Element i of rank r: 1 + r*2^-8 (ties between bfloat16
		// neighbours, so the rounded sum differs from the exact one)
		// scaled by i%7+1 and rounded, different in every block.
		round := func(f float32) float32 { return tensor.Float32FromBF16(tensor.BF16FromFloat32(f)) }
		value := func(r, i int) float32 { return round((1 + float32(r)/256) * float32(i%7+1)) }
		host := make([]float32, ranks*n)
		for i := range host {
			host[i] = value(c.Rank(), i)
		}
		want := func(i int, scale float32) float32 {
			acc := round(value(0, i) * scale)
			for r := 1; r < ranks; r++ {
				acc = round(acc + round(value(r, i)*scale))
			}
			return acc
		}
		in, _ := dev.AllocAs(tensor.BFloat16, ranks*n)
		out, _ := dev.AllocAs(tensor.BFloat16, n)
		mine := in.View(c.Rank()*n, n)
		for _, tc := range []struct {
			op    nccl.Op
			scale float32
			out   *tensor.Tensor
		}{{nccl.Sum, 1, out}, {nccl.Avg, float32(1.0 / ranks), out}, {nccl.Sum, 1, mine}} {
			dev.CopyFromHost(in, host)
			before := c.Stats().ReduceScatter.Bytes
			if err := g.ReduceScatter(tc.out, in, tc.op); err != nil {
				return err
			}
			if got := c.Stats().ReduceScatter.Bytes - before; got != (n+1)*2 {
				t.Errorf("rank %d: the reduce-scatter moved %d bytes, want %d (2 an element, padded)", c.Rank(), got, (n+1)*2)
			}
			got := make([]float32, n)
			dev.CopyToHost(got, tc.out)
			for i := range got {
				if w := want(c.Rank()*n+i, tc.scale); got[i] != w {
					t.Errorf("rank %d, %v (in place %v): element %d is %v, want %v", c.Rank(), tc.op, tc.out == mine, i, got[i], w)
				}
			}
		}
		if err := g.ReduceScatter(out, in, nccl.Max); err == nil {
			t.Errorf("rank %d: a bfloat16 max reduce-scatter: no error", c.Rank())
		}
		wide, _ := dev.Alloc(n)
		if err := g.ReduceScatter(wide, in, nccl.Sum); err == nil {
			t.Errorf("rank %d: a bfloat16 reduce-scatter into a float32 tensor: no error", c.Rank())
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

func TestGroupAllReduceBF16(t *testing.T) {
	const n, ranks = 5, 3
	err := nccl.RunInProcess(ranks, func(c nccl.Comm) error {
		dev := tensor.NewCPU()
		g := NewDeviceGroup(c, dev)
		// Rank r holds 1 + r*2^-8 at every element but the last, which holds
		// r: 1 + 2^-8 is a tie between bfloat16 neighbours of 1 (rounds to
		// 1, even), so the rounded sum in rank order differs from the exact.
		value := func(r, i int) float32 {
			if i == n-1 {
				return float32(r)
			}
			return 1 + float32(r)/256
		}
		host := make([]float32, n)
		for i := range host {
			host[i] = value(c.Rank(), i)
		}
		x, _ := dev.AllocAs(tensor.BFloat16, n)
		dev.CopyFromHost(x, host)
		before := c.Stats().AllReduce.Bytes
		if err := g.AllReduce(x, nccl.Sum); err != nil {
			return err
		}
		if got := c.Stats().AllReduce.Bytes - before; got != (n+1)*2 {
			t.Errorf("rank %d: the all-reduce moved %d bytes, want %d (2 an element, padded)", c.Rank(), got, (n+1)*2)
		}
		// From the definition: acc = round(acc + x_r), r = 1, 2.
		round := func(f float32) float32 { return tensor.Float32FromBF16(tensor.BF16FromFloat32(f)) }
		want := func(i int) float32 {
			acc := value(0, i)
			for r := 1; r < ranks; r++ {
				acc = round(acc + value(r, i))
			}
			return acc
		}
		got := make([]float32, n)
		dev.CopyToHost(got, x)
		for i := range got {
			if got[i] != want(i) {
				t.Errorf("rank %d: element %d is %v, want %v", c.Rank(), i, got[i], want(i))
			}
		}
		if got[0] == 1+1.0+1+3.0/256 {
			t.Errorf("rank %d: the sum was not rounded at each step", c.Rank())
		}
		dev.CopyFromHost(x, host)
		if err := g.AllReduce(x, nccl.Avg); err != nil {
			return err
		}
		dev.CopyToHost(got, x)
		// NCCL's average of floating types: each term scaled by 1/n and
		// rounded, then the rounded sum.
		avg := func(i int) float32 {
			third := float32(1.0 / ranks)
			acc := round(value(0, i) * third)
			for r := 1; r < ranks; r++ {
				acc = round(acc + round(value(r, i)*third))
			}
			return acc
		}
		for i := range got {
			if got[i] != avg(i) {
				t.Errorf("rank %d: the average's element %d is %v, want %v", c.Rank(), i, got[i], avg(i))
			}
		}
		if err := g.AllReduce(x, nccl.Max); err == nil {
			t.Errorf("rank %d: a bfloat16 max: no error", c.Rank())
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// A bfloat16 tensor goes point to point as bfloat16 through the host
// links (two a word, an odd count padded): Send and Recv move every
// element's bits (a NaN payload kept) at 2 bytes an element, and an
// exchange may carry bfloat16 one way and float32 the other (a pipeline
// stage's activations and gradients).
func TestGroupSendRecvBF16(t *testing.T) {
	const n = 5
	err := nccl.RunInProcess(2, func(c nccl.Comm) error {
		dev := tensor.NewCPU()
		g := NewDeviceGroup(c, dev)
		value := func(i int) uint16 { return uint16(0x3f80 + 7*i) }
		h, _ := dev.AllocAs(tensor.BFloat16, n)
		f, _ := dev.Alloc(n)
		peer := 1 - c.Rank()
		check := func(what string) {
			for i := range n {
				want := value(i)
				if i == n-1 {
					want = 0x7fc3
				}
				if got := h.HostBF16()[i]; got != want {
					t.Errorf("rank %d, %s: element %d is %#x, want %#x", c.Rank(), what, i, got, want)
				}
			}
		}
		before := c.Stats().Send.Bytes
		if c.Rank() == 0 {
			for i := range n {
				h.HostBF16()[i] = value(i)
			}
			h.HostBF16()[n-1] = 0x7fc3
			if err := g.Send(h, peer); err != nil {
				return err
			}
			if got := c.Stats().Send.Bytes - before; got != (n+1)*2 {
				t.Errorf("the send moved %d bytes, want %d (2 an element, padded)", got, (n+1)*2)
			}
		} else {
			if err := g.Recv(h, peer); err != nil {
				return err
			}
			check("Recv")
		}
		// The exchange: rank 0 sends bfloat16 and receives float32, rank
		// 1 the other way round.
		send, recv := h, f
		if c.Rank() == 1 {
			for i := range n {
				f.Host()[i] = float32(i) + 0.5
			}
			send, recv = f, h
			clear(h.HostBF16())
		}
		if err := g.SendRecv(send, recv, peer); err != nil {
			return err
		}
		if c.Rank() == 1 {
			check("SendRecv")
		} else {
			for i := range n {
				if got := f.Host()[i]; got != float32(i)+0.5 {
					t.Errorf("rank 0, SendRecv: float32 element %d is %g, want %g", i, got, float32(i)+0.5)
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
