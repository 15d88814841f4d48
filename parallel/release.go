package parallel

// Release methods free a layer's activation buffers, its backward scratch
// (shared with its shadows) and communication scratch, never its
// parameters: a caller that keeps the device after the model, such as a
// benchmark, releases the layers with them, and a pipeline stage its
// shadows. The next Forward or Backward allocates what it needs again.

// Release frees the gather scratch.
func (o *GatherFromRegion) Release() {
	if o.scratch != nil {
		o.scratch.Device().Free(o.scratch)
		o.scratch = nil
	}
}

// Release frees the gather scratch and the gathered gradient.
func (o *ScatterToRegion) Release() {
	o.gather.Release()
	if o.tmp != nil {
		o.tmp.Device().Free(o.tmp)
		o.tmp = nil
	}
}

// Release frees the layer's activation buffers.
func (l *ColumnParallelLinear) Release() {
	l.bufs.release()
	l.grads.release()
	l.gather.Release()
}

// Release frees the layer's activation buffers.
func (l *RowParallelLinear) Release() {
	l.bufs.release()
	l.grads.release()
	l.scatter.Release()
}

// Release frees the layer's activation buffers.
func (a *ParallelSelfAttention) Release() {
	a.bufs.release()
	a.grads.release()
	a.QKV.Release()
	a.Proj.Release()
}

// Release frees the layer's activation buffers.
func (m *ParallelMLP) Release() {
	m.bufs.release()
	m.grads.release()
	m.FC.Release()
	m.Proj.Release()
}

// Release frees the layer's activation buffers.
func (l *LayerNorm) Release() { l.bufs.release() }

// Release frees the block's activation buffers and its layers'.
func (b *Block) Release() {
	b.bufs.release()
	b.grads.release()
	b.LN1.Release()
	b.LN2.Release()
	b.Attn.Release()
	b.MLP.Release()
}

// Release frees the layer's activation buffers.
func (p *PositionEmbedding) Release() { p.bufs.release() }

// Release frees the layer's activation buffers.
func (e *VocabParallelEmbedding) Release() { e.bufs.release() }

// Release frees the loss's buffers.
func (c *VocabParallelCrossEntropy) Release() { c.bufs.release() }
