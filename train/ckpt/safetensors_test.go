package ckpt

import (
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

func FuzzReadHeader(f *testing.F) {
	f.Add([]byte(`{"x":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}`), 8)
	f.Add([]byte(`{"__metadata__":{"a":"b"}}`), 0)
	dir := f.TempDir()
	f.Fuzz(func(t *testing.T, hdr []byte, data int) {
		if data < 0 || data > 1<<16 {
			return
		}
		b := binary.LittleEndian.AppendUint64(nil, uint64(len(hdr)))
		b = append(append(b, hdr...), make([]byte, data)...)
		path := filepath.Join(dir, "f.safetensors")
		os.WriteFile(path, b, 0o644)
		ReadFile(path) // must not panic
	})
}
