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

func TestParseBytes(t *testing.T) {
	for _, c := range []struct {
		in   string
		want int64
		bad  bool
	}{
		{"4096", 4096, false}, {"4KiB", 4096, false}, {"64MiB", 64 << 20, false}, {"1GiB", 1 << 30, false},
		{"2M", 2 << 20, false}, {"8B", 8, false}, {"", 0, true}, {"-4KiB", 0, true}, {"4 kb", 0, true},
	} {
		got, err := ParseBytes(c.in)
		if (err != nil) != c.bad || got != c.want {
			t.Errorf("ParseBytes(%q) = %d, %v; want %d (error %v)", c.in, got, err, c.want, c.bad)
		}
	}
}

func TestSizeReadsBack(t *testing.T) {
	for _, c := range []struct {
		n    int64
		want string
	}{{4 << 10, "4KiB"}, {64 << 20, "64MiB"}, {1 << 30, "1024MiB"}, {1000, "1000B"}, {1536, "1536B"}} {
		got := Size(c.n)
		if got != c.want {
			t.Errorf("Size(%d) = %q, want %q", c.n, got, c.want)
		}
		if back, err := ParseBytes(got); err != nil || back != c.n {
			t.Errorf("ParseBytes(Size(%d)) = %d, %v", c.n, back, err)
		}
	}
}

func TestCount(t *testing.T) {
	for n, want := range map[int]string{0: "0 tasks", 1: "1 task", 4: "4 tasks"} {
		if got := Count(n, "task"); got != want {
			t.Errorf("Count(%d) = %q, want %q", n, got, want)
		}
	}
}
