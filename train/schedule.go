package train

import "math"

// LRAt is the learning rate of optimizer step step (0-based) out of total:
// linear warm-up from lr/warmup to lr over the first warmup steps, then
// cosine decay to minRatio*lr at the last step.
func LRAt(step, total, warmup int, lr, minRatio float64) float64 {
	if step < warmup {
		return lr * float64(step+1) / float64(warmup)
	}
	span := total - warmup
	if span <= 1 {
		return lr
	}
	progress := float64(step-warmup) / float64(span-1)
	progress = math.Min(math.Max(progress, 0), 1)
	return minRatio*lr + (1-minRatio)*lr*0.5*(1+math.Cos(math.Pi*progress))
}
