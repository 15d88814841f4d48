package tensor

import "math"

// exp32 is exp(x) in float32 to about 2 ulp, without a float64 round trip:
// x = n*ln2 + r with |r| <= ln2/2, exp(r) by a degree-7 polynomial (Cephes'
// expf coefficients), times 2^n built from the exponent bits.
func exp32(x float32) float32 {
	switch {
	case x != x:
		return x
	case x > 88.37626:
		return float32(math.Inf(1))
	case x < -87.33654:
		return 0
	}
	t := x * 1.442695 // log2(e)
	var n int32
	if t >= 0 {
		n = int32(t + 0.5)
	} else {
		n = int32(t - 0.5)
	}
	fn := float32(n)
	r := x - fn*0.693359375 - fn*-2.12194440e-4
	p := float32(1.9875691500e-4)
	p = p*r + 1.3981999507e-3
	p = p*r + 8.3334519073e-3
	p = p*r + 4.1665795894e-2
	p = p*r + 1.6666665459e-1
	p = p*r + 5.0000001201e-1
	y := p*r*r + r + 1
	if n > 127 {
		n--
		y *= 2
	}
	return y * math.Float32frombits(uint32(n+127)<<23)
}
