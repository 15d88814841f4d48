package ckpt

import (
	"bytes"
	"encoding/binary"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestSafetensorsRoundTrip(t *testing.T) {
	path := filepath.Join(t.TempDir(), "a.safetensors")
	in := []Tensor{
		{Name: "w", Shape: []int{2, 3}, Data: []float32{1, 2, 3, 4, 5, -6}},
		{Name: "b", Shape: []int{3}, Data: []float32{0.5, 0, -1e-30}},
		{Name: "s", Shape: []int{}, Data: []float32{7}},
	}
	if err := WriteFile(path, in, map[string]string{"step": "3"}); err != nil {
		t.Fatal(err)
	}
	f, err := ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if f.Metadata["step"] != "3" || len(f.Tensors) != 3 {
		t.Fatalf("metadata %v, %d tensors", f.Metadata, len(f.Tensors))
	}
	for _, want := range in {
		got, err := f.Tensor(want.Name)
		if err != nil {
			t.Fatal(err)
		}
		if !equalShape(got.Shape, want.Shape) || len(got.Data) != len(want.Data) {
			t.Fatalf("%s: %v %v, want %v %v", want.Name, got.Shape, got.Data, want.Shape, want.Data)
		}
		for i := range got.Data {
			if got.Data[i] != want.Data[i] {
				t.Fatalf("%s[%d] = %v, want %v", want.Name, i, got.Data[i], want.Data[i])
			}
		}
	}
	// The data section starts 8-byte aligned, as the reference writer's.
	b, _ := os.ReadFile(path)
	if n := binary.LittleEndian.Uint64(b); (8+n)%8 != 0 {
		t.Errorf("header length %d leaves the data unaligned", n)
	}
}

// TestSafetensorsReference reads a file laid out by hand as the format
// specifies (what Python's safetensors writes for {"x": float32 [1, 2]}).
func TestSafetensorsReference(t *testing.T) {
	hdr := `{"x":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"__metadata__":{"k":"v"}}`
	b := binary.LittleEndian.AppendUint64(nil, uint64(len(hdr)))
	b = append(b, hdr...)
	b = append(b, 0, 0, 0x80, 0x3f, 0, 0, 0, 0x40)
	path := filepath.Join(t.TempDir(), "ref.safetensors")
	os.WriteFile(path, b, 0o644)
	f, err := ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	x, _ := f.Tensor("x")
	if x.Data[0] != 1 || x.Data[1] != 2 || f.Metadata["k"] != "v" {
		t.Fatalf("x = %v, metadata %v", x.Data, f.Metadata)
	}
}

func TestSafetensorsRejects(t *testing.T) {
	mk := func(hdr string, data int) []byte {
		b := binary.LittleEndian.AppendUint64(nil, uint64(len(hdr)))
		return append(append(b, hdr...), make([]byte, data)...)
	}
	good := `{"x":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}`
	for _, tc := range []struct {
		name, want string
		file       []byte
	}{
		{"empty", "truncated", nil},
		{"huge header", "out of range", binary.LittleEndian.AppendUint64(nil, 1<<40)},
		{"header past end", "truncated", mk(good, 0)[:20]},
		{"data truncated", "truncated", mk(good, 5)},
		{"trailing", "trailing data", mk(good, 9)},
		{"not json", "not a JSON object", mk(`[1,2]`, 0)},
		{"dtype", `unknown dtype "F33"`, mk(`{"x":{"dtype":"F33","shape":[2],"data_offsets":[0,8]}}`, 8)},
		{"size", "do not hold 3 F32 values", mk(`{"x":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}}`, 8)},
		{"gap", "overlapping or gapped", mk(`{"x":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}}`, 12)},
		{"overlap", "overlapping or gapped", mk(`{"x":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"y":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}`, 8)},
		{"unsupported", "only F32", mk(`{"x":{"dtype":"F16","shape":[2],"data_offsets":[0,4]}}`, 4)},
		{"extra field", "unknown field", mk(`{"x":{"dtype":"F32","shape":[2],"data_offsets":[0,8],"q":1}}`, 8)},
		// 2^32 x 2^32 wrapped to 0 elements, which 0 bytes hold.
		{"wrapping shape", "shape [4294967296 4294967296] has more than 1099511627776 elements", mk(`{"x":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,0]}}`, 0)},
		{"wrapping shape after 0", "has more than", mk(`{"x":{"dtype":"F32","shape":[0,4611686018427387904,4],"data_offsets":[0,0]}}`, 0)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "bad.safetensors")
			os.WriteFile(path, tc.file, 0o644)
			_, err := ReadFile(path)
			if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), path) {
				t.Fatalf("err = %v, want one naming %s and saying %q", err, path, tc.want)
			}
		})
	}
}

// FuzzReadHeader: no header panics, and one accepted describes tensors
// whose bytes lie in the file, each its shape's size.
func FuzzReadHeader(f *testing.F) {
	f.Add([]byte(`{"x":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}`), int64(8))
	f.Add([]byte(`{"__metadata__":{"a":"b"}}`), int64(0))
	f.Add([]byte(`{"x":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,0]}}`), int64(0))
	f.Add([]byte(`{"x":{"dtype":"U8","shape":[0,4611686018427387904],"data_offsets":[0,0]}}`), int64(0))
	f.Add([]byte(`{"x":{"dtype":"F64","shape":[3],"data_offsets":[9223372036854775783,9223372036854775807]}}`), int64(1<<62))
	f.Fuzz(func(t *testing.T, hdr []byte, data int64) {
		if data < 0 {
			return
		}
		b := binary.LittleEndian.AppendUint64(nil, uint64(len(hdr)))
		b = append(b, hdr...)
		// The data section is not read: its size is the reader's to claim.
		size := int64(len(b)) + data
		if size < 0 {
			return
		}
		h, err := readHeader(bytes.NewReader(b), size, "f.safetensors")
		if err != nil {
			if strings.Contains(err.Error(), "\n") {
				t.Fatalf("a message of more than one line: %q", err)
			}
			return
		}
		var pos int64
		for _, e := range h.Tensors {
			n, err := shapeElems(e.Shape)
			if err != nil || e.Begin != pos || e.End-e.Begin != n*int64(dtypeSize[e.DType]) {
				t.Fatalf("accepted %s %v at [%d, %d) after %d: %v", e.DType, e.Shape, e.Begin, e.End, pos, err)
			}
			pos = e.End
		}
		if 8+int64(len(hdr))+pos != size {
			t.Fatalf("accepted tensors to %d in a file of %d bytes", pos, size)
		}
	})
}
