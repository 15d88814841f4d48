package nccl

import (
	"fmt"
	"sync"

	"github.com/ebitengine/purego"
	"github.com/hpcrun/hpcrun/internal/cudalib"
)

// cuDriver is the part of the CUDA driver API (libcuda.so.1, present
// wherever a GPU is) that the NCCL backend needs: making a device's
// primary context current on the thread that creates a communicator, so
// that each rank binds its own GPU. The CUDA runtime inside NCCL uses the
// context current on the thread.
type cuDriver struct {
	init          func(flags uint32) int32
	deviceGet     func(dev *int32, ordinal int32) int32
	ctxRetain     func(ctx *uintptr, dev int32) int32
	ctxRelease    func(dev int32) int32
	ctxSetCurrent func(ctx uintptr) int32
}

var (
	driverOnce sync.Once
	driverLib  *cuDriver
	driverErr  error
)

// loadDriver opens libcuda.so.1 once and calls cuInit.
func loadDriver() (*cuDriver, error) {
	driverOnce.Do(func() { driverLib, driverErr = openDriver() })
	return driverLib, driverErr
}

func openDriver() (d *cuDriver, err error) {
	h, found, err := cudalib.Open("the CUDA driver", "it binds the rank's GPU: is there a GPU on this machine?", cudalib.Names("CUDA driver"), nil)
	if err != nil {
		return nil, fmt.Errorf("nccl backend: %w", err)
	}
	name := found.Path
	defer func() {
		if p := recover(); p != nil { // purego panics on a signature it cannot map
			d, err = nil, fmt.Errorf("nccl backend: %s: %v", name, p)
		}
	}()
	d = &cuDriver{}
	for _, f := range []struct {
		fn   any
		name string
	}{
		{&d.init, "cuInit"}, {&d.deviceGet, "cuDeviceGet"},
		{&d.ctxRetain, "cuDevicePrimaryCtxRetain"}, {&d.ctxRelease, "cuDevicePrimaryCtxRelease_v2"},
		{&d.ctxSetCurrent, "cuCtxSetCurrent"},
	} {
		sym, err := purego.Dlsym(h, f.name)
		if err != nil {
			return nil, fmt.Errorf("nccl backend: %s lacks %s: %w", name, f.name, err)
		}
		purego.RegisterFunc(f.fn, sym)
	}
	if r := d.init(0); r != 0 {
		return nil, fmt.Errorf("nccl backend: cuInit failed with CUresult %d", r)
	}
	return d, nil
}

// retain makes device ordinal's primary context current on the calling
// OS thread (locked by the caller), holding a reference that release
// gives back.
func (d *cuDriver) retain(ordinal int) error {
	var dev int32
	if r := d.deviceGet(&dev, int32(ordinal)); r != 0 {
		return fmt.Errorf("nccl: cuDeviceGet(%d) failed with CUresult %d: check Options.Device and CUDA_VISIBLE_DEVICES", ordinal, r)
	}
	var ctx uintptr
	if r := d.ctxRetain(&ctx, dev); r != 0 {
		return fmt.Errorf("nccl: cuDevicePrimaryCtxRetain(device %d) failed with CUresult %d", ordinal, r)
	}
	if r := d.ctxSetCurrent(ctx); r != 0 {
		err := fmt.Errorf("nccl: cuCtxSetCurrent(device %d) failed with CUresult %d", ordinal, r)
		if r := d.ctxRelease(dev); r != 0 {
			err = fmt.Errorf("%w; then cuDevicePrimaryCtxRelease failed with CUresult %d", err, r)
		}
		return err
	}
	return nil
}

// release gives back the primary context reference retain took.
func (d *cuDriver) release(ordinal int) error {
	var dev int32
	if r := d.deviceGet(&dev, int32(ordinal)); r != 0 {
		return fmt.Errorf("nccl: cuDeviceGet(%d) failed with CUresult %d: the primary context was not released", ordinal, r)
	}
	if r := d.ctxRelease(dev); r != 0 {
		return fmt.Errorf("nccl: cuDevicePrimaryCtxRelease(device %d) failed with CUresult %d", ordinal, r)
	}
	return nil
}
