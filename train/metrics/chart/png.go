package chart

import (
	"fmt"
	"io"

	"github.com/hpcrun/hpcrun/internal/atomicfile"
	"github.com/hpcrun/hpcrun/train/metrics"
	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
)

// PNG writes the curves of one run as a PNG image: one panel per curve,
// stacked, under title. The file is written to a temporary name and renamed.
func PNG(path string, c metrics.Curves, title string) error {
	ss := curves(c)
	if len(ss) == 0 {
		return ErrNoData
	}
	const w, panelH = 8 * vg.Inch, 2.6 * vg.Inch
	img := vgimg.NewWith(vgimg.UseWH(w, panelH*vg.Length(len(ss))), vgimg.UseDPI(110))
	dc := draw.New(img)
	tiles := draw.Tiles{Rows: len(ss), Cols: 1, PadTop: vg.Points(6), PadBottom: vg.Points(6), PadX: vg.Points(8), PadY: vg.Points(10)}
	// One step axis for all panels, so that evals line up with the loss.
	xmin, xmax := ss[0].x[0], ss[0].x[len(ss[0].x)-1]
	for _, s := range ss {
		xmin, xmax = min(xmin, s.x[0]), max(xmax, s.x[len(s.x)-1])
	}
	plots := make([][]*plot.Plot, len(ss))
	for i, s := range ss {
		p := plot.New()
		if i == 0 {
			p.Title.Text = title
		}
		p.Y.Label.Text = s.title
		p.X.Label.Text = "step"
		p.Add(plotter.NewGrid())
		pts := make(plotter.XYs, len(s.x))
		for j := range s.x {
			pts[j].X, pts[j].Y = s.x[j], s.y[j]
		}
		line, err := plotter.NewLine(pts)
		if err != nil {
			return fmt.Errorf("plot %s: %w", s.title, err)
		}
		line.Color = palette[s.color]
		line.Width = vg.Points(1.5)
		p.Add(line)
		p.X.Min, p.X.Max = xmin, xmax
		if len(pts) <= 60 {
			sc, err := plotter.NewScatter(pts)
			if err == nil {
				sc.Color = line.Color
				sc.Radius = vg.Points(2)
				p.Add(sc)
			}
		}
		plots[i] = []*plot.Plot{p}
	}
	canvases := plot.Align(plots, tiles, dc)
	for i := range plots {
		plots[i][0].Draw(canvases[i][0])
	}
	return atomicfile.Write(path, 0o644, func(w io.Writer) error {
		_, err := (vgimg.PngCanvas{Canvas: img}).WriteTo(w)
		return err
	})
}
