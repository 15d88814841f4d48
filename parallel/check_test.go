package parallel

import (
	"fmt"
	"testing"

	"github.com/hpcrun/hpcrun/nccl"
	"github.com/hpcrun/hpcrun/tensor"
)

// TestChecks runs every equivalence check at tp 1, 2 and 4 on in-process
// ranks: sharded layers against the unsharded ones.
func TestChecks(t *testing.T) {
	for _, tp := range []int{1, 2, 4} {
		t.Run(fmt.Sprintf("tp%d", tp), func(t *testing.T) {
			results := make([][]*Result, tp)
			err := nccl.RunInProcess(tp, func(c nccl.Comm) error {
				dev := tensor.NewCPU()
				dev.SetThreads(1)
				for _, ck := range Checks() {
					r, err := ck.Run(dev, c)
					if err != nil {
						return err
					}
					results[c.Rank()] = append(results[c.Rank()], r)
				}
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
			for i, r := range results[0] {
				for rk := 1; rk < tp; rk++ {
					if o := results[rk][i]; o.MaxErr() != r.MaxErr() || o.Pass() != r.Pass() {
						t.Errorf("%s: rank %d reports %g, rank 0 %g", r.Check, rk, o.MaxErr(), r.MaxErr())
					}
				}
				if !r.Pass() {
					t.Errorf("%s at tp=%d: %s max error %.3g %v", r.Check, tp, r.Fail, r.MaxErr(), r.Measures)
				} else if testing.Verbose() {
					t.Logf("%-30s tp=%d max %.2g %v", r.Check, tp, r.MaxErr(), r.Measures)
				}
			}
		})
	}
}

// TestCheckCanFail makes sure the harness sees a wrong layer: a sharded
// layer initialised from another seed, or one whose input gradient skips
// the all-reduce of f.
func TestCheckCanFail(t *testing.T) {
	err := nccl.RunInProcess(2, func(c nccl.Comm) error {
		dev := tensor.NewCPU()
		h := newHarness(dev, c)
		ref, err := NewColumnParallelLinear(dev, nil, "fc", ckDim, ckOut, LinearOptions{Seed: 1})
		if err != nil {
			return err
		}
		sh, err := NewColumnParallelLinear(dev, c, "fc", ckDim, ckOut, LinearOptions{Seed: 2})
		if err != nil {
			return err
		}
		h.runPair(linearPair(ref, sh), []int{ckB, ckT, ckDim}, Shard{Parts: 1}, h.lastDim([]int{ckB, ckT, ckOut}, 1))
		res, err := h.done()
		if err != nil {
			return err
		}
		if res.Pass() {
			return fmt.Errorf("a layer from another seed passed: %v", res.Measures)
		}

		h = newHarness(dev, c)
		if ref, err = NewColumnParallelLinear(dev, nil, "fc", ckDim, ckOut, LinearOptions{Seed: 1}); err != nil {
			return err
		}
		sh, err = NewColumnParallelLinear(dev, c, "fc", ckDim, ckOut, LinearOptions{Seed: 1})
		if err != nil {
			return err
		}
		sh.f = CopyToRegion(nil) // drop the backward all-reduce
		h.runPair(linearPair(ref, sh), []int{ckB, ckT, ckDim}, Shard{Parts: 1}, h.lastDim([]int{ckB, ckT, ckOut}, 1))
		if res, err = h.done(); err != nil {
			return err
		}
		if e, _ := res.Max("input gradient"); e < 0.1 {
			return fmt.Errorf("a column-parallel layer without f's all-reduce has input gradient error %g", e)
		}
		if e, _ := res.Max("forward output"); e > Tolerance {
			return fmt.Errorf("forward error %g, want it unaffected", e)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestChecksOnMesh runs checks on the TP groups of a 2x2 mesh at once, as
// `srun -n 4 hpcrun check all --tp 2` does.
func TestChecksOnMesh(t *testing.T) {
	err := nccl.RunInProcess(4, func(c nccl.Comm) error {
		m, err := NewMesh(c, 2)
		if err != nil {
			return err
		}
		defer m.Close()
		dev := tensor.NewCPU()
		for _, name := range []string{"Block", "BlockComm", "LMHead"} {
			cks, err := FindChecks(name)
			if err != nil {
				return err
			}
			r, err := cks[0].Run(dev, m.TP)
			if err != nil {
				return err
			}
			if !r.Pass() || r.TP != 2 {
				return fmt.Errorf("%s on %s: tp %d, %s %v", name, m, r.TP, r.Fail, r.Measures)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := FindChecks("nosuchlayer"); err == nil {
		t.Error("FindChecks of an unknown name: no error")
	}
	if cks, err := FindChecks("ALL"); err != nil || len(cks) != len(Checks()) {
		t.Errorf("FindChecks(ALL) = %d checks, %v", len(cks), err)
	}
}
