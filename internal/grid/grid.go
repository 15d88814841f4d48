// Package grid is the product of a sweep's axes: each axis a setting's
// name and its values, each point of the grid one value of every axis.
package grid

import (
	"slices"
	"strings"
)

// Setting is one axis's value at a point.
type Setting struct{ Name, Value string }

// Point is one value of every axis, in the axes' order.
type Point []Setting

// Product is every point of the axes values[name] for name in order, the
// first varying slowest; names without values are no axis. No axis at all
// is one empty point.
func Product(order []string, values map[string][]string) []Point {
	out := []Point{nil}
	for _, name := range order {
		vals, ok := values[name]
		if !ok {
			continue
		}
		next := make([]Point, 0, len(out)*len(vals))
		for _, p := range out {
			for _, v := range vals {
				next = append(next, append(slices.Clip(p), Setting{name, v}))
			}
		}
		out = next
	}
	return out
}

// Label is the point as its name=value pairs: "preset=tiny tp=2 bsz=8".
func (p Point) Label() string {
	parts := make([]string, len(p))
	for i, s := range p {
		parts[i] = s.Name + "=" + s.Value
	}
	return strings.Join(parts, " ")
}
