package nccl

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"
	"unsafe"

	"github.com/hpcrun/hpcrun/internal/cpusim"
	"github.com/hpcrun/hpcrun/tensor/cuda"
)

// The NCCL backend on many GPUs without a GPU: the tests named TestGPU*
// of this package run in a child process whose CUDA and NCCL are the CPU
// simulation of package cpusim (HPCRUN_CUDA_LIB_PATH), with four devices,
// so that every call of nccl_gpu.go (enum values, counts, in-place rules,
// the unique id through the Store, sub-communicators, grouped transfers,
// aborts) runs in `go test` as it runs on an 8-GPU node. On a machine
// with GPUs (gpu-check) the same tests run on the real NCCL.

// simChildEnv marks the child process of TestNCCLOnCPUSim.
const simChildEnv = "HPCRUN_NCCL_SIM_CHILD"

// onSim says whether this process runs on the simulation (where the
// stand-in's exact rank-order sums and its refusals can be checked).
func onSim() bool { return os.Getenv(simChildEnv) != "" }

// simDir builds the simulation once for the machine's test processes; it
// skips without g++ unless cpusim.RequireEnv is set.
func simDir(t *testing.T) string {
	t.Helper()
	return cpusim.SharedForTest(t, cuda.KernelSource())
}

// simTests are the tests that must pass on the simulation: the GPU tests,
// and the mismatch test, which runs only there (a real NCCL hangs), in a
// process of its own for each case (it leaves the devices in error, as a
// failed kernel leaves a CUDA context).
var simTests = []string{"TestGPUNCCLOneRank", "TestGPUNCCLSendRecvTwoRanks", "TestGPUNCCLCollectivesFourRanks",
	"TestGPUNCCLRefusals", "TestSimNCCLMismatchFails", "TestGPUNCCLAbortEndsWaitTwoRanks"}

// runSimChild runs the tests matching pattern in a child process on the
// simulation built in dir, with extra test flags.
func runSimChild(t *testing.T, dir, pattern string, flags ...string) (string, error) {
	cmd := exec.Command(os.Args[0], append([]string{"-test.run", pattern, "-test.v", "-test.count=1", "-test.timeout=3m"}, flags...)...)
	cmd.Env = append(os.Environ(), append(cpusim.Env(dir, 4), simChildEnv+"=1")...)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// TestNCCLOnCPUSim runs the GPU tests on the simulation and requires each
// of simTests to pass, not skip.
func TestNCCLOnCPUSim(t *testing.T) {
	if onSim() {
		t.Skip("the child process")
	}
	dir := simDir(t)
	out, err := runSimChild(t, dir, "^TestGPUNCCL")
	if err != nil {
		t.Fatalf("the GPU tests fail on the simulation: %v\n%s", err, out)
	}
	for _, kind := range []string{"count", "type"} {
		if os.Getenv(mutantChildEnv) != "" {
			break // a mutant of the FFI: the GPU tests are what it must fail
		}
		more, err := runSimChild(t, dir, "^TestSimNCCLMismatchFails$/^"+kind+"$")
		if err != nil || !strings.Contains(more, "--- PASS: TestSimNCCLMismatchFails/"+kind+" ") {
			t.Fatalf("the mismatch test (%s) fails on the simulation: %v\n%s", kind, err, more)
		}
		out += more
	}
	for _, name := range simTests {
		if os.Getenv(mutantChildEnv) != "" && strings.HasPrefix(name, "TestSim") {
			continue
		}
		if !strings.Contains(out, "--- PASS: "+name+" ") {
			t.Errorf("%s did not pass on the simulation:\n%s", name, out)
		}
	}
}

// rankComms runs fn on n ranks of an NCCL world in this process, rank r
// on device r on a locked thread of its own, and joins their errors.
func rankComms(t *testing.T, n int, rt *cudaRT, fn func(r int, c DeviceComm) error) error {
	t.Helper()
	port := freePort(t)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for r := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			if e := rt.setDevice(int32(r)); e != 0 {
				errs[r] = fmt.Errorf("rank %d: cudaSetDevice: error %d", r, e)
				return
			}
			c, err := Init(context.Background(), Options{Rank: r, Size: n, MasterAddr: "127.0.0.1", MasterPort: port,
				Token: "sim-test", Timeout: 30 * time.Second, Backend: BackendNCCL, Device: r})
			if err != nil {
				errs[r] = fmt.Errorf("rank %d: %w", r, err)
				return
			}
			defer c.Close()
			if err := fn(r, c.(DeviceComm)); err != nil {
				errs[r] = fmt.Errorf("rank %d: %w", r, err)
			}
		}()
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(2 * time.Minute):
		t.Fatal("the ranks did not finish in 2 minutes")
	}
	return errors.Join(errs...)
}

