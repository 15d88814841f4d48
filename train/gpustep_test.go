package train

import (
	"context"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/hpcrun/hpcrun/nccl"
	"github.com/hpcrun/hpcrun/tensor"
)

// hostScalars gives the CPU device the GPU step's scalar operations,
// computed in host memory by the rules the CUDA kernels follow (they are
// checked against the CPU in tensor/cuda's GPU tests), so that the GPU
// step's logic runs here: loss kept as a sum, norm and clip coefficient
// read by the update, one read a step.
type hostScalars struct {
	*tensor.CPUDevice
	syncs int64
}

func (h *hostScalars) Stream() uintptr { return 0 }

func (h *hostScalars) SumSquaresTo(out *tensor.Tensor, accumulate bool, ts ...*tensor.Tensor) {
	o := out.Host()
	s := h.SumSquares(ts...)
	if accumulate {
		s += float64(o[0]) + float64(o[1])
	}
	o[0] = float32(s)
	o[1] = float32(s - float64(o[0]))
}

func (h *hostScalars) ClipScale(out, sumsq *tensor.Tensor, clip float32) {
	o, ss := out.Host(), sumsq.Host()
	norm := math.Sqrt(float64(ss[0]) + float64(ss[1]))
	o[0] = 1
	if clip > 0 && norm > float64(clip) {
		o[0] = float32(float64(clip) / (norm + 1e-6))
	}
	o[1] = float32(norm)
}

func (h *hostScalars) AdamWScaled(param, grad, m, v *tensor.Tensor, p tensor.AdamWParams, scale *tensor.Tensor) {
	p.GradScale = scale.Host()[0]
	h.AdamW(param, grad, m, v, p)
}

func (h *hostScalars) SumTo(out *tensor.Tensor, alpha float32, accumulate bool, x *tensor.Tensor) {
	var s float64
	for _, v := range x.Host() {
		s += float64(v)
	}
	v := float64(alpha) * s
	if accumulate {
		v += float64(out.Host()[0])
	}
	out.Host()[0] = float32(v)
}

func (h *hostScalars) Fetch(dst []float32, src *tensor.Tensor) error {
	h.syncs++
	h.CopyToHost(dst, src)
	return h.Sync()
}

func (h *hostScalars) HostSyncs() int64 { return h.syncs }

// The GPU step (device scalars, one read a step) trains as the host step
// does: the same losses and norms, with clipping and gradient
// accumulation, and one host synchronisation per step in the metrics.
func TestDeviceStepMatchesHostStep(t *testing.T) {
	cfg := smallConfig("gpt")
	cfg.Data, cfg.Tokenizer = textFile(t), "byte"
	cfg.Steps, cfg.BatchSize, cfg.GradAccum, cfg.GradClip = 6, 4, 2, 0.5
	data, err := Prepare(cfg)
	if err != nil {
		t.Fatal(err)
	}
	run := func(dev tensor.Device, dir string) *Result {
		world := nccl.NewInProcess(1)[0]
		defer world.Close()
		res, err := Run(context.Background(), cfg, world, Options{Data: data, Device: dev, RunDir: dir})
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	want := run(tensor.NewCPU(), "")
	dir := t.TempDir()
	gpu := &hostScalars{CPUDevice: tensor.NewCPU()}
	got := run(gpu, dir)
	for i := range want.Losses {
		if math.Abs(got.Losses[i]-want.Losses[i]) > 1e-5*math.Abs(want.Losses[i]) {
			t.Errorf("step %d: loss %.7f on the GPU step, %.7f on the host step", i+1, got.Losses[i], want.Losses[i])
		}
	}
	if gpu.syncs != int64(cfg.Steps) {
		t.Errorf("%d host synchronisations in %d steps, want one a step", gpu.syncs, cfg.Steps)
	}
	b, err := os.ReadFile(filepath.Join(dir, "metrics", "rank-00000.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(string(b), `"host_syncs":1,`); n != cfg.Steps {
		t.Errorf("%d step lines say host_syncs 1, want %d:\n%s", n, cfg.Steps, b)
	}
	// The classifier reads its predictions each micro-batch: host step.
	if ds, why, err := newDeviceStep(gpu, &transformer{}, nil, nil); ds != nil || err != nil || why == "" {
		t.Errorf("classifier: %v, %q, %v; want the host step and why", ds, why, err)
	}
	if ds, why, _ := newDeviceStep(tensor.NewCPU(), nil, nil, nil); ds != nil || why != "" {
		t.Errorf("cpu: %v, %q; want the host step, silently", ds, why)
	}
}
