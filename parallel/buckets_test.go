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
		{[]int64{3, 3, 3}, 5, []Bucket{{1, 3}, {1, 3}, {1, 3}}},
		{[]int64{2, 3, 1}, 5, []Bucket{{2, 5}, {1, 1}}},
		{[]int64{2, 2, 9, 1}, 5, []Bucket{{2, 4}, {1, 9}, {1, 1}}}, // a larger one alone
		{[]int64{GradBucketElems / 2, GradBucketElems / 2, 1}, 0, []Bucket{{2, GradBucketElems}, {1, 1}}},
	} {
		if got := GradBuckets(c.sizes, c.bucket); !slices.Equal(got, c.want) {
			t.Errorf("GradBuckets(%v, %d) = %v, want %v", c.sizes, c.bucket, got, c.want)
		}
	}
}
