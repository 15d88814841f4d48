// Package stats holds the summary statistics hpcrun's benchmarks and plan
// share, so that one rule computes each of them.
package stats

import "slices"

// Median is the middle value of xs, the mean of the two middle values when
// len(xs) is even, and 0 when xs is empty; xs is left unsorted.
func Median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	n := len(s)
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}
