package grid

import (
	"slices"
	"testing"
)

func labels(ps []Point) []string {
	out := make([]string, len(ps))
	for i, p := range ps {
		out[i] = p.Label()
	}
	return out
}

func TestProduct(t *testing.T) {
	order := []string{"preset", "tp", "bsz"}
	for _, c := range []struct {
		name   string
		values map[string][]string
		want   []string
	}{
		{"no axis", map[string][]string{}, []string{""}},
		{"one axis", map[string][]string{"tp": {"1", "2", "4"}}, []string{"tp=1", "tp=2", "tp=4"}},
		{"first varies slowest", map[string][]string{"bsz": {"8", "16"}, "preset": {"tiny", "small"}},
			[]string{"preset=tiny bsz=8", "preset=tiny bsz=16", "preset=small bsz=8", "preset=small bsz=16"}},
		{"three axes", map[string][]string{"preset": {"tiny"}, "tp": {"1", "2"}, "bsz": {"8", "16"}},
			[]string{"preset=tiny tp=1 bsz=8", "preset=tiny tp=1 bsz=16", "preset=tiny tp=2 bsz=8", "preset=tiny tp=2 bsz=16"}},
		{"names outside the order are no axis", map[string][]string{"tp": {"2"}, "lr": {"1e-3", "1e-4"}}, []string{"tp=2"}},
		{"an empty axis empties the grid", map[string][]string{"tp": {"2"}, "bsz": {}}, []string{}},
	} {
		if got := labels(Product(order, c.values)); !slices.Equal(got, c.want) {
			t.Errorf("%s: %q, want %q", c.name, got, c.want)
		}
	}
}

// Points share no storage: setting one does not change another.
func TestProductPointsAreIndependent(t *testing.T) {
	ps := Product([]string{"a", "b"}, map[string][]string{"a": {"1", "2"}, "b": {"x", "y", "z"}})
	ps[0][1].Value = "changed"
	if got := labels(ps); !slices.Equal(got, []string{"a=1 b=changed", "a=1 b=y", "a=1 b=z", "a=2 b=x", "a=2 b=y", "a=2 b=z"}) {
		t.Errorf("after changing point 0: %q", got)
	}
}
