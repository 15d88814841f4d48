package train

import (
	"context"
	"math"
	"strings"
	"testing"

	"github.com/hpcrun/hpcrun/nccl"
	"github.com/hpcrun/hpcrun/tensor"
	"github.com/hpcrun/hpcrun/tensor/cuda"
	"github.com/hpcrun/hpcrun/train/config"
)

func TestOpenDevice(t *testing.T) {
	d, note, err := OpenDevice("cpu", nil)
	if err != nil || note != "" || d.Name() != "cpu" {
		t.Errorf("cpu: %v, %q, %v", d, note, err)
	}
	if _, _, err := OpenDevice("tpu", nil); err == nil || !strings.Contains(err.Error(), `device "tpu"`) {
		t.Errorf("tpu: %v", err)
	}
	if ok, why := cuda.Available(); !ok {
		// No driver at all is a CPU machine: one short line, no advice to
		// install a driver; a driver that fails says why.
		want := why
		if strings.HasPrefix(why, "cannot load the CUDA driver") {
			want = "device auto: the CPU (no CUDA driver on this machine)"
		}
		d, note, err := OpenDevice("auto", nil)
		if err != nil || d.Name() != "cpu" || !strings.Contains(note, want) {
			t.Errorf("auto without CUDA: %v, note %q, %v; want the CPU and %q", d, note, err, want)
		}
		if _, _, err := OpenDevice("cuda", nil); err == nil || !strings.Contains(err.Error(), "device cuda: ") {
			t.Errorf("cuda without CUDA: %v, want the reason", err)
		}
		if err := checkDevice(config.Config{Device: "cuda"}); err == nil {
			t.Error("checkDevice accepts cuda where CUDA cannot run")
		}
		return
	}
	d, note, err = OpenDevice("auto", func(int) int { return -1 })
	if err != nil || d.Name() != "cpu" || !strings.Contains(note, "no GPU") {
		t.Errorf("auto with no GPU for the task: %v, %q, %v", d, note, err)
	}
	d, _, err = OpenDevice("auto", nil)
	if err != nil || !strings.HasPrefix(d.Name(), "cuda:") {
		t.Fatalf("auto with CUDA: %v, %v", d, err)
	}
	d.(*cuda.Device).Close()
}

// On a GPU, training steps of a small GPT give the CPU's losses, within
// reorderFactor times the spread the same steps show on the CPU with the
// GEMM sums reordered (tolerance_test.go), at least floorTol.
func TestGPUBenchStepMatchesCPU(t *testing.T) {
	cfg := config.DefaultConfig()
	if err := cfg.ApplyPreset("tiny"); err != nil {
		t.Fatal(err)
	}
	cfg.Model, cfg.Tokenizer, cfg.BatchSize, cfg.Seq = "gpt", "byte", 2, 32
	want, err := BenchStep(cfg, tensor.NewCPU(), 0, 3)
	if err != nil {
		t.Fatal(err)
	}
	if ok, why := cuda.Available(); !ok {
		t.Skip("no CUDA here: " + why)
	}
	d, err := cuda.Open(0)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	got, err := BenchStep(cfg, d, 0, 3)
	if err != nil {
		t.Fatal(err)
	}
	split, err := BenchStep(cfg, splitCPU(2), 0, 3)
	if err != nil {
		t.Fatal(err)
	}
	tol := math.Max(reorderFactor*math.Abs(split.Loss-want.Loss)/math.Abs(want.Loss), floorTol)
	if math.Abs(got.Loss-want.Loss) > tol*math.Abs(want.Loss) {
		t.Errorf("loss after 3 steps: cuda %.6f, cpu %.6f (tolerance %.2g: %d x the CPU's reordering spread)", got.Loss, want.Loss, tol, reorderFactor)
	}
	if s := d.MemStats(); s.Current != 0 {
		t.Errorf("%d bytes still allocated after BenchStep", s.Current)
	}
}

// precisionSpy is the CPU device with a matmul precision that can be set
// (as a GPU's can), recording what the run set.
type precisionSpy struct {
	*tensor.CPUDevice
	set []tensor.Precision
}

func (d *precisionSpy) SetMatmulPrecision(p tensor.Precision) { d.set = append(d.set, p) }

// A run sets its device's matmul precision from the config (bf16 was
// ignored in training: a GPU run trained in float32 whatever it said).
func TestRunSetsMatmulPrecision(t *testing.T) {
	for _, prec := range []string{"fp32", "tf32", "bf16"} {
		cfg := smallConfig("gpt")
		cfg.Data, cfg.Steps, cfg.Precision = textFile(t), 1, prec
		dev := &precisionSpy{CPUDevice: tensor.NewCPU()}
		world := nccl.NewInProcess(1)[0]
		if _, err := Run(context.Background(), cfg, world, Options{Device: dev}); err != nil {
			t.Fatal(err)
		}
		world.Close()
		want, _ := tensor.ParsePrecision(prec)
		if len(dev.set) != 1 || dev.set[0] != want {
			t.Errorf("precision %s: the run set %v, want [%v]", prec, dev.set, want)
		}
	}
}

// BenchStep's device computes at the config's precision, as a run's does
// (bench step --precision was overridden by the default fp32 once runs
// set it).
func TestBenchStepSetsMatmulPrecision(t *testing.T) {
	cfg := smallConfig("gpt")
	cfg.Precision = "tf32"
	dev := &precisionSpy{CPUDevice: tensor.NewCPU()}
	if _, err := BenchStep(cfg, dev, 0, 1); err != nil {
		t.Fatal(err)
	}
	if len(dev.set) != 1 || dev.set[0] != tensor.TF32 {
		t.Errorf("BenchStep set %v, want [tf32]", dev.set)
	}
}

// On a GPU, --precision tf32 and bf16 train (their curves are not
// float32's) and end within 2% of float32's loss after 100 steps.
func TestGPULowPrecisionTrainsLikeFP32(t *testing.T) {
	if ok, why := cuda.Available(); !ok {
		t.Skip("no CUDA here: " + why)
	}
	losses := map[string][]float64{}
	for _, prec := range []string{"fp32", "tf32", "bf16"} {
		cfg := smallConfig("gpt")
		cfg.Data, cfg.Steps, cfg.Precision, cfg.Dim, cfg.Heads = textFile(t), 100, prec, 128, 4
		d, err := cuda.Open(0)
		if err != nil {
			t.Fatal(err)
		}
		world := nccl.NewInProcess(1)[0]
		res, err := Run(context.Background(), cfg, world, Options{Device: d})
		world.Close()
		d.Close()
		if err != nil {
			t.Fatal(err)
		}
		losses[prec] = res.Losses
	}
	f := losses["fp32"]
	for _, prec := range []string{"tf32", "bf16"} {
		b := losses[prec]
		if len(f) != 100 || len(b) != 100 {
			t.Fatalf("%d and %d steps, want 100", len(f), len(b))
		}
		same := true
		for i := range f {
			same = same && f[i] == b[i]
		}
		last := math.Abs(b[99]-f[99]) / f[99]
		t.Logf("final loss fp32 %.5f, %s %.5f (%.2f%%)", f[99], prec, b[99], 100*last)
		if same {
			t.Errorf("%s's losses equal fp32's bit for bit: the precision was not applied", prec)
		}
		if last > 0.02 {
			t.Errorf("final loss %s %.5f, fp32 %.5f: %.1f%% apart, want within 2%%", prec, b[99], f[99], 100*last)
		}
	}
}
