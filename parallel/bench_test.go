package parallel

import (
	"fmt"
	"testing"

	"github.com/hpcrun/hpcrun/nccl"
	"github.com/hpcrun/hpcrun/tensor"
)

// BenchmarkBlock times one block's forward and backward per rank at tp 1
// (the peer), 2 and 4 on in-process ranks: the sharded block does 1/tp of
// the FLOPs per rank plus 4 all-reduces of (B,T,C).
func BenchmarkBlock(b *testing.B) {
	const bs, t, c, nh = 4, 64, 256, 8
	for _, tp := range []int{1, 2, 4} {
		b.Run(fmt.Sprintf("tp%d", tp), func(b *testing.B) {
			err := nccl.RunInProcess(tp, func(comm nccl.Comm) error {
				dev := tensor.NewCPU()
				dev.SetThreads(1)
				blk, err := NewBlock(dev, comm, "h.0", BlockConfig{Dim: c, Heads: nh, Causal: true, Seed: 1})
				if err != nil {
					return err
				}
				x, _ := dev.Alloc(bs, t, c)
				dx, _ := dev.Alloc(bs, t, c)
				dev.Fill(x, 0.1)
				if comm.Rank() == 0 {
					b.ResetTimer()
				}
				for i := 0; i < b.N; i++ {
					out, err := blk.Forward(x, nil)
					if err != nil {
						return err
					}
					if err := blk.Backward(out, dx); err != nil {
						return err
					}
				}
				return nil
			})
			if err != nil {
				b.Fatal(err)
			}
		})
	}
}
