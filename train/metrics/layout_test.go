package metrics

import "testing"

// TestLayoutNamesRecompute: the layout names a recomputation, and none
// (written or not) adds nothing.
func TestLayoutNamesRecompute(t *testing.T) {
	for rc, want := range map[string]string{"": "tp 2 x dp 1 + sp", "none": "tp 2 x dp 1 + sp", "full": "tp 2 x dp 1 + sp + recompute full"} {
		if got := (RunConfig{TP: 2, DP: 1, SP: true, Recompute: rc}).Layout(); got != want {
			t.Errorf("recompute %q: layout %q, want %q", rc, got, want)
		}
	}
}
