package parallel

import "fmt"

// PipeOp is one operation of a pipeline stage's schedule: the forward or
// the backward pass of one micro-batch through the stage's layers.
type PipeOp struct {
	Backward bool // false: forward
	Micro    int  // micro-batch, 0-based
}

// String writes the op as F3 or B3.
func (o PipeOp) String() string {
	if o.Backward {
		return fmt.Sprintf("B%d", o.Micro)
	}
	return fmt.Sprintf("F%d", o.Micro)
}

// OneFOneB is the order of operations of stage (0-based) of a pipeline of
// stages stages running micro micro-batches in the 1F1B schedule
// (PipeDream-Flush, Narayanan et al. arXiv 2104.04473 fig. 4): a warm-up of
// min(stages-stage-1, micro) forwards, a steady state alternating one
// forward and one backward, and a cool-down of the backwards left. At most
// stages-stage micro-batches are in flight on a stage (forwarded, not yet
// backwarded). Every micro-batch is forwarded and backwarded in order.
func OneFOneB(stages, stage, micro int) []PipeOp {
	warm := min(stages-stage-1, micro)
	ops := make([]PipeOp, 0, 2*micro)
	for i := 0; i < warm; i++ {
		ops = append(ops, PipeOp{Micro: i})
	}
	for i := 0; i < micro-warm; i++ {
		ops = append(ops, PipeOp{Micro: warm + i}, PipeOp{Backward: true, Micro: i})
	}
	for i := micro - warm; i < micro; i++ {
		ops = append(ops, PipeOp{Backward: true, Micro: i})
	}
	return ops
}

// BubbleFraction is the idle share of a pipeline step of stages stages and
// micro micro-batches when forward and backward take the same time on
// every stage: (p-1)/(m+p-1).
func BubbleFraction(stages, micro int) float64 {
	if stages < 1 || micro < 1 {
		return 0
	}
	return float64(stages-1) / float64(micro+stages-1)
}
