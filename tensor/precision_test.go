package tensor

import "testing"

func TestParsePrecision(t *testing.T) {
	for _, p := range []Precision{FP32, TF32, BF16} {
		if got, err := ParsePrecision(p.String()); err != nil || got != p {
			t.Errorf("ParsePrecision(%q) = %v, %v", p.String(), got, err)
		}
	}
	if _, err := ParsePrecision("fp8"); err == nil {
		t.Error("fp8 accepted")
	}
}