// needDevices skips unless n devices are visible (the simulation has 4).
func needDevices(t *testing.T, rt *cudaRT, n int) {
	t.Helper()
	var have int32
	if r := rt.count(&have); r != 0 || int(have) < n {
		t.Skipf("needs %d GPUs, one a rank: %d visible (cudaGetDeviceCount error %d)", n, have, r)
	}
}

// putBytes copies b into a new device buffer.
func (rt *cudaRT) putBytes(b []byte) (uintptr, error) {
	var p uintptr
	if r := rt.malloc(&p, uintptr(len(b))); r != 0 {
		return 0, fmt.Errorf("cudaMalloc: error %d", r)
	}
	if r := rt.memcpy(p, uintptr(unsafe.Pointer(&b[0])), uintptr(len(b)), 1); r != 0 {
		rt.free(p)
		return 0, fmt.Errorf("cudaMemcpy to device: error %d", r)
	}
	return p, nil
}

// getBytes waits for the device and copies n bytes at p to the host.
func (rt *cudaRT) getBytes(p uintptr, n int) ([]byte, error) {
	if r := rt.sync(); r != 0 {
		return nil, fmt.Errorf("cudaDeviceSynchronize: error %d", r)
	}
	b := make([]byte, n)
	if r := rt.memcpy(uintptr(unsafe.Pointer(&b[0])), p, uintptr(n), 2); r != 0 {
		return nil, fmt.Errorf("cudaMemcpy to host: error %d", r)
	}
	return b, nil
}

// elem is a datatype's encoding: from float64 to its bits, rounding to
// nearest even, and back. Written from the formats' definitions, apart
// from any rounding code of the engine's.
type elem struct {
	dt   DataType
	size int
	eps  float64 // the unit roundoff
	enc  func(float64) []byte
	dec  func([]byte) float64
}

// roundBits rounds x to a binary format of mant explicit mantissa bits
// and exponent range [emin, ...] (normal numbers; values here stay in
// range) and returns the rounded value.
func roundBits(x float64, mant int) float64 {
	if x == 0 {
		return 0
	}
	_, e := math.Frexp(x) // x = f * 2^e, 0.5 <= |f| < 1
	ulp := math.Ldexp(1, e-1-mant)
	return math.RoundToEven(x/ulp) * ulp
}

var elems = map[DataType]elem{
	Float32: {Float32, 4, 0x1p-24,
		func(x float64) []byte { return binary.LittleEndian.AppendUint32(nil, math.Float32bits(float32(x))) },
		func(b []byte) float64 { return float64(math.Float32frombits(binary.LittleEndian.Uint32(b))) }},
	BFloat16: {BFloat16, 2, 0x1p-8,
		func(x float64) []byte {
			return binary.LittleEndian.AppendUint16(nil, uint16(math.Float32bits(float32(roundBits(x, 7)))>>16))
		},
		func(b []byte) float64 {
			return float64(math.Float32frombits(uint32(binary.LittleEndian.Uint16(b)) << 16))
		}},
	Float16: {Float16, 2, 0x1p-11,
		func(x float64) []byte {
			r := roundBits(x, 10)
			var s uint16
			if r < 0 {
				s, r = 0x8000, -r
			}
			if r == 0 {
				return binary.LittleEndian.AppendUint16(nil, s)
			}
			f, e := math.Frexp(r) // r = f 2^e; half: 1.m 2^(e-1), biased e-1+15
			m := uint16(math.Round((f*2 - 1) * 1024))
			return binary.LittleEndian.AppendUint16(nil, s|uint16(e-1+15)<<10|m)
		},
		func(b []byte) float64 {
			h := binary.LittleEndian.Uint16(b)
			v := math.Ldexp(1+float64(h&0x3ff)/1024, int(h>>10&0x1f)-15)
			if h&0x8000 != 0 {
				v = -v
			}
			return v
		}},
}

