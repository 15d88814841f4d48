package train

import (
	"os"
	"testing"

	"github.com/hpcrun/hpcrun/nccl"
	"github.com/hpcrun/hpcrun/parallel"
	"github.com/hpcrun/hpcrun/tensor"
	"github.com/hpcrun/hpcrun/train/config"
	"github.com/hpcrun/hpcrun/train/data"
	"github.com/hpcrun/hpcrun/train/metrics"
)

// memPeak trains cfg for its steps on in-process ranks and returns the
// largest engine peak (mem_peak_bytes) any rank reported.
func memPeak(t *testing.T, cfg config.Config) int64 {
	t.Helper()
	dir := t.TempDir()
	runInProcess(t, cfg, dir)
	var peak int64
	for r := 0; r < cfg.NTasks; r++ {
		l, err := metrics.ReadRank(metrics.RankFile(dir, r))
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range l.Steps {
			peak = max(peak, s.MemPeakBytes)
		}
	}
	return peak
}

// spSaving is the bytes per rank that sequence parallelism saves, from the
// buffers of package parallel and the model: per block the residual
// stream and the layer norms' outputs and statistics shrink to T/tp
// positions, and once (the blocks share their scratch) its gradients and
// the row-parallel layers' outputs shrink and the column-parallel layers'
// (B,T,C) input gradients go (they reduce-scatter from the shared
// buffer); the embeddings' outputs, dx, dh and ln_f's (5 (B,T,C), 2
// (B,T)) shrink by tp, and so does the GPT head's (B,T,C) input gradient
// (it goes) or the classifier's pooling matrix; against that the region's
// shared buffers: packed, gathered and full (B,T,C), the reduce-scatter's
// (B,T/tp,C), and the bucket of the layer-norm and position gradients.
func spSaving(cfg config.Config) int64 {
	tp := int64(cfg.TP)
	B, T, C, L := int64(cfg.BatchSize), int64(cfg.Seq), int64(cfg.Dim), int64(cfg.Layers)
	N := B * T
	// Per block what it keeps (the residual stream, the layer norms'
	// outputs and statistics); once, the scratch the blocks share (dh
	// and the row-parallel outputs shrink, the column-parallel layers' dx
	// go).
	saved := 4*N*C - 4*N*C/tp + 4*N - 4*N/tp
	scratch := 5*N*C - 3*N*C/tp
	model := 5*N*C - 5*N*C/tp + 2*N - 2*N/tp
	if cfg.Model == "gpt" {
		model += N * C
	} else {
		model += B*N - B*N/tp
	}
	shared := 3*N*C + N*C/tp + L*4*C + 2*C + int64(cfg.PositionRows())*C
	return 4 * (L*saved + scratch + model - shared)
}

// zeroSaving is the bytes per rank that ZeRO-1 saves: the moments of all
// but this rank's range of every bucket, and GradSync's bucket buffer
// (the biggest bucket of several gradients), less ZeRO-1's own buffers
// (the biggest packed bucket, padded, and its range) and its gradient
// norm's all-gather over dp of each parameter's float64 squares.
func zeroSaving(cfg config.Config, params []*parallel.Param) int64 {
	dp := cfg.DP()
	s := NewGradSync(nil, nil, params, 0, false)
	var saved, sync, packed int64
	for _, b := range s.buckets {
		n := 0
		for _, p := range b {
			n += p.Data.Len()
		}
		per := (n + dp - 1) / dp
		saved += int64(2 * (n - per))
		if len(b) > 1 {
			sync = max(sync, int64(n))
		}
		if len(b) > 1 || n != per*dp {
			packed = max(packed, int64(per*dp))
		}
	}
	gather := int64(2 * len(params) * dp)
	return 4 * (saved + sync - packed - packed/int64(dp) - gather)
}

// TestSPZeroMemory measures the engine's peak per rank with and without
// sequence parallelism (tp 2) and ZeRO-1 (dp 2): each saves exactly what
// its buffers predict (spSaving, zeroSaving), for both models.
// HPCRUN_MEMORY_TABLE=1 also prints the table for the small preset.
func TestSPZeroMemory(t *testing.T) {
	for _, model := range []string{"gpt", "bert"} {
		cfg := smallConfig(model)
		if model == "gpt" {
			cfg.Data = textFile(t)
		}
		cfg.Steps, cfg.Warmup = 2, 1
		checkMemory(t, cfg, false)
	}
	if os.Getenv("HPCRUN_MEMORY_TABLE") != "" {
		t.Logf("| model | preset | tp | dp | sp | zero1 | engine peak per rank |")
		for _, model := range []string{"gpt", "bert"} {
			cfg := smallConfig(model)
			if model == "gpt" {
				cfg.Data = textFile(t)
			}
			if err := cfg.ApplyPreset("small"); err != nil {
				t.Fatal(err)
			}
			cfg.Steps, cfg.Warmup, cfg.Samples = 1, 1, 0
			checkMemory(t, cfg, true)
		}
	}
}

func checkMemory(t *testing.T, base config.Config, table bool) {
	t.Helper()
	peaks := map[string]int64{}
	for _, l := range []struct {
		name       string
		ntasks, tp int
		sp         bool
		zero       int
	}{
		{"tp2", 2, 2, false, 0}, {"tp2+sp", 2, 2, true, 0},
		{"dp2", 2, 1, false, 0}, {"dp2+zero1", 2, 1, false, 1},
		{"tp2xdp2", 4, 2, false, 0}, {"tp2xdp2+sp+zero1", 4, 2, true, 1},
	} {
		if !table && l.ntasks > 2 {
			continue
		}
		cfg := base
		cfg.NTasks, cfg.TP, cfg.SP, cfg.Zero = l.ntasks, l.tp, l.sp, l.zero
		peaks[l.name] = memPeak(t, cfg)
		if table {
			t.Logf("| %s | %s | %d | %d | %v | %v | %.2f MiB |", base.Model, base.Preset, l.tp, l.ntasks/l.tp, l.sp, l.zero == 1, float64(peaks[l.name])/(1<<20))
		}
	}
	sp := base
	sp.NTasks, sp.TP = 2, 2
	t.Logf("%s: peak per rank tp2 %d, tp2+sp %d (saves %d, buffers say %d); dp2 %d, dp2+zero1 %d", base.Model,
		peaks["tp2"], peaks["tp2+sp"], peaks["tp2"]-peaks["tp2+sp"], spSaving(sp), peaks["dp2"], peaks["dp2+zero1"])
	if got, want := peaks["tp2"]-peaks["tp2+sp"], spSaving(sp); got != want {
		t.Errorf("%s: sequence parallelism at tp 2 saves %d bytes per rank, the buffers say %d", base.Model, got, want)
	}
	zc := base
	zc.NTasks, zc.TP = 2, 1
	ds, err := data.Prepare(zc)
	if err != nil {
		t.Fatal(err)
	}
	var want int64
	err = nccl.RunInProcess(1, func(c nccl.Comm) error {
		mesh, err := parallel.NewMesh(c, 1)
		if err != nil {
			return err
		}
		defer mesh.Close()
		m, err := newModel(zc, ds, mesh, tensor.NewCPU())
		if err != nil {
			return err
		}
		defer m.Close()
		want = zeroSaving(zc, m.Params())
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if got := peaks["dp2"] - peaks["dp2+zero1"]; got != want {
		t.Errorf("%s: ZeRO-1 at dp 2 saves %d bytes per rank, half the moments are %d", base.Model, got, want)
	}
}
