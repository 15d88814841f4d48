package ckpt

import (
	"encoding/binary"
	"fmt"
	"io"
	"math"

	"github.com/hpcrun/hpcrun/tensor"
)

// ReadValues reads len(dst) values of tensor e, from element start on, out
// of r (the file h was read from), converting F32, F16 and BF16 to float32:
// a rank reads its own slices of a pretrained model through the header's
// offsets, never the whole file.
func (h *Header) ReadValues(r io.ReaderAt, e HeaderEntry, start int, dst []float32) error {
	size, ok := dtypeSize[e.DType]
	if !ok || !(e.DType == "F32" || e.DType == "F16" || e.DType == "BF16") {
		return fmt.Errorf("safetensors %s: tensor %s is %s: only F32, F16 and BF16 are read", h.Path, e.Name, e.DType)
	}
	if start < 0 || int64(start+len(dst))*int64(size) > e.End-e.Begin {
		return fmt.Errorf("safetensors %s: tensor %s: values [%d, %d) are past its %d", h.Path, e.Name, start, start+len(dst), (e.End-e.Begin)/int64(size))
	}
	buf := make([]byte, len(dst)*size)
	if _, err := r.ReadAt(buf, e.dataPos+int64(start*size)); err != nil {
		return fmt.Errorf("safetensors %s: tensor %s: %w", h.Path, e.Name, err)
	}
	DecodeFloats(dst, buf, e.DType)
	return nil
}

// DecodeFloats converts the little-endian values in src (dtype F32, F16 or
// BF16) into dst.
func DecodeFloats(dst []float32, src []byte, dtype string) {
	switch dtype {
	case "F32":
		for i := range dst {
			dst[i] = math.Float32frombits(binary.LittleEndian.Uint32(src[4*i:]))
		}
	case "BF16":
		for i := range dst {
			dst[i] = tensor.Float32FromBF16(binary.LittleEndian.Uint16(src[2*i:]))
		}
	case "F16":
		for i := range dst {
			dst[i] = halfToFloat(binary.LittleEndian.Uint16(src[2*i:]))
		}
	}
}

// halfToFloat converts an IEEE 754 binary16 value, subnormals, infinities
// and NaNs included.
func halfToFloat(h uint16) float32 {
	sign := uint32(h>>15) << 31
	exp := uint32(h>>10) & 0x1f
	frac := uint32(h) & 0x3ff
	switch {
	case exp == 0x1f: // inf, NaN
		return math.Float32frombits(sign | 0xff<<23 | frac<<13)
	case exp == 0 && frac == 0:
		return math.Float32frombits(sign)
	case exp == 0: // subnormal: frac * 2^-24
		v := float32(frac) * float32(1.0/(1<<24))
		if sign != 0 {
			v = -v
		}
		return v
	}
	return math.Float32frombits(sign | (exp+112)<<23 | frac<<13)
}

// appendFloat appends v to buf as dtype (F32, F16 or BF16), little-endian.
func appendFloat(buf []byte, v float32, dtype string) []byte {
	switch dtype {
	case "BF16":
		return binary.LittleEndian.AppendUint16(buf, tensor.BF16FromFloat32(v))
	case "F16":
		return binary.LittleEndian.AppendUint16(buf, floatToHalf(v))
	}
	return binary.LittleEndian.AppendUint32(buf, math.Float32bits(v))
}

// floatToHalf converts v to IEEE 754 binary16, rounding to nearest even;
// too large values become infinities, too small ones subnormals or zero.
func floatToHalf(v float32) uint16 {
	b := math.Float32bits(v)
	sign := uint16(b>>16) & 0x8000
	exp := int(b>>23&0xff) - 127 + 15
	frac := b & 0x7fffff
	switch {
	case b&0x7fffffff > 0x7f800000:
		return sign | 0x7e00 // NaN
	case exp >= 0x1f:
		return sign | 0x7c00 // overflow, infinity
	case exp <= 0:
		if exp < -10 {
			return sign
		}
		m := frac | 0x800000 // subnormal: shift the implicit 1 in
		shift := uint(14 - exp)
		h := m >> shift
		rem := m & (1<<shift - 1)
		half := uint32(1) << (shift - 1)
		if rem > half || (rem == half && h&1 == 1) {
			h++
		}
		return sign | uint16(h)
	}
	h := uint32(exp)<<10 | frac>>13
	rem := frac & 0x1fff
	if rem > 0x1000 || (rem == 0x1000 && h&1 == 1) {
		h++ // may carry into the exponent, which is right
	}
	return sign | uint16(h)
}