func (e elem) encode(xs []float64) []byte {
	var b []byte
	for _, x := range xs {
		b = append(b, e.enc(x)...)
	}
	return b
}

func (e elem) decode(b []byte) []float64 {
	out := make([]float64, len(b)/e.size)
	for i := range out {
		out[i] = e.dec(b[i*e.size:])
	}
	return out
}

// inputs is rank r's data of a case: values of the type's precision.
func (e elem) inputs(r, n int) []float64 {
	xs := make([]float64, n)
	for i := range xs {
		xs[i] = e.dec(e.enc(math.Sin(float64(7*r+i+1)) * float64(1+i%5)))
	}
	return xs
}

// rankOrder reduces the inputs of ranks 0..n-1 in rank order, rounding to
// the type after each step, as the stand-in documents (avg: each input
// times 1/n first).
func (e elem) rankOrder(ranks, count int, op Op) []float64 {
	round := func(x float64) float64 { return e.dec(e.enc(x)) }
	acc := make([]float64, count)
	for r := range ranks {
		in := e.inputs(r, count)
		for i, x := range in {
			if op == Avg {
				x = round(x / float64(ranks))
			}
			switch {
			case r == 0:
				acc[i] = x
			case op == Max:
				acc[i] = math.Max(acc[i], x)
			default:
				acc[i] = round(acc[i] + x)
			}
		}
	}
	return acc
}

// near checks got against want: equal on the simulation (rank order),
// within the reassociation error of ranks terms on a real NCCL.
func (e elem) near(what string, got, want []float64, ranks int) error {
	for i := range want {
		tol := 0.0
		if !onSim() {
			tol = 2 * float64(ranks) * e.eps * (math.Abs(want[i]) + float64(ranks))
		}
		if d := math.Abs(got[i] - want[i]); !(d <= tol) {
			return fmt.Errorf("%s: element %d = %v, want %v", what, i, got[i], want[i])
		}
	}
	return nil
}

