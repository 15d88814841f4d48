package dashboard

import (
	"fmt"
	"math"
	"strconv"

	"github.com/hpcrun/hpcrun/internal/units"
	"github.com/hpcrun/hpcrun/train/metrics"
)

// The page's number formats; every figure also carries its exact value in
// a data-value attribute.

func num(f metrics.Float) string {
	v := float64(f)
	if !f.Known() {
		return "–"
	}
	a := math.Abs(v)
	switch {
	case a >= 1e9:
		return fmt.Sprintf("%.2fG", v/1e9)
	case a >= 1e6:
		return fmt.Sprintf("%.2fM", v/1e6)
	case a >= 1e4:
		return fmt.Sprintf("%.1fk", v/1e3)
	case a >= 1e3: // "4.38k" beside "12.6k", not "4377.8"
		return fmt.Sprintf("%.2fk", v/1e3)
	case a >= 100:
		return fmt.Sprintf("%.1f", v)
	case a == 0:
		return "0"
	case a < 1e-3:
		return fmt.Sprintf("%.2e", v)
	}
	return strconv.FormatFloat(v, 'g', 4, 64)
}

func pct(f metrics.Float) string {
	if !f.Known() {
		return "–"
	}
	return fmt.Sprintf("%.1f%%", 100*float64(f))
}

func dur(f metrics.Float) string {
	v := float64(f)
	switch {
	case !f.Known():
		return "–"
	case v < 1e-3:
		return fmt.Sprintf("%.0f µs", v*1e6)
	case v < 1:
		return fmt.Sprintf("%.1f ms", v*1e3)
	case v < 120:
		return fmt.Sprintf("%.2f s", v)
	}
	return fmt.Sprintf("%dm%02ds", int(v)/60, int(v)%60)
}

// size is units.Bytes with one decimal, "–" for nothing recorded.
func size(n int64) string {
	if n <= 0 {
		return "–"
	}
	return units.Bytes(n, 1)
}

// exact is a figure's data-value: the shortest decimal that reads back as
// the same float64, without an exponent ("" when unknown).
func exact(f metrics.Float) string {
	if !f.Known() {
		return ""
	}
	return strconv.FormatFloat(float64(f), 'f', -1, 64)
}
