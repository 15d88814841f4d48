package slurm

import "testing"

func TestArrayRange(t *testing.T) {
	for _, c := range []struct {
		n, parallel int
		want        string
	}{
		{1, 0, "0-0"},
		{5, 0, "0-4"},
		{5, 2, "0-4%2"},
		{3, -1, "0-2"},
	} {
		got := ArrayRange(c.n, c.parallel)
		if got != c.want {
			t.Errorf("ArrayRange(%d, %d) = %q, want %q", c.n, c.parallel, got, c.want)
		}
		if !arrayRE.MatchString(got) {
			t.Errorf("ArrayRange(%d, %d) = %q, which the spec's rule refuses", c.n, c.parallel, got)
		}
	}
}

func TestArrayTaskID(t *testing.T) {
	if got := ArrayTaskID("1234", 3); got != "1234_3" {
		t.Errorf("ArrayTaskID(1234, 3) = %q, want 1234_3", got)
	}
}
