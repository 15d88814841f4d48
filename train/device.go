package train

import (
	"fmt"
	"strings"

	"github.com/hpcrun/hpcrun/tensor"
	"github.com/hpcrun/hpcrun/tensor/cuda"
	"github.com/hpcrun/hpcrun/train/config"
)

// OpenDevice returns the device that kind (a config.Config.Device: auto, cpu or
// cuda) names on this machine. pick chooses the CUDA ordinal given how many
// devices are visible (idrenv.Env.GPUOrdinal; nil picks 0; -1 means no GPU
// for this task). For auto, note says why the CPU was chosen when CUDA was
// not; cuda fails with the reason instead. The caller closes a CUDA device
// (a *cuda.Device) when done.
func OpenDevice(kind string, pick func(count int) int) (dev tensor.Device, note string, err error) {
	switch kind {
	case "cpu":
		return tensor.NewCPU(), "", nil
	case "auto", "cuda":
	default:
		return nil, "", fmt.Errorf("device %q: use auto, cpu or cuda", kind)
	}
	d, why := openCUDA(pick)
	if d != nil {
		return d, "", nil
	}
	if kind == "cuda" {
		return nil, "", fmt.Errorf("device cuda: %s: use --device cpu or auto", why)
	}
	if strings.HasPrefix(why, "cannot load the CUDA driver") {
		// A machine without GPUs: the CPU is what auto is for, not a
		// problem to explain with how to install a driver.
		return tensor.NewCPU(), "device auto: the CPU (no CUDA driver on this machine)", nil
	}
	return tensor.NewCPU(), "device auto: using the CPU: " + why, nil
}

// matmulPrecision is a device whose matrix products can compute at another
// precision than float32 (a CUDA device).
type matmulPrecision interface {
	SetMatmulPrecision(tensor.Precision)
}

// setPrecision makes dev's matrix products compute at precision (a
// config.Config.Precision; bf16: bfloat16 operands, float32 accumulation)
// where dev has the choice; the CPU computes in float32 whatever it says
// (at bf16 from the weights' bfloat16 copies: spec.Compute).
func setPrecision(dev tensor.Device, precision string) error {
	d, ok := dev.(matmulPrecision)
	if !ok {
		return nil
	}
	p, err := tensor.ParsePrecision(precision)
	if err != nil {
		return err
	}
	if c, ok := dev.(interface{ CheckPrecision(tensor.Precision) error }); ok {
		if err := c.CheckPrecision(p); err != nil {
			return err
		}
	}
	d.SetMatmulPrecision(p)
	return nil
}

// AttentionFused says whether the model's attention runs in dev's fused
// kernels (tensor.FusedAttention), by cfg.Attention: auto where dev has
// them for the model's heads at its precision, fused (an error where it
// has not, saying why), unfused never. note says what was chosen and why,
// for the log; "" on a device without fused kernels (the CPU), where
// there is no choice to report.
func AttentionFused(cfg config.Config, dev tensor.Device) (fused bool, note string, err error) {
	f, why := tensor.FusedAttentionOn(dev, cfg.Dim/cfg.Heads)
	_, has := dev.(tensor.FusedAttention)
	switch {
	case cfg.Attention == "unfused":
		if has {
			note = "attention: unfused (--attention unfused)"
		}
		return false, note, nil
	case f != nil:
		return true, "attention: fused (FlashAttention-2 kernels: bf16 products, no (T,T) probabilities kept)", nil
	case cfg.Attention == "fused":
		return false, "", fmt.Errorf("attention fused: %s (use --attention auto or unfused)", why)
	case has:
		note = "attention: unfused: " + why
	}
	return false, note, nil
}

// openCUDA opens the CUDA device pick chooses, or says why it cannot.
func openCUDA(pick func(int) int) (*cuda.Device, string) {
	n, err := cuda.DeviceCount()
	if err != nil {
		return nil, err.Error()
	}
	if n == 0 {
		return nil, "the CUDA driver sees no device"
	}
	ord := 0
	if pick != nil {
		ord = pick(n)
	}
	if ord < 0 {
		return nil, "the launcher made no GPU visible to this task"
	}
	d, err := cuda.Open(ord)
	if err != nil {
		return nil, err.Error()
	}
	return d, ""
}

// checkDevice fails for device cuda when CUDA cannot run on this machine,
// with the reason.
func checkDevice(cfg config.Config) error {
	if cfg.Device != "cuda" {
		return nil
	}
	if ok, why := cuda.Available(); !ok {
		return fmt.Errorf("device cuda: %s: use --device cpu or auto", why)
	}
	return nil
}
