package train

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"unsafe"

	"github.com/hpcrun/hpcrun/nccl"
	"github.com/hpcrun/hpcrun/tensor"
	"github.com/hpcrun/hpcrun/train/config"
	"github.com/hpcrun/hpcrun/train/data"
)

// A simulated device for the device-resident paths: CPU tensors with
// device addresses and a communicator that runs NCCL's device calls on
// the host communicator, so that the code that drives NCCL on a GPU runs
// (and fails) in CPU tests.

// deviceMemory gives CPU tensors device addresses (the address of their
// host storage) and resolves an address back to the storage, so that
// addressedComm can run the device collectives of NCCL on the host.
type deviceMemory struct {
	mu   sync.Mutex
	bufs map[uintptr][]float32
	// sends counts the device point-to-point sends (SendDevice and the
	// send of each SendRecvDevice), exchanges the SendRecvDevice calls.
	sends, exchanges atomic.Int64
}

// at is the n floats at device address p.
func (m *deviceMemory) at(p uintptr, n int) []float32 {
	if n == 0 {
		return nil
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	for base, b := range m.bufs {
		if p >= base && p+uintptr(4*n) <= base+uintptr(4*len(b)) {
			i := int(p-base) / 4
			return b[i : i+n]
		}
	}
	panic(fmt.Sprintf("device address %#x (+%d floats) is in no live buffer", p, n))
}

// addressedDevice is the GPU step's host device (hostScalars) whose
// tensors have device addresses: what the device-resident ZeRO-1 needs of
// the CUDA device, run on the CPU.
type addressedDevice struct {
	*hostScalars
	mem *deviceMemory
}

// Stream makes it a streamed device: a group with a device communicator
// runs its collectives on device addresses (parallel.Group.Resident).
func (d *addressedDevice) Stream() uintptr { return 0 }

func (d *addressedDevice) Alloc(shape ...int) (*tensor.Tensor, error) {
	return d.AllocAs(tensor.Float32, shape...)
}

// AllocAs gives float32 tensors device addresses; the collectives carry
// float32 only, so a bfloat16 tensor needs none.
func (d *addressedDevice) AllocAs(dt tensor.DType, shape ...int) (*tensor.Tensor, error) {
	t, err := d.hostScalars.AllocAs(dt, shape...)
	if err != nil || t.Len() == 0 || dt != tensor.Float32 {
		return t, err
	}
	host := t.Host()
	p := uintptr(unsafe.Pointer(&host[0]))
	d.mem.mu.Lock()
	d.mem.bufs[p] = host
	d.mem.mu.Unlock()
	return tensor.NewTensor(tensor.NewBuffer(d.CPUDevice, len(host), host, p), 0, shape...), nil
}

func (d *addressedDevice) Free(t *tensor.Tensor) {
	d.mem.mu.Lock()
	delete(d.mem.bufs, t.Buffer().Ptr())
	d.mem.mu.Unlock()
	d.CPUDevice.Free(t)
}

// addressedComm is an NCCL-like communicator whose device collectives run
// on the host communicator over deviceMemory; device counts them.
type addressedComm struct {
	nccl.Comm
	mem    *deviceMemory
	device *atomic.Int64
}

func (c *addressedComm) read(p uintptr, n int, dt nccl.DataType) ([]float32, error) {
	c.device.Add(1)
	if dt != nccl.Float32 {
		return nil, fmt.Errorf("data type %d: float32 only", dt)
	}
	return append([]float32(nil), c.mem.at(p, n)...), nil
}

func (c *addressedComm) AllReduceDevice(send, recv uintptr, count int, dt nccl.DataType, op nccl.Op, _ uintptr) error {
	buf, err := c.read(send, count, dt)
	if err != nil {
		return err
	}
	if err := c.AllReduce(buf, op); err != nil {
		return err
	}
	copy(c.mem.at(recv, count), buf)
	return nil
}

func (c *addressedComm) AllGatherDevice(send, recv uintptr, n int, dt nccl.DataType, _ uintptr) error {
	buf, err := c.read(send, n, dt)
	if err != nil {
		return err
	}
	return c.AllGather(buf, c.mem.at(recv, n*c.Size()))
}

func (c *addressedComm) ReduceScatterDevice(send, recv uintptr, n int, dt nccl.DataType, op nccl.Op, _ uintptr) error {
	buf, err := c.read(send, n*c.Size(), dt)
	if err != nil {
		return err
	}
	return c.ReduceScatter(buf, c.mem.at(recv, n), op)
}

func (c *addressedComm) BroadcastDevice(send, recv uintptr, count int, dt nccl.DataType, root int, _ uintptr) error {
	buf, err := c.read(send, count, dt)
	if err != nil {
		return err
	}
	if err := c.Broadcast(buf, root); err != nil {
		return err
	}
	copy(c.mem.at(recv, count), buf)
	return nil
}

// The point-to-point transfers keep NCCL's rule that a send returns only
// once the peer has received (the host Send returns at once): the
// receiver acknowledges each message, and the sender waits for that. Two
// ranks that both send alone to each other then fail (each takes the
// other's message for its acknowledgement) instead of passing where NCCL
// would hang.
var ack = []float32{1}

func (c *addressedComm) SendDevice(p uintptr, count int, dt nccl.DataType, peer int, _ uintptr) error {
	buf, err := c.read(p, count, dt)
	if err != nil {
		return err
	}
	c.mem.sends.Add(1)
	if err := c.Send(buf, peer); err != nil {
		return err
	}
	return c.Recv(make([]float32, 1), peer)
}

func (c *addressedComm) RecvDevice(p uintptr, count int, dt nccl.DataType, peer int, _ uintptr) error {
	c.device.Add(1)
	if err := c.Recv(c.mem.at(p, count), peer); err != nil {
		return err
	}
	return c.Send(ack, peer)
}

// SendRecvDevice is one NCCL group: the send and the receive both run
// before either waits.
func (c *addressedComm) SendRecvDevice(send, recv uintptr, count int, sendType, recvType nccl.DataType, peer int, _ uintptr) error {
	buf, err := c.read(send, count, sendType)
	if err != nil {
		return err
	}
	if recvType != nccl.Float32 {
		return fmt.Errorf("data type %d: float32 only", recvType)
	}
	c.mem.sends.Add(1)
	c.mem.exchanges.Add(1)
	if err := c.Send(buf, peer); err != nil {
		return err
	}
	if err := c.Recv(c.mem.at(recv, count), peer); err != nil {
		return err
	}
	if err := c.Send(ack, peer); err != nil {
		return err
	}
	return c.Recv(make([]float32, 1), peer)
}

func (c *addressedComm) Group(ranks []int) (nccl.Comm, error) {
	sub, err := c.Comm.Group(ranks)
	if err != nil {
		return nil, err
	}
	return &addressedComm{sub, c.mem, c.device}, nil
}

var _ nccl.DeviceComm = (*addressedComm)(nil)

// simulatedRun is a training run on the simulated device: every rank's
// result and device, the memory they share, and how many device calls
// the communicators made.
type simulatedRun struct {
	res         []*Result
	devs        []*addressedDevice
	mem         *deviceMemory
	collectives int64
}

// runSimulated trains cfg on cfg.NTasks in-process ranks, each on the
// simulated device with the simulated NCCL communicator, in the run dir
// dir.
func runSimulated(t *testing.T, cfg config.Config, ds *data.Data, dir string) simulatedRun {
	t.Helper()
	run := simulatedRun{res: make([]*Result, cfg.NTasks), devs: make([]*addressedDevice, cfg.NTasks), mem: &deviceMemory{bufs: map[uintptr][]float32{}}}
	var collectives atomic.Int64
	err := nccl.RunInProcess(cfg.NTasks, func(c nccl.Comm) error {
		dev := &addressedDevice{&hostScalars{CPUDevice: tensor.NewCPU()}, run.mem}
		res, err := Run(context.Background(), cfg, &addressedComm{c, run.mem, &collectives}, Options{Data: ds, Device: dev, RunDir: dir})
		run.devs[c.Rank()], run.res[c.Rank()] = dev, res
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	run.collectives = collectives.Load()
	return run
}

// hostAndSimulated trains cfg on the CPU (host-staged collectives) and on
// the simulated device, each in a run dir of its own (hostDir, simDir).
func hostAndSimulated(t *testing.T, cfg config.Config) (host []*Result, hostDir string, sim simulatedRun, simDir string) {
	t.Helper()
	ds, err := data.Prepare(cfg)
	if err != nil {
		t.Fatal(err)
	}
	hostDir, simDir = t.TempDir(), t.TempDir()
	if host, err = runRanks(t, cfg, ds, func(int) Options { return Options{Device: tensor.NewCPU(), RunDir: hostDir} }); err != nil {
		t.Fatal(err)
	}
	return host, hostDir, runSimulated(t, cfg, ds, simDir), simDir
}
