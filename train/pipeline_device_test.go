package train

import "testing"

// The device-resident pipeline (NCCL point-to-point on the stream, sends
// paired with receives from the same neighbour, Megatron-LM's order) runs
// on the CPU through the simulated device, whose sends return only once
// received as NCCL's do: every stage finishes (no two neighbours wait on
// each other), each link carries one activation and one gradient per
// micro-batch, some of them paired, and the losses and validations equal
// the host-staged pipeline's to the bit, with ZeRO-1 as well (one norm
// rule on every device).
func TestPipelineDevicePathMatchesHost(t *testing.T) {
	for _, l := range []struct {
		name                      string
		model                     string
		ntasks, pp, tp, micro, bz int
		zero                      int
	}{
		{"gpt pp2", "gpt", 2, 2, 1, 4, 4, 0},
		{"gpt pp4", "gpt", 4, 4, 1, 5, 4, 0},
		{"bert pp2", "bert", 2, 2, 1, 3, 4, 0},
		{"gpt pp2xtp2", "gpt", 4, 2, 2, 4, 4, 0},
		{"gpt pp2xdp2 zero1", "gpt", 4, 2, 1, 4, 2, 1},
	} {
		t.Run(l.name, func(t *testing.T) {
			if testing.Short() && l.ntasks > 2 {
				t.Skip("4 ranks")
			}
			cfg := smallConfig(l.model)
			if l.model == "gpt" {
				cfg.Data = textFile(t)
			}
			cfg.Layers, cfg.CkptEvery, cfg.Steps, cfg.EvalEvery = 4, -1, 6, 3
			cfg.NTasks, cfg.PP, cfg.TP, cfg.MicroBatches, cfg.BatchSize, cfg.Zero = l.ntasks, l.pp, l.tp, l.micro, l.bz, l.zero
			want, _, run, _ := hostAndSimulated(t, cfg)
			got, mem := run.res, run.mem
			// Per step each of the pp-1 links carries micro activations and
			// micro gradients, in every pipeline (dp x tp of them); each
			// validation pass one activation per batch.
			pipes := int64(cfg.NTasks / cfg.PP)
			train := int64(cfg.Steps) * int64(cfg.PP-1) * int64(2*cfg.Micro()) * pipes
			if n := mem.sends.Load(); n <= train || mem.exchanges.Load() == 0 {
				t.Errorf("%d device sends (%d paired), want the %d of training, the validations' and some pairs", n, mem.exchanges.Load(), train)
			}
			bitIdentical(t, "device pipeline", got[0].Losses, "host-staged", want[0].Losses)
			for i, e := range got[0].Evals {
				if w := want[0].Evals[i]; e.Loss != w.Loss {
					t.Errorf("validation %d: device pipeline %.17g, host-staged %.17g", i, e.Loss, w.Loss)
				}
			}
		})
	}
}
