package parallel

import (
	"slices"
	"testing"
)

func TestGradBuckets(t *testing.T) {
	for _, c := range []struct {
		sizes  []int64
		bucket int64
		want   []Bucket
	}{
		{nil, 5, nil},
		{[]int64{3, 3, 3}, 5, []Bucket{{1, 3, false}, {1, 3, false}, {1, 3, false}}},
		{[]int64{2, 3, 1}, 5, []Bucket{{2, 5, false}, {1, 1, false}}},
		{[]int64{2, 2, 9, 1}, 5, []Bucket{{2, 4, false}, {1, 9, false}, {1, 1, false}}}, // a larger one alone
		{[]int64{GradBucketElems / 2, GradBucketElems / 2, 1}, 0, []Bucket{{2, GradBucketElems, false}, {1, 1, false}}},
	} {
		if got := GradBuckets(c.sizes, c.bucket); !slices.Equal(got, c.want) {
			t.Errorf("GradBuckets(%v, %d) = %v, want %v", c.sizes, c.bucket, got, c.want)
		}
	}
}

// Each block is one bucket, whatever its size; the runs between blocks
// are GradBuckets' buckets.
func TestBlockBuckets(t *testing.T) {
	sizes := []int64{4, 1, 2, 3, 1, 2, 3, 5, 1}
	block := []int{-1, -1, 0, 0, 1, 1, 1, -1, -1}
	want := []Bucket{{2, 5, false}, {2, 5, true}, {3, 6, true}, {1, 5, false}, {1, 1, false}}
	if got := BlockBuckets(sizes, block, 5); !slices.Equal(got, want) {
		t.Errorf("BlockBuckets = %v, want %v", got, want)
	}
	if got, want := BlockBuckets(sizes[:2], block[:2], 5), GradBuckets(sizes[:2], 5); !slices.Equal(got, want) {
		t.Errorf("BlockBuckets without blocks = %v, GradBuckets %v", got, want)
	}
}
