package config

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

// ScheduleLR is the learning rate of step (0-based) out of total under the
// config's schedule: warm-up, then cosine (default) or linear decay to
// min_lr (lr/10 when 0), or constant.
func ScheduleLR(cfg Config, step, total int) float64 {
	minLR := cfg.MinLR
	if minLR == 0 {
		minLR = cfg.LR / 10
	}
	switch cfg.Schedule {
	case "constant":
		return LRAt(step, total, cfg.Warmup, cfg.LR, 1)
	case "linear":
		if step < cfg.Warmup {
			return LRAt(step, total, cfg.Warmup, cfg.LR, 1)
		}
		span := total - cfg.Warmup
		if span <= 1 {
			return cfg.LR
		}
		progress := math.Min(math.Max(float64(step-cfg.Warmup)/float64(span-1), 0), 1)
		return cfg.LR + (minLR-cfg.LR)*progress
	}
	return LRAt(step, total, cfg.Warmup, cfg.LR, minLR/cfg.LR)
}
