package dashboard

import (
	"fmt"
	"html"
	"html/template"
	"math"
	"strconv"
	"strings"
)

// Series is one line of a chart.
type Series struct {
	Name string
	X, Y []float64 // same length; NaN or infinite Y values leave a gap
}

// Chart is a line chart drawn by the server as inline SVG.
type Chart struct {
	ID     string // the svg's data-chart, for the page's script and the tests
	Title  string
	XLabel string
	YLabel string
	Series []Series
	// Note is shown after the title (e.g. "comm 42% of step time").
	Note string
}

// maxPoints is how many points a series keeps at most: more than a chart
// a few hundred pixels wide can show.
const maxPoints = 600

// Chart geometry, in SVG user units.
const (
	chartW, chartH         = 480, 232
	padL, padR, padT, padB = 58, 12, 38, 34
	plotW, plotH           = chartW - padL - padR, chartH - padT - padB
	seriesColors           = 8
	tickCountX, tickCountY = 5, 4
	strokeWidth            = 1.5
)

// palette is the series colors, by index (colorblind-safe, Okabe-Ito).
var palette = [seriesColors]string{"#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#000000", "#F0E442"}

// SVG renders the chart. A chart with no finite point says so instead of
// drawing empty axes.
func (c Chart) SVG() template.HTML {
	var b strings.Builder
	n := 0
	x0, x1, y0, y1 := math.Inf(1), math.Inf(-1), math.Inf(1), math.Inf(-1)
	for _, s := range c.Series {
		for i := range s.X {
			if !finite(s.Y[i]) || !finite(s.X[i]) {
				continue
			}
			n++
			x0, x1 = min(x0, s.X[i]), max(x1, s.X[i])
			y0, y1 = min(y0, s.Y[i]), max(y1, s.Y[i])
		}
	}
	points := 0
	if len(c.Series) > 0 {
		points = len(c.Series[0].X)
	}
	// The legend (several series) wraps into rows under the title; the
	// plot moves down by the rows past the first.
	legend := legendRows(c.Series)
	extra := max(len(legend)-1, 0) * legendRow
	top, height := padT+extra, chartH+extra
	fmt.Fprintf(&b, `<figure class="chart"><svg viewBox="0 0 %d %d" role="img" data-chart="%s" data-points="%d" data-last="%s">`,
		chartW, height, html.EscapeString(c.ID), points, lastValue(c.Series))
	title := c.Title
	if c.Note != "" {
		title += " · " + c.Note
	}
	fmt.Fprintf(&b, `<text class="title" x="%d" y="16">%s</text>`, padL, html.EscapeString(title))
	if n == 0 {
		fmt.Fprintf(&b, `<text class="empty" x="%d" y="%d">no data yet</text></svg></figure>`, chartW/2, height/2)
		return template.HTML(b.String())
	}
	if x1 == x0 {
		x0, x1 = x0-1, x1+1
	}
	if y1 == y0 {
		d := math.Max(math.Abs(y0)*0.1, 1e-9)
		y0, y1 = y0-d, y1+d
	}
	yt := niceTicks(y0, y1, tickCountY)
	y0, y1 = math.Min(y0, yt[0]), math.Max(y1, yt[len(yt)-1])
	xt := niceTicks(x0, x1, tickCountX)
	sx := func(x float64) float64 { return padL + (x-x0)/(x1-x0)*plotW }
	sy := func(y float64) float64 { return float64(top+plotH) - (y-y0)/(y1-y0)*plotH }

	b.WriteString(`<g class="grid">`)
	for _, t := range yt {
		fmt.Fprintf(&b, `<line x1="%d" x2="%d" y1="%.1f" y2="%.1f"/><text class="ytick" x="%d" y="%.1f">%s</text>`,
			padL, padL+plotW, sy(t), sy(t), padL-4, sy(t)+3, tickLabel(t))
	}
	for _, t := range xt {
		if t < x0 || t > x1 {
			continue
		}
		fmt.Fprintf(&b, `<text class="xtick" x="%.1f" y="%d">%s</text>`, sx(t), top+plotH+14, tickLabel(t))
	}
	fmt.Fprintf(&b, `<rect class="frame" x="%d" y="%d" width="%d" height="%d"/>`, padL, top, plotW, plotH)
	fmt.Fprintf(&b, `<text class="xlabel" x="%d" y="%d">%s</text>`, padL+plotW/2, height-4, html.EscapeString(c.XLabel))
	fmt.Fprintf(&b, `<text class="ylabel" x="12" y="%d" transform="rotate(-90 12 %d)">%s</text>`, top+plotH/2, top+plotH/2, html.EscapeString(c.YLabel))
	b.WriteString(`</g>`)

	for i, s := range c.Series {
		color := palette[i%seriesColors]
		fmt.Fprintf(&b, `<g class="series" data-series="%s"><title>%s</title>`, html.EscapeString(s.Name), html.EscapeString(s.Name))
		var path strings.Builder
		pen := false
		single := -1
		for j := range s.X {
			if !finite(s.Y[j]) || !finite(s.X[j]) {
				pen = false
				continue
			}
			cmd := 'L'
			if !pen {
				cmd = 'M'
			}
			fmt.Fprintf(&path, "%c%.1f %.1f", cmd, sx(s.X[j]), sy(s.Y[j]))
			pen = true
			single = j
		}
		fmt.Fprintf(&b, `<path d="%s" fill="none" stroke="%s" stroke-width="%.1f"/>`, path.String(), color, strokeWidth)
		if len(s.X) <= 40 && single >= 0 {
			// Few points (evaluations): mark each.
			for j := range s.X {
				if finite(s.Y[j]) {
					fmt.Fprintf(&b, `<circle cx="%.1f" cy="%.1f" r="2.5" fill="%s"/>`, sx(s.X[j]), sy(s.Y[j]), color)
				}
			}
		}
		b.WriteString(`</g>`)
	}
	for r, row := range legend {
		y := 27 + r*legendRow
		for _, it := range row {
			fmt.Fprintf(&b, `<line class="swatch" x1="%d" x2="%d" y1="%d" y2="%d" stroke="%s" stroke-width="3"/><text class="legend" x="%d" y="%d">%s</text>`,
				it.x, it.x+12, y, y, palette[it.series%seriesColors], it.x+15, y+4, html.EscapeString(c.Series[it.series].Name))
		}
	}
	b.WriteString(`</svg></figure>`)
	return template.HTML(b.String())
}

