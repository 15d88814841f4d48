package spec

import (
	"github.com/hpcrun/hpcrun/parallel"
	"github.com/hpcrun/hpcrun/train/config"
)

// The model's part of the size table (parallel.Sizes has the layers'):
// the buffers train's transformer and its pipeline allocate themselves,
// which train allocates by iterating these lists and train/plan sums.

// ModelBuffers are the buffers train's transformer (models gpt and bert;
// for arch hf, the same count of train/bert.go's, which adds dy, dx's
// ping-pong partner) allocates itself on a rank, beside its layers', for one
// micro-batch; last says the rank's stage holds ln_f and the head (every
// rank without a pipeline). All are backward scratch, shared by the copies
// of a pipeline stage. stream are the residual stream's gradients: dx
// (B,T,C), which each block turns in place into the gradient of its input
// (parallel.Block.BackwardInPlace), stored as the stream (Residual: the
// norms' backward round into it), and on the last stage dh (B,T,C), ln_f's output gradient (T/tp
// positions each under sequence parallelism), stored as the stream too
// for an LM (float32 for bert, whose pooling writes it). head are the
// head's: none for an LM (the loss writes the gradient of the logits over
// them: the fused classifier); for bert the pooling matrix pool (B, B*T)
// (B*T/tp under sequence parallelism: it pools this rank's positions),
// the pooled mean and its gradient (B,1,C), GELU's output h1g, its
// gradient and fc1's output gradient (B,1,C/tp), and the logits'
// gradient (B,1,config.NumClasses).
func ModelBuffers(c config.Config, last bool) (stream, head parallel.Buffers) {
	B, Tl, C, tp := c.BatchSize, c.LocalSeq(), c.Dim, max(c.TP, 1)
	res := Residual(c)
	stream = parallel.Buffers{{Name: "dx", Shape: []int{B, Tl, C}, DType: res}}
	if c.Arch == "hf" {
		// BERT's post-norm layers (train/bert.go) ping-pong dx and dy.
		stream = append(stream, parallel.Buffer{Name: "dy", Shape: []int{B, Tl, C}, DType: res})
	}
	if !last {
		return stream, nil
	}
	if c.LM() {
		// The LM head's input-gradient product rounds into it.
		return append(stream, parallel.Buffer{Name: "dh", Shape: []int{B, Tl, C}, DType: res}), nil
	}
	// The classifier's pooling writes it from float32 operands.
	stream = append(stream, parallel.Buffer{Name: "dh", Shape: []int{B, Tl, C}})
	cl := C / tp
	head = parallel.Buffers{
		{Name: "pool", Shape: []int{B, B * Tl}},
		{Name: "pooled", Shape: []int{B, 1, C}}, {Name: "dpooled", Shape: []int{B, 1, C}},
		{Name: "h1g", Shape: []int{B, 1, cl}}, {Name: "dh1g", Shape: []int{B, 1, cl}}, {Name: "dh1", Shape: []int{B, 1, cl}},
		{Name: "dlogits", Shape: []int{B, 1, config.NumClasses}},
	}
	return stream, head
}

// StageActivation is what a pipeline stage sends the next stage and
// receives from the previous one, a micro-batch's (B,T,C) activations (its
// T/tp positions under sequence parallelism), stored as the residual
// stream (Residual: bf16 at bf16, which the link carries as it is); the
// gradients going back are received into the model's own stream buffers.
// A stage that is not the first keeps the input of every micro-batch in
// flight, one such buffer each, and one that is not the last copies its
// output into a send buffer of its own.
func StageActivation(c config.Config) parallel.Buffer {
	b := parallel.Buffer{Name: "stage_act", Shape: []int{c.BatchSize, c.LocalSeq(), c.Dim}}
	b.DType = Residual(c)
	return b
}
