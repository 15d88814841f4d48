// Package chart draws the curves of a run (loss, accuracy and throughput
// against steps) in the terminal, fitting a given width, and as a PNG image.
package chart

import (
	"errors"
	"fmt"
	"io"
	"math"
	"strings"
	"unicode/utf8"

	"github.com/guptarohit/asciigraph"
	"github.com/hpcrun/hpcrun/train/metrics"
)

// series is one curve to draw: x and y of equal length, NaNs dropped.
type series struct {
	title string
	x, y  []float64
	color int // index in palette, the same for a curve whatever is drawn beside it
}

func curves(c metrics.Curves) []series {
	all := []series{
		{"training loss", floats(c.Steps), floats(c.Loss), 0},
		{"validation accuracy", floats(c.EvalSteps), floats(c.Accuracy), 1},
		{"throughput (samples/s)", floats(c.Steps), floats(c.SamplesPerS), 2},
	}
	var out []series
	for _, s := range all {
		var x, y []float64
		for i := range s.y {
			if !math.IsNaN(s.y[i]) && !math.IsInf(s.y[i], 0) {
				x, y = append(x, s.x[i]), append(y, s.y[i])
			}
		}
		if len(y) > 0 {
			out = append(out, series{s.title, x, y, s.color})
		}
	}
	return out
}

func floats(f []metrics.Float) []float64 {
	out := make([]float64, len(f))
	for i, v := range f {
		out[i] = float64(v)
	}
	return out
}

// ErrNoData is returned when a run has no finished step to draw.
var ErrNoData = errors.New("nothing to plot yet: no step finished by every rank")

// Terminal draws each curve as a text chart no wider than width columns
// (at least 40), each height rows high.
func Terminal(w io.Writer, c metrics.Curves, width, height int) error {
	ss := curves(c)
	if len(ss) == 0 {
		return ErrNoData
	}
	width = max(width, 40)
	var b strings.Builder
	for i, s := range ss {
		if i > 0 {
			b.WriteString("\n")
		}
		b.WriteString(fit(s, width, height))
		b.WriteString("\n")
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// fit draws s, shrinking the plot area until the labels and the axis fit.
func fit(s series, width, height int) string {
	data := s.y
	if len(data) == 1 {
		data = []float64{data[0], data[0]}
	}
	caption := fmt.Sprintf("%s, steps %g to %g", s.title, s.x[0], s.x[len(s.x)-1])
	plotW := width - 10
	for {
		out := asciigraph.Plot(data, asciigraph.Width(plotW), asciigraph.Height(height),
			asciigraph.Precision(precision(data)), asciigraph.Caption(caption))
		widest := 0
		for _, line := range strings.Split(out, "\n") {
			widest = max(widest, utf8.RuneCountInString(line))
		}
		if widest <= width || plotW <= 10 {
			return out
		}
		plotW -= widest - width
	}
}

// precision gives the axis labels about four significant digits.
func precision(y []float64) uint {
	lo, hi := y[0], y[0]
	for _, v := range y {
		lo, hi = min(lo, v), max(hi, v)
	}
	span := hi - lo
	if span <= 0 {
		span = math.Abs(hi)
	}
	if span <= 0 {
		return 2
	}
	p := 3 - int(math.Floor(math.Log10(span)))
	return uint(min(max(p, 0), 6))
}
