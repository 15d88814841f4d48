package parallel

// Shadow methods make a second copy of a layer for another input in
// flight, as a pipeline stage holds the activations of several
// micro-batches (1F1B): the shadow shares the layer's parameters (Data
// and Grad, so its Backward accumulates into the same gradients), its
// communication operators and its scratch (nothing in it outlives the
// call that wrote it), and owns what Forward keeps for Backward (saved
// inputs, outputs, masks, softmax statistics), made on its first Forward.
// A layer and its shadows may run Forward and Backward in any interleaving,
// one call at a time: each Backward uses what its own Forward saved.
// Releasing a shadow frees its buffers (and the shared scratch, made again
// on the next Backward), never the parameters.

// Shadow returns a copy of the layer norm with its own saved activations.
func (l *LayerNorm) Shadow() *LayerNorm {
	c := *l
	c.lnSaved = new(lnSaved)
	return &c
}

// Shadow returns a copy of the layer with its own saved activations.
func (l *ColumnParallelLinear) Shadow() *ColumnParallelLinear {
	c := *l
	c.colSaved = new(colSaved)
	return &c
}

// Shadow returns a copy of the layer with its own saved activations.
func (l *RowParallelLinear) Shadow() *RowParallelLinear {
	c := *l
	c.rowSaved = new(rowSaved)
	return &c
}

// Shadow returns a copy of the layer with its own saved activations.
func (a *ParallelSelfAttention) Shadow() *ParallelSelfAttention {
	c := *a
	c.attnSaved = new(attnSaved)
	c.QKV, c.Proj = a.QKV.Shadow(), a.Proj.Shadow()
	return &c
}

// Shadow returns a copy of the layer with its own saved activations.
func (m *ParallelMLP) Shadow() *ParallelMLP {
	c := *m
	c.mlpSaved = new(mlpSaved)
	c.FC, c.Proj = m.FC.Shadow(), m.Proj.Shadow()
	return &c
}

// Shadow returns a copy of the block with its own saved activations
// (under full recomputation only its output: its layers' buffers are
// shared, see ShareBuffers).
func (b *Block) Shadow() *Block {
	c := *b
	c.blockSaved = blockSaved{}
	if b.recompute != RecomputeFull {
		c.LN1, c.Attn, c.LN2, c.MLP = b.LN1.Shadow(), b.Attn.Shadow(), b.LN2.Shadow(), b.MLP.Shadow()
	}
	c.bind()
	return &c
}

// Shadow returns a copy of the embedding with its own saved ids and output.
func (e *VocabParallelEmbedding) Shadow() *VocabParallelEmbedding {
	c := *e
	c.embSaved = embSaved{}
	return &c
}

// Shadow returns a copy of the position embedding with its own output.
func (p *PositionEmbedding) Shadow() *PositionEmbedding {
	c := *p
	c.posSaved = posSaved{}
	return &c
}
