package data

import (
	"slices"
	"testing"
)

func TestSamplerDisjointAndComplete(t *testing.T) {
	for _, tt := range []struct {
		n, replicas int
		dropLast    bool
		perRank     int
	}{
		{10, 2, false, 5}, {11, 2, false, 6}, {11, 2, true, 5}, {7, 3, true, 2}, {7, 3, false, 3},
	} {
		seen := map[int]int{}
		for r := 0; r < tt.replicas; r++ {
			s, err := NewSampler(tt.n, tt.replicas, r, 42, true)
			if err != nil {
				t.Fatal(err)
			}
			s.DropLast = tt.dropLast
			idx := s.Epoch(3)
			if len(idx) != tt.perRank || s.Len() != tt.perRank {
				t.Fatalf("%+v rank %d: %d indices, want %d", tt, r, len(idx), tt.perRank)
			}
			if !slices.Equal(idx, s.Epoch(3)) {
				t.Fatalf("%+v: same epoch, other order", tt)
			}
			for _, i := range idx {
				seen[i]++
			}
		}
		total := 0
		for _, c := range seen {
			total += c
		}
		if total != tt.perRank*tt.replicas {
			t.Fatalf("%+v: %d indices in all", tt, total)
		}
		if tt.dropLast {
			for i, c := range seen {
				if c != 1 {
					t.Fatalf("%+v: index %d seen %d times", tt, i, c)
				}
			}
		} else if len(seen) != tt.n {
			t.Fatalf("%+v: %d distinct indices of %d", tt, len(seen), tt.n)
		}
	}
}

func TestSamplerShufflesPerEpoch(t *testing.T) {
	s, _ := NewSampler(100, 1, 0, 1, true)
	if slices.Equal(s.Epoch(0), s.Epoch(1)) {
		t.Fatal("epochs 0 and 1 have the same order")
	}
	if _, err := NewSampler(1, 2, 0, 1, true); err == nil {
		t.Fatal("1 sample for 2 ranks: no error")
	}
}

// TestSamplerInOrder checks that a sampler told not to shuffle gives rank r
// the indices r, r+replicas, ... in order, the same every epoch, the tail that
// does not divide among the ranks dropped.
func TestSamplerInOrder(t *testing.T) {
	for _, tt := range []struct {
		n, replicas, rank int
		want              []int
	}{
		{5, 1, 0, []int{0, 1, 2, 3, 4}},
		{7, 2, 0, []int{0, 2, 4}},
		{7, 2, 1, []int{1, 3, 5}},
		{8, 3, 2, []int{2, 5}},
	} {
		s, err := NewSampler(tt.n, tt.replicas, tt.rank, 42, false)
		if err != nil {
			t.Fatal(err)
		}
		for e := range 3 {
			if got := s.Epoch(e); !slices.Equal(got, tt.want) {
				t.Errorf("%d samples, rank %d of %d, epoch %d: %v, want %v", tt.n, tt.rank, tt.replicas, e, got, tt.want)
			}
		}
	}
}
