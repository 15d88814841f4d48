package units

import (
	"math"
	"testing"
)

func TestBytes(t *testing.T) {
	for _, c := range []struct {
		n        int64
		decimals int
		want     string
	}{
		{0, 2, "0 B"},
		{1023, 2, "1023 B"},
		{1024, 2, "1.00 KiB"},
		{1536, 1, "1.5 KiB"},
		{52 << 20, 1, "52.0 MiB"},
		{1<<20 - 1, 2, "1024.00 KiB"}, // rounds up, stays in the smaller unit
		{3 << 30, 2, "3.00 GiB"},
		{5 << 40, 1, "5.0 TiB"},
		{-(3 << 29), 2, "-1.50 GiB"},
		{-5, 2, "-5 B"},
		{math.MinInt64, 0, "-8388608 TiB"},
	} {
		if got := Bytes(c.n, c.decimals); got != c.want {
			t.Errorf("Bytes(%d, %d) = %q, want %q", c.n, c.decimals, got, c.want)
		}
	}
}
