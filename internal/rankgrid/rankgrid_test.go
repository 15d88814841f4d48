package rankgrid

import "testing"

func TestOf(t *testing.T) {
	for _, c := range []struct {
		rank, tp, dp int
		want         Coords
	}{
		{0, 1, 1, Coords{0, 0, 0}},
		{5, 1, 1, Coords{0, 0, 5}},
		{3, 2, 2, Coords{1, 1, 0}},
		{5, 2, 2, Coords{1, 0, 1}},
		{6, 2, 2, Coords{0, 1, 1}},
		{7, 4, 1, Coords{3, 0, 1}},
		{13, 2, 3, Coords{1, 0, 2}},
		{3, 0, 0, Coords{0, 0, 3}}, // unknown tp and dp count as 1
		{3, 2, 0, Coords{1, 0, 1}},
	} {
		got := Of(c.rank, c.tp, c.dp)
		if got != c.want {
			t.Errorf("Of(%d, tp %d, dp %d) = %+v, want %+v", c.rank, c.tp, c.dp, got, c.want)
		}
		if r := got.Rank(max(c.tp, 1), max(c.dp, 1)); r != c.rank {
			t.Errorf("%+v.Rank(%d, %d) = %d, want %d", got, c.tp, c.dp, r, c.rank)
		}
	}
}