// legendRow is the height of a row of the legend.
const legendRow = 14

// legendItem is one series' swatch and name, at x in its row.
type legendItem struct{ series, x int }

// legendRows lays the names of several series out in rows as wide as the
// plot (none for one series): a name is about 6 units a character.
func legendRows(ss []Series) [][]legendItem {
	if len(ss) < 2 {
		return nil
	}
	var rows [][]legendItem
	var row []legendItem
	x := padL
	for i, s := range ss {
		w := 15 + 6*len(s.Name) + 12
		if len(row) > 0 && x+w > chartW-padR {
			rows, row, x = append(rows, row), nil, padL
		}
		row = append(row, legendItem{i, x})
		x += w
	}
	return append(rows, row)
}

// lastValue is the last finite value of the first series, for tests and
// the curious ("" without one).
func lastValue(ss []Series) string {
	if len(ss) == 0 {
		return ""
	}
	y := ss[0].Y
	for i := len(y) - 1; i >= 0; i-- {
		if finite(y[i]) {
			return strconv.FormatFloat(y[i], 'g', -1, 64)
		}
	}
	return ""
}

func finite(v float64) bool { return !math.IsNaN(v) && !math.IsInf(v, 0) }

// niceTicks is about n round values from lo to hi (1, 2 or 5 times a
// power of ten apart), covering both.
func niceTicks(lo, hi float64, n int) []float64 {
	step := niceStep((hi - lo) / float64(n))
	first, last := math.Floor(lo/step), math.Ceil(hi/step)
	var t []float64
	for k := first; k <= last && len(t) < 4*n; k++ {
		t = append(t, k*step)
	}
	return t
}

func niceStep(raw float64) float64 {
	if raw <= 0 || !finite(raw) {
		return 1
	}
	p := math.Pow(10, math.Floor(math.Log10(raw)))
	switch f := raw / p; {
	case f <= 1:
		return p
	case f <= 2:
		return 2 * p
	case f <= 5:
		return 5 * p
	}
	return 10 * p
}

// tickLabel writes a tick value short: 1.2k, 3M, 0.001, 2e-06.
func tickLabel(v float64) string {
	a := math.Abs(v)
	switch {
	case v == 0:
		return "0"
	case a >= 1e9:
		return strconv.FormatFloat(v/1e9, 'g', 3, 64) + "G"
	case a >= 1e6:
		return strconv.FormatFloat(v/1e6, 'g', 3, 64) + "M"
	case a >= 1e4:
		return strconv.FormatFloat(v/1e3, 'g', 3, 64) + "k"
	case a < 1e-3:
		return strconv.FormatFloat(v, 'e', 0, 64)
	}
	return strconv.FormatFloat(v, 'g', 4, 64)
}

// thin keeps at most maxPoints points of x and y, evenly spaced, the last
// included.
func thin(x, y []float64) ([]float64, []float64) {
	n := len(x)
	if n <= maxPoints {
		return x, y
	}
	stride := (n + maxPoints - 1) / maxPoints
	var tx, ty []float64
	for i := 0; i < n; i += stride {
		tx, ty = append(tx, x[i]), append(ty, y[i])
	}
	if (n-1)%stride != 0 {
		tx, ty = append(tx, x[n-1]), append(ty, y[n-1])
	}
	return tx, ty
}
