//go:build cgo

package gpu

import (
	"fmt"
	"sync"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// NVML is initialised once per process and reference-counted by the
// library itself: each Init is matched by a Shutdown.
type nvmlDevice struct {
	h    nvml.Device
	once sync.Once
}

func openNVML(index int) (device, error) {
	if ret := nvml.Init(); ret != nvml.SUCCESS {
		return nil, fmt.Errorf("gpu: %w: %s", ErrUnavailable, nvmlError(ret))
	}
	n, ret := nvml.DeviceGetCount()
	if ret != nvml.SUCCESS {
		nvml.Shutdown()
		return nil, fmt.Errorf("gpu: %w: counting devices: %s", ErrUnavailable, nvmlError(ret))
	}
	if index < 0 || index >= n {
		nvml.Shutdown()
		return nil, fmt.Errorf("gpu: %w: device %d, but NVML sees %d", ErrUnavailable, index, n)
	}
	h, ret := nvml.DeviceGetHandleByIndex(index)
	if ret != nvml.SUCCESS {
		nvml.Shutdown()
		return nil, fmt.Errorf("gpu: %w: device %d: %s", ErrUnavailable, index, nvmlError(ret))
	}
	return &nvmlDevice{h: h}, nil
}

func (d *nvmlDevice) read() (used, total uint64, util float64, err error) {
	mem, ret := d.h.GetMemoryInfo()
	if ret != nvml.SUCCESS {
		return 0, 0, 0, fmt.Errorf("memory info: %s", nvmlError(ret))
	}
	u, ret := d.h.GetUtilizationRates()
	if ret != nvml.SUCCESS {
		return 0, 0, 0, fmt.Errorf("utilisation: %s", nvmlError(ret))
	}
	return mem.Used, mem.Total, float64(u.Gpu), nil
}

func (d *nvmlDevice) close() error {
	var err error
	d.once.Do(func() {
		if ret := nvml.Shutdown(); ret != nvml.SUCCESS {
			err = fmt.Errorf("gpu: NVML shutdown: %s", nvmlError(ret))
		}
	})
	return err
}

func nvmlError(ret nvml.Return) string {
	if ret == nvml.ERROR_LIBRARY_NOT_FOUND {
		return "libnvidia-ml.so.1 not found (no NVIDIA driver on this machine)"
	}
	return nvml.ErrorString(ret)
}
