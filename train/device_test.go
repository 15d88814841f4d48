package train

import (
	"math"
	"strings"
	"testing"

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