// Four ranks, one device each: every collective in float32, bf16 and
// fp16 with sum, avg and max, out of place and in place (NCCL's rule:
// all-gather's send is the rank's part of the receive buffer,
// reduce-scatter's receive the rank's part of the send buffer), broadcast
// from a root that is not 0, sub-communicators of alternate ranks, and
// transfers in pairs both ordered and grouped; Stats counts each. On the
// simulation reductions equal the rank-order reference bit for bit.
func TestGPUNCCLCollectivesFourRanks(t *testing.T) {
	if err := NCCLAvailable(); err != nil {
		t.Skipf("NCCL backend unavailable: %v", err)
	}
	rt := loadCudaRT(t)
	const n, count = 4, 37
	needDevices(t, rt, n)
	err := rankComms(t, n, rt, func(r int, c DeviceComm) error {
		var bufs []uintptr
		defer func() {
			for _, p := range bufs {
				rt.free(p)
			}
		}()
		put := func(b []byte) (uintptr, error) {
			p, err := rt.putBytes(b)
			if err == nil {
				bufs = append(bufs, p)
			}
			return p, err
		}
		for _, dt := range []DataType{Float32, BFloat16, Float16} {
			e := elems[dt]
			mine := e.encode(e.inputs(r, count))
			for _, op := range []Op{Sum, Avg, Max} {
				for _, inPlace := range []bool{false, true} {
					src, err := put(mine)
					if err != nil {
						return err
					}
					dst := src
					if !inPlace {
						if dst, err = put(make([]byte, len(mine))); err != nil {
							return err
						}
					}
					if err := c.AllReduceDevice(src, dst, count, dt, op, 0); err != nil {
						return err
					}
					b, err := rt.getBytes(dst, len(mine))
					if err != nil {
						return err
					}
					if err := e.near(fmt.Sprintf("AllReduce %v %v in place %v", dt, op, inPlace), e.decode(b), e.rankOrder(n, count, op), n); err != nil {
						return err
					}
				}
			}
			// All-gather: every rank's inputs in rank order.
			var want []float64
			for q := range n {
				want = append(want, e.inputs(q, count)...)
			}
			for _, inPlace := range []bool{false, true} {
				all, err := put(make([]byte, n*len(mine)))
				if err != nil {
					return err
				}
				src := all + uintptr(r*len(mine))
				if inPlace {
					if r := rt.memcpy(src, uintptr(unsafe.Pointer(&mine[0])), uintptr(len(mine)), 1); r != 0 {
						return fmt.Errorf("cudaMemcpy: %d", r)
					}
				} else if src, err = put(mine); err != nil {
					return err
				}
				if err := c.AllGatherDevice(src, all, count, dt, 0); err != nil {
					return err
				}
				b, err := rt.getBytes(all, n*len(mine))
				if err != nil {
					return err
				}
				if err := e.near(fmt.Sprintf("AllGather %v in place %v", dt, inPlace), e.decode(b), want, 1); err != nil {
					return err
				}
			}
			// Reduce-scatter of n*count: rank r gets part r of the sum.
			big := e.encode(e.inputs(r, n*count))
			sum := e.rankOrder(n, n*count, Sum)[r*count : (r+1)*count]
			for _, inPlace := range []bool{false, true} {
				src, err := put(big)
				if err != nil {
					return err
				}
				dst := src + uintptr(r*len(mine))
				if !inPlace {
					if dst, err = put(make([]byte, len(mine))); err != nil {
						return err
					}
				}
				if err := c.ReduceScatterDevice(src, dst, count, dt, Sum, 0); err != nil {
					return err
				}
				b, err := rt.getBytes(dst, len(mine))
				if err != nil {
					return err
				}
				if err := e.near(fmt.Sprintf("ReduceScatter %v in place %v", dt, inPlace), e.decode(b), sum, n); err != nil {
					return err
				}
			}
			// Broadcast from rank 2, in place.
			src, err := put(mine)
			if err != nil {
				return err
			}
			if err := c.BroadcastDevice(src, src, count, dt, 2, 0); err != nil {
				return err
			}
			b, err := rt.getBytes(src, len(mine))
			if err != nil {
				return err
			}
			if err := e.near(fmt.Sprintf("Broadcast %v", dt), e.decode(b), e.inputs(2, count), 1); err != nil {
				return err
			}
		}
		// Sub-communicators of alternate ranks: {0, 2} and {1, 3}.
		group := []int{r % 2, r%2 + 2}
		sub, err := c.Group(group)
		if err != nil {
			return err
		}
		defer sub.Close()
		e := elems[Float32]
		mine := e.encode(e.inputs(r, count))
		src, err := put(mine)
		if err != nil {
			return err
		}
		if err := sub.(DeviceComm).AllReduceDevice(src, src, count, Float32, Sum, 0); err != nil {
			return err
		}
		b, err := rt.getBytes(src, len(mine))
		if err != nil {
			return err
		}
		want := make([]float64, count)
		for i := range want {
			want[i] = float64(float32(e.inputs(group[0], count)[i]) + float32(e.inputs(group[1], count)[i]))
		}
		if err := e.near(fmt.Sprintf("AllReduce in group %v", group), e.decode(b), want, 2); err != nil {
			return err
		}
		// Transfers with rank r^1 (ordered: the even rank sends first)
		// and with rank r^2 (grouped, both at once).
		for _, peer := range []int{r ^ 1, r ^ 2} {
			src, err := put(mine)
			if err != nil {
				return err
			}
			dst, err := put(make([]byte, len(mine)))
			if err != nil {
				return err
			}
			if peer == r^1 {
				send := func() error { return c.SendDevice(src, count, Float32, peer, 0) }
				recv := func() error { return c.RecvDevice(dst, count, Float32, peer, 0) }
				if r%2 == 1 {
					send, recv = recv, send
				}
				if err := send(); err != nil {
					return err
				}
				if err := recv(); err != nil {
					return err
				}
			} else if err := c.SendRecvDevice(src, dst, count, Float32, Float32, peer, 0); err != nil {
				return err
			}
			b, err := rt.getBytes(dst, len(mine))
			if err != nil {
				return err
			}
			if err := e.near(fmt.Sprintf("transfer from rank %d", peer), e.decode(b), e.inputs(peer, count), 1); err != nil {
				return err
			}
		}
		// An exchange of two types (a pipeline stage's bfloat16
		// activations one way, float32 gradients the other): the lower
		// rank of the pair sends bfloat16 and receives float32.
		peer := r ^ 2
		sendT, recvT := BFloat16, Float32
		if r > peer {
			sendT, recvT = Float32, BFloat16
		}
		es, er := elems[sendT], elems[recvT]
		src, err = put(es.encode(es.inputs(r, count)))
		if err != nil {
			return err
		}
		dst, err := put(make([]byte, er.size*count))
		if err != nil {
			return err
		}
		if err := c.SendRecvDevice(src, dst, count, sendT, recvT, peer, 0); err != nil {
			return err
		}
		b, err = rt.getBytes(dst, er.size*count)
		if err != nil {
			return err
		}
		if err := er.near(fmt.Sprintf("%v from rank %d in an exchange of two types", recvT, peer), er.decode(b), er.inputs(peer, count), 1); err != nil {
			return err
		}
		st := c.Stats()
		if st.AllReduce.Calls != 18 || st.AllGather.Calls != 6 || st.ReduceScatter.Calls != 6 || st.Broadcast.Calls != 3 ||
			st.Send.Calls != 3 || st.Recv.Calls != 3 || st.Send.Bytes != int64((2*4+es.size)*count) || st.Recv.Bytes != int64((2*4+er.size)*count) {
			return fmt.Errorf("Stats: %+v", st)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// What NCCL refuses, refused: two ranks of one communicator on one device
// (on a real NCCL too), and on the simulation a unique id used twice by a
// rank and a buffer too short for its count.
func TestGPUNCCLRefusals(t *testing.T) {
	if err := NCCLAvailable(); err != nil {
		t.Skipf("NCCL backend unavailable: %v", err)
	}
	rt := loadCudaRT(t)
	port := freePort(t)
	errs := make([]error, 2)
	var wg sync.WaitGroup
	for r := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			c, err := Init(context.Background(), Options{Rank: r, Size: 2, MasterAddr: "127.0.0.1", MasterPort: port,
				Token: "sim-test", Timeout: 20 * time.Second, Backend: BackendNCCL, Device: 0})
			if err == nil {
				c.Close()
			}
			errs[r] = err
		}()
	}
	wg.Wait()
	for r, err := range errs {
		if err == nil || !strings.Contains(err.Error(), "invalid usage") {
			t.Errorf("rank %d of two on device 0: %v, want NCCL's invalid usage", r, err)
		} else {
			t.Logf("rank %d of two on device 0: %v", r, err)
		}
	}
	if !onSim() {
		return
	}
	lib, err := loadNCCL()
	if err != nil {
		t.Fatal(err)
	}
	var id ncclUniqueID
	if err := lib.check("ncclGetUniqueId", lib.getUniqueID(&id)); err != nil {
		t.Fatal(err)
	}
	var comm uintptr
	if err := lib.check("ncclCommInitRank", lib.commInitRank(&comm, 1, id, 0)); err != nil {
		t.Fatal(err)
	}
	defer lib.commDestroy(comm)
	var again uintptr
	if err := lib.check("ncclCommInitRank", lib.commInitRank(&again, 1, id, 0)); err == nil || !strings.Contains(err.Error(), "an id serves one communicator") {
		t.Errorf("a unique id used twice: %v", err)
	}
	p, err := rt.put(make([]float32, 4))
	if err != nil {
		t.Fatal(err)
	}
	defer rt.free(p)
	err = lib.check("ncclAllReduce", lib.allReduce(p, p, 16, 7, 0, comm, 0))
	if err == nil || !strings.Contains(err.Error(), "not inside one device allocation") {
		t.Errorf("16 floats in a buffer of 4: %v", err)
	}
	if err := lib.check("ncclAllReduce", lib.allReduce(p, p, 4, 10, 0, comm, 0)); err == nil || !strings.Contains(err.Error(), "invalid type 10") {
		t.Errorf("datatype 10: %v", err)
	}
	if err := lib.check("ncclAllReduce", lib.allReduce(p, p, 4, 7, 5, comm, 0)); err == nil || !strings.Contains(err.Error(), "invalid reduction operation 5") {
		t.Errorf("op 5: %v", err)
	}
}

// Collectives that do not match across ranks (a count, then a datatype)
// fail every rank's device with one message naming both calls, where a
// real NCCL would hang or corrupt memory: on the simulation only.
func TestSimNCCLMismatchFails(t *testing.T) {
	if !onSim() {
		t.Skip("runs on the simulation (TestNCCLOnCPUSim): a real NCCL hangs on mismatched collectives")
	}
	rt := loadCudaRT(t)
	for _, mismatch := range []struct{ kind, want string }{
		{"count", "ncclAllReduce of 4 float32 (sum)"},
		{"type", "ncclAllReduce of 8 bfloat16 (sum)"},
	} {
		t.Run(mismatch.kind, func(t *testing.T) {
			err := rankComms(t, 2, rt, func(r int, c DeviceComm) error {
				p, err := rt.put(make([]float32, 8))
				if err != nil {
					return err
				}
				defer rt.free(p)
				count, dt := 8, Float32
				if r == 1 && mismatch.kind == "count" {
					count = 4
				}
				if r == 1 && mismatch.kind == "type" {
					dt = BFloat16
				}
				if err := c.AllReduceDevice(p, p, count, dt, Sum, 0); err != nil {
					return err
				}
				_, err = rt.get(p, 8)
				return err
			})
			// A rank learns it from the call's async error or from its
			// device's next wait, whichever comes first.
			if err == nil || !strings.Contains(err.Error(), "rank 0: ") || !strings.Contains(err.Error(), "rank 1: ") {
				t.Errorf("both ranks must fail: %v", err)
			}
			t.Logf("%v", err)
			if out, _ := runLastError(); !strings.Contains(out, "collectives do not match across ranks") || !strings.Contains(out, mismatch.want) || !strings.Contains(out, "ncclAllReduce of 8 float32 (sum)") {
				t.Errorf("last error %q, want it to name both calls (%q)", out, mismatch.want)
			}
		})
	}
}

// runLastError is the stand-in's last failure detail.
func runLastError() (string, error) {
	lib, err := loadNCCL()
	if err != nil || lib.lastError == nil {
		return "", err
	}
	return lib.lastError(0), nil
}

// A rank whose peer never posts its all-reduce is freed by the job's
// abort: its device's wait ends, and the next call says why the job
// aborted.
func TestGPUNCCLAbortEndsWaitTwoRanks(t *testing.T) {
	if err := NCCLAvailable(); err != nil {
		t.Skipf("NCCL backend unavailable: %v", err)
	}
	rt := loadCudaRT(t)
	needDevices(t, rt, 2)
	release := make(chan struct{})
	err := rankComms(t, 2, rt, func(r int, c DeviceComm) error {
		p, err := rt.put(make([]float32, 8))
		if err != nil {
			return err
		}
		defer rt.free(p)
		if r == 1 {
			<-release // never posts: waits for rank 0 to give up
			return nil
		}
		if err := c.AllReduceDevice(p, p, 8, Float32, Sum, 0); err != nil {
			return err
		}
		go func() {
			time.Sleep(200 * time.Millisecond)
			Abort(c, errors.New("rank 0 gives up on purpose"))
		}()
		synced := make(chan int32, 1)
		go func() {
			runtime.LockOSThread()
			rt.setDevice(0)
			synced <- rt.sync()
		}()
		select {
		case <-synced:
		case <-time.After(20 * time.Second):
			return errors.New("the device still waits 20 s after the abort")
		}
		close(release)
		err = c.AllReduceDevice(p, p, 8, Float32, Sum, 0)
		if err == nil || !strings.Contains(err.Error(), "on purpose") {
			return fmt.Errorf("a call after the abort: %v, want the abort's reason", err)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// An FFI mutant: text of nccl_gpu.go (which must occur once) replaced.
type ffiMutant struct {
	what, old, new string
}

var ffiMutants = []ffiMutant{
	{"bf16 passed as NCCL's float16 enum", "return 9, 2, nil", "return 6, 2, nil"},
	{"max passed as NCCL's min enum", "case Max:\n\t\treturn 2, nil", "case Max:\n\t\treturn 3, nil"},
	{"all-gather's count in bytes, not elements", "nc.lib.allGather(send, recv, uintptr(sendcount), t, comm, stream)",
		"nc.lib.allGather(send, recv, uintptr(size*sendcount), t, comm, stream)"},
	{"grouped transfers without ncclGroupEnd", `re := nc.bounded("ncclSend+ncclRecv", peer, nc.lib.groupEnd)`, `re := int32(0)`},
	{"a grouped send and receive crossed (each on the other's buffer)",
		"rs := nc.lib.send(sendbuf, uintptr(count), t, int32(peer), comm, stream)",
		"rs := nc.lib.send(recvbuf, uintptr(count), t, int32(peer), comm, stream)"},
}

// Each FFI mutant makes the GPU tests fail on the simulation: the package
// is built again with the mutated file in place of nccl_gpu.go (go test
// -overlay), and its TestNCCLOnCPUSim must fail, by a test, not a build
// error.
func TestNCCLMutantsFail(t *testing.T) {
	if onSim() || os.Getenv(mutantChildEnv) != "" {
		t.Skip("a child process")
	}
	if testing.Short() {
		t.Skip("builds the package once a mutant")
	}
	simDir(t) // built once, before the mutants' processes share it
	goBin := filepath.Join(runtime.GOROOT(), "bin", "go")
	src, err := os.ReadFile("nccl_gpu.go")
	if err != nil {
		t.Fatal(err)
	}
	real, err := filepath.Abs("nccl_gpu.go")
	if err != nil {
		t.Fatal(err)
	}
	tmp := t.TempDir()
	for _, m := range ffiMutants {
		if n := strings.Count(string(src), m.old); n != 1 {
			t.Fatalf("mutant %q: its text occurs %d times in nccl_gpu.go", m.what, n)
		}
	}
	// Two mutants at a time: each is mostly a build of the package.
	var wg sync.WaitGroup
	slots := make(chan struct{}, 2)
	for i, m := range ffiMutants {
		wg.Add(1)
		go func() {
			defer wg.Done()
			slots <- struct{}{}
			defer func() { <-slots }()
			mutated := filepath.Join(tmp, fmt.Sprintf("nccl_gpu_%d.go", i))
			overlay := filepath.Join(tmp, fmt.Sprintf("overlay_%d.json", i))
			if err := os.WriteFile(mutated, []byte(strings.Replace(string(src), m.old, m.new, 1)), 0o644); err != nil {
				t.Error(err)
				return
			}
			js, _ := json.Marshal(map[string]map[string]string{"Replace": {real: mutated}})
			if err := os.WriteFile(overlay, js, 0o644); err != nil {
				t.Error(err)
				return
			}
			cmd := exec.Command(goBin, "test", "-count=1", "-overlay", overlay, "-run", "^TestNCCLOnCPUSim$", ".")
			cmd.Env = append(os.Environ(), mutantChildEnv+"=1")
			out, err := cmd.CombinedOutput()
			switch {
			case err == nil:
				t.Errorf("mutant %d, %s: the GPU tests pass on the simulation", i+1, m.what)
			case !strings.Contains(string(out), "--- FAIL: TestNCCLOnCPUSim"):
				t.Errorf("mutant %d, %s: no test failed (a build error?):\n%s", i+1, m.what, out)
			default:
				t.Logf("mutant %d, %s: caught: %s", i+1, m.what, firstFailure(string(out)))
			}
		}()
	}
	wg.Wait()
}

// mutantChildEnv marks the go test process of a mutant.
const mutantChildEnv = "HPCRUN_NCCL_MUTANT"

// firstFailure is the first line of a child's output that says what
// failed.
func firstFailure(out string) string {
	for _, l := range strings.Split(out, "\n") {
		l = strings.TrimSpace(l)
		if strings.HasPrefix(l, "nccl_") && strings.Contains(l, ".go:") && !strings.Contains(l, "the GPU tests fail") {
			return l
		}
	}
	return "(see the child's output)"
}
