package train

import (
	"fmt"
	"strings"

	"github.com/hpcrun/hpcrun/nccl"
	"github.com/hpcrun/hpcrun/parallel"
	"github.com/hpcrun/hpcrun/tensor"
	"github.com/hpcrun/hpcrun/tensor/cuda"
	"github.com/hpcrun/hpcrun/train/config"
)

// CommBackend chooses the communication backend of a training task
// (nccl.Options.Backend) from cfg.Comm and cfg.Device on this machine,
// and the CUDA device NCCL binds (pick as in OpenDevice):
//
//   - tcp: the host-staged ring (TCP, shared memory within a host),
//     whatever the device;
//   - nccl: NCCL collectives on device buffers; an error naming the
//     missing library when CUDA or NCCL cannot load;
//   - auto: nccl when the device is CUDA and NCCL loads, else the host
//     ring (the training log says why, once).
func CommBackend(cfg config.Config, pick func(count int) int) (backend string, device int, err error) {
	env := probeComm(cfg, pick)
	backend, _, err = chooseComm(cfg.Comm, cfg.Device, env)
	return backend, env.ordinal, err
}

// commEnv is what the choice depends on, probed once per process (the
// libraries are loaded once).
type commEnv struct {
	cudaWhy string // why no CUDA device can run this task; "" when one can
	ncclErr error  // why NCCL cannot run here; nil when it can
	ordinal int    // the CUDA device of this task
}

// probeComm looks at CUDA, and NCCL only where the choice needs it.
func probeComm(cfg config.Config, pick func(int) int) commEnv {
	var e commEnv
	if cfg.Comm == "tcp" || cfg.Device == "cpu" {
		return e
	}
	if ok, why := cuda.Available(); !ok {
		e.cudaWhy = why
		return e
	}
	if pick != nil {
		n, err := cuda.DeviceCount()
		if err != nil {
			e.cudaWhy = err.Error()
			return e
		}
		if e.ordinal = pick(n); e.ordinal < 0 {
			e.cudaWhy = "the launcher made no GPU visible to this task"
			return e
		}
	}
	e.ncclErr = nccl.NCCLAvailable()
	return e
}

// chooseComm is CommBackend's rule; note says why auto runs the host path
// on a CUDA device.
func chooseComm(comm, device string, e commEnv) (backend, note string, err error) {
	if comm == "tcp" || device == "cpu" {
		return nccl.BackendAuto, "", nil
	}
	if e.cudaWhy != "" {
		if comm == "nccl" {
			return "", "", fmt.Errorf("comm nccl: no CUDA device: %s: use --comm tcp or auto", oneLine(e.cudaWhy))
		}
		return nccl.BackendAuto, "", nil // the device falls back to the CPU, and says so
	}
	if e.ncclErr != nil {
		if comm == "nccl" {
			return "", "", fmt.Errorf("comm nccl: %s: use --comm tcp or auto", oneLine(e.ncclErr.Error()))
		}
		return nccl.BackendAuto, "comm auto: collectives go through host memory (TCP/shared-memory ring): " + oneLine(e.ncclErr.Error()), nil
	}
	return nccl.BackendNCCL, "", nil
}

// commNote is the line the training log gives, once, when collectives
// over a CUDA device go through host memory: why (--comm tcp, or what
// NCCL lacks). "" when they run on the device or the device is the CPU.
func commNote(cfg config.Config, dev tensor.Device, world nccl.Comm) string {
	if hostMemory(dev) || world.Size() == 1 {
		return ""
	}
	if parallel.NewDeviceGroup(world, dev).Resident(dev) {
		return ""
	}
	if cfg.Comm == "tcp" {
		return "comm tcp: collectives go through host memory (TCP/shared-memory ring)"
	}
	_, note, _ := chooseComm(cfg.Comm, "cuda", commEnv{ncclErr: nccl.NCCLAvailable()})
	if note == "" {
		note = "comm: collectives go through host memory: the world communicator was not made with the NCCL backend"
	}
	return note
}

// oneLine keeps the first line of a library's message.
func oneLine(s string) string {
	first, _, _ := strings.Cut(s, "\n")
	return first
}

// watchDeviceWaits makes a CUDA device's waits give up after the job's
// comm timeout when world is an NCCL communicator, aborting the job with
// an error that names the NCCL operation and the peer it waited on (a
// live peer that never posts its call would otherwise hang the rank).
// The returned func ends the watch (the device may outlive the run: a
// caller's own).
func watchDeviceWaits(dev tensor.Device, world nccl.Comm) (unwatch func()) {
	d, ok := dev.(interface{ WatchWaits(cuda.WaitWatch) })
	w, ok2 := world.(cuda.WaitWatch)
	if !ok || !ok2 {
		return func() {}
	}
	d.WatchWaits(w)
	return func() { d.WatchWaits(nil) }
}
