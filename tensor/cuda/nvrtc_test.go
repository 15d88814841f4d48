package cuda

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
)

func TestCacheKey(t *testing.T) {
	base := cacheKey("src", "sm_90", 12, 4)
	for name, k := range map[string]string{
		"source":  cacheKey("src2", "sm_90", 12, 4),
		"arch":    cacheKey("src", "sm_80", 12, 4),
		"version": cacheKey("src", "sm_90", 12, 5),
	} {
		if k == base {
			t.Errorf("changing the %s keeps the key", name)
		}
	}
	if cacheKey("src", "sm_90", 12, 4) != base {
		t.Error("the key is not deterministic")
	}
}

// The first use compiles and stores; the second reads the file without
// compiling; no temporary file is left behind.
func TestCachedImage(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "hpcrun", "cuda")
	compiles := 0
	compile := func() ([]byte, error) { compiles++; return []byte("cubin bytes"), nil }
	img, hit, err := cachedImage(dir, "k1", compile)
	if err != nil || hit || string(img) != "cubin bytes" || compiles != 1 {
		t.Fatalf("first: %q hit=%v err=%v compiles=%d", img, hit, err, compiles)
	}
	img, hit, err = cachedImage(dir, "k1", compile)
	if err != nil || !hit || string(img) != "cubin bytes" || compiles != 1 {
		t.Fatalf("second: %q hit=%v err=%v compiles=%d", img, hit, err, compiles)
	}
	ents, _ := os.ReadDir(dir)
	if len(ents) != 1 || ents[0].Name() != "k1.cubin" {
		t.Errorf("cache dir holds %v, want only k1.cubin", ents)
	}
	if _, hit, _ := cachedImage(dir, "k2", compile); hit || compiles != 2 {
		t.Errorf("another key: hit=%v compiles=%d", hit, compiles)
	}
}

// A compile error comes back and nothing is cached; an unwritable cache
// still gives the image.
func TestCachedImageFailures(t *testing.T) {
	dir := t.TempDir()
	boom := errors.New("nvrtc says no")
	if _, _, err := cachedImage(dir, "k", func() ([]byte, error) { return nil, boom }); !errors.Is(err, boom) {
		t.Errorf("compile error: %v", err)
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 0 {
		t.Errorf("a failed compile left %v", ents)
	}
	file := filepath.Join(dir, "file")
	os.WriteFile(file, nil, 0o644)
	img, _, err := cachedImage(filepath.Join(file, "sub"), "k", func() ([]byte, error) { return []byte("x"), nil })
	if err != nil || string(img) != "x" {
		t.Errorf("unwritable cache: %q, %v", img, err)
	}
}

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

// Without the libraries, Available and Open say what is missing instead of
// failing later.
func TestUnavailableSaysWhy(t *testing.T) {
	ok, why := Available()
	if ok {
		t.Skip("CUDA is available here")
	}
	if why == "" {
		t.Fatal("Available is false with no reason")
	}
	_, err := Open(0)
	if err == nil {
		t.Fatal("Open succeeded where Available is false")
	}
	t.Logf("CUDA unavailable: %v", err)
}
