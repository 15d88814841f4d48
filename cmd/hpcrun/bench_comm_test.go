package main

import "testing"

func TestParseBytes(t *testing.T) {
	for _, c := range []struct {
		in   string
		want int64
		bad  bool
	}{
		{"4096", 4096, false}, {"4KiB", 4096, false}, {"64MiB", 64 << 20, false}, {"1GiB", 1 << 30, false},
		{"2M", 2 << 20, false}, {"8B", 8, false}, {"", 0, true}, {"-4KiB", 0, true}, {"4 kb", 0, true},
	} {
		got, err := parseBytes(c.in)
		if (err != nil) != c.bad || got != c.want {
			t.Errorf("parseBytes(%q) = %d, %v; want %d (error %v)", c.in, got, err, c.want, c.bad)
		}
	}
}

func TestBenchSizesAndIters(t *testing.T) {
	s := benchSizes(4<<10, 64<<20)
	if len(s) != 8 || s[0] != 4<<10 || s[7] != 64<<20 {
		t.Fatalf("benchSizes = %v", s)
	}
	// Same rule as bench/mpi/mpi_allreduce.c: 256 MiB of traffic, 3..200 runs.
	for _, c := range []struct {
		bytes int64
		want  int
	}{{4 << 10, 200}, {1 << 20, 200}, {64 << 20, 4}, {256 << 20, 3}} {
		if got := benchIters(c.bytes); got != c.want {
			t.Errorf("benchIters(%d) = %d, want %d", c.bytes, got, c.want)
		}
	}
}
