package idrenv

import (
	"fmt"
	"slices"
	"strings"
	"testing"
)

func TestExpandTasksPerNode(t *testing.T) {
	tests := []struct {
		in   string
		want []int
	}{
		{"4", []int{4}},
		{"2(x3),1", []int{2, 2, 2, 1}},
		{"1,2(x2),3", []int{1, 2, 2, 3}},
		{"8(x1)", []int{8}},
		{"0,1", []int{0, 1}},
		{"16(x4)", []int{16, 16, 16, 16}},
	}
	for _, tt := range tests {
		got, err := ExpandTasksPerNode(tt.in)
		if err != nil || !slices.Equal(got, tt.want) {
			t.Errorf("ExpandTasksPerNode(%q) = %v, %v; want %v", tt.in, got, err, tt.want)
		}
	}
}

func TestExpandTasksPerNodeErrors(t *testing.T) {
	for _, in := range []string{"", ",", "2,", ",2", "2(x3", "2(x)", "2(x0)", "(x2)", "2x3", "a", "-1", "2(x-1)", "1 ,2", "2(x3)1", "99999999999999999999", "1(x2000000)"} {
		got, err := ExpandTasksPerNode(in)
		if err == nil {
			t.Errorf("ExpandTasksPerNode(%q) = %v, want an error", in, got)
			continue
		}
		if in != "" && !strings.Contains(err.Error(), fmt.Sprintf("%q", in)) {
			t.Errorf("ExpandTasksPerNode(%q) error %q does not name the input", in, err)
		}
	}
}

func TestCompressTasksPerNode(t *testing.T) {
	tests := []struct {
		in   []int
		want string
	}{
		{nil, ""},
		{[]int{4}, "4"},
		{[]int{2, 2, 2, 1}, "2(x3),1"},
		{[]int{1, 2, 2, 1, 1}, "1,2(x2),1(x2)"},
	}
	for _, tt := range tests {
		if got := CompressTasksPerNode(tt.in); got != tt.want {
			t.Errorf("CompressTasksPerNode(%v) = %q, want %q", tt.in, got, tt.want)
		}
	}
}

// FuzzTasksPerNode checks that no input panics and that compressing what
// expands expands back to the same counts.
func FuzzTasksPerNode(f *testing.F) {
	for _, s := range []string{"2(x3),1", "4", "1,2(x2),3", "2(x", "(x)", "0(x5)"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		counts, err := ExpandTasksPerNode(s)
		if err != nil {
			if counts != nil {
				t.Fatalf("error %v with counts %v", err, counts)
			}
			return
		}
		if len(counts) == 0 || len(counts) > MaxHosts {
			t.Fatalf("ExpandTasksPerNode(%q) gave %d counts", s, len(counts))
		}
		again, err := ExpandTasksPerNode(CompressTasksPerNode(counts))
		if err != nil || !slices.Equal(again, counts) {
			t.Fatalf("round trip of %q: %v, %v", s, again, err)
		}
	})
}
