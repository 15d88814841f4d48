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
	"github.com/hpcrun/hpcrun/train/data"
)

// hostScalars is the CPU device seen as another device: the step keeps
// its loss in device memory there as on a GPU (lossOnDevice), and its
// reads are counted, so that the GPU step's logic runs here: loss summed
// on the device, norm and clip coefficient read by the update, one read a
// step.
type hostScalars struct {
	*tensor.CPUDevice
	syncs int64
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
	ds, err := data.Prepare(cfg)
	if err != nil {
		t.Fatal(err)
	}
	run := func(dev tensor.Device, dir string) *Result {
		world := nccl.NewInProcess(1)[0]
		defer world.Close()
		res, err := Run(context.Background(), cfg, world, Options{Data: ds, Device: dev, RunDir: dir})
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
	// The classifier reads its predictions each micro-batch, a pipeline
	// its last stage's loss, the CPU every loss: read as made.
	if lm, why := lossOnDevice(gpu, &transformer{}, false); lm != nil || why == "" {
		t.Errorf("classifier: %v, %q; want the loss read each micro-batch, and why", lm, why)
	}
	if lm, why := lossOnDevice(gpu, &transformer{gpt: true}, true); lm != nil || why == "" {
		t.Errorf("pipeline: %v, %q; want the loss read each micro-batch, and why", lm, why)
	}
	if lm, why := lossOnDevice(tensor.NewCPU(), &transformer{gpt: true}, false); lm != nil || why != "" {
		t.Errorf("cpu: %v, %q; want the loss read as made, silently", lm, why)
	}
	if lm, _ := lossOnDevice(gpu, &transformer{gpt: true}, false); lm == nil {
		t.Error("a language model on a device: want its loss kept there")
	}
}
