package data

import (
	"bytes"
	"encoding/binary"
	"os"
	"path/filepath"
	"testing"
)

// FuzzReadIMDb: no CSV panics the reader; what it accepts has a text and a
// label 0 or 1 a row.
func FuzzReadIMDb(f *testing.F) {
	f.Add([]byte("review,sentiment\n\"good film\",positive\nbad,negative\n"))
	f.Add([]byte("\ufeffReview,Sentiment\n\"a \"\"quoted\"\" one\",positive\n"))
	f.Add([]byte("sentiment,review\nx,y\n"))
	f.Add([]byte(""))
	f.Fuzz(func(t *testing.T, b []byte) {
		ex, err := ReadIMDb(bytes.NewReader(b))
		if err != nil {
			return
		}
		for _, e := range ex {
			if e.Label != 0 && e.Label != 1 {
				t.Fatalf("label %d", e.Label)
			}
		}
	})
}

// FuzzTokenFile: no token file header or body, whatever its magic,
// version, count or size, panics the reader; what it accepts holds the
// count of tokens its header says.
func FuzzTokenFile(f *testing.F) {
	hdr := func(magic, version, count int32) []byte {
		b := make([]byte, tokenHeader)
		binary.LittleEndian.PutUint32(b, uint32(magic))
		binary.LittleEndian.PutUint32(b[4:], uint32(version))
		binary.LittleEndian.PutUint32(b[8:], uint32(count))
		return b
	}
	f.Add(append(hdr(20240520, 1, 2), 1, 0, 2, 0))
	f.Add(append(hdr(20240801, 7, 1), 1, 0, 0, 0))
	f.Add(append(hdr(20240520, 1, -1), 1, 0))
	f.Add(append(hdr(20240520, 2, 1), 1, 0))
	f.Add([]byte("short"))
	dir := f.TempDir()
	f.Fuzz(func(t *testing.T, b []byte) {
		if len(b) > 1<<16 {
			return
		}
		path := filepath.Join(dir, "f.bin")
		if err := os.WriteFile(path, b, 0o644); err != nil {
			t.Fatal(err)
		}
		sh, closeFn, err := mapTokenFile(path)
		if err != nil {
			return
		}
		defer closeFn()
		if n := int32(binary.LittleEndian.Uint32(b[8:])); int64(n) != int64(sh.len()) {
			t.Fatalf("header says %d tokens, the reader gives %d", n, sh.len())
		}
	})
}
