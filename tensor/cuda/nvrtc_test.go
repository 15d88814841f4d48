package cuda

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
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

// The arch rule on the arch lists NVRTC 11.2, 12.8 and 13.0 report
// (nvrtcGetSupportedArchs): what each compiles, what it skips and why,
// and which NVRTC a V100 or an H100 beside a given driver takes.
func TestArchRule(t *testing.T) {
	var (
		nvrtc112 = []string{"sm_35", "sm_37", "sm_50", "sm_52", "sm_53", "sm_60", "sm_61", "sm_62", "sm_70", "sm_72", "sm_75", "sm_80", "sm_86"}
		nvrtc128 = []string{"sm_50", "sm_52", "sm_53", "sm_60", "sm_61", "sm_62", "sm_70", "sm_72", "sm_75", "sm_80", "sm_86", "sm_87", "sm_89", "sm_90", "sm_100", "sm_101", "sm_120"}
		nvrtc130 = []string{"sm_75", "sm_80", "sm_86", "sm_87", "sm_88", "sm_89", "sm_90", "sm_100", "sm_103", "sm_110", "sm_120", "sm_121"}
	)
	want := []string{"sm_70", "sm_80", "sm_90"}
	for _, c := range []struct {
		name    string
		known   []string
		compile string
		why     []string // a phrase of each skip's reason, in order
	}{
		{"11.2", nvrtc112, "sm_70 sm_80", []string{"sm_90 needs a newer NVRTC"}},
		{"12.8", nvrtc128, "sm_70 sm_80 sm_90", nil},
		{"13.0", nvrtc130, "sm_80 sm_90", []string{"dropped the older archs; use an older NVRTC that still has sm_70"}},
		{"unknown", nil, "sm_70 sm_80 sm_90", nil},
	} {
		compile, skipped := splitArchs("NVRTC "+c.name, want, c.known)
		if got := strings.Join(compile, " "); got != c.compile {
			t.Errorf("NVRTC %s compiles %q, want %q", c.name, got, c.compile)
		}
		if len(skipped) != len(c.why) {
			t.Errorf("NVRTC %s skips %v, want %d", c.name, skipped, len(c.why))
			continue
		}
		for i, err := range skipped {
			if !strings.Contains(err.Error(), c.why[i]) {
				t.Errorf("NVRTC %s: %v, want it to say %q", c.name, err, c.why[i])
			}
		}
	}
	// A V100 passes over CUDA 13's NVRTC for CUDA 12's; an H100 takes 13
	// where the driver is 13 (580), not where it is 12.4 (550).
	for _, c := range []struct {
		major  int
		known  []string
		driver int
		need   []string
		why    string // "" when it fits
	}{
		{13, nvrtc130, 13000, []string{"sm_70"}, "use an older NVRTC"},
		{12, nvrtc128, 13000, []string{"sm_70"}, ""},
		{13, nvrtc130, 13000, []string{"sm_90"}, ""},
		{13, nvrtc130, 12040, []string{"sm_90"}, "newer major release"},
		{13, nvrtc130, 13000, []string{"sm_90", "sm_70"}, "sm_70"},
		{11, nvrtc112, 13000, nil, ""},
	} {
		err := nvrtcFits("libnvrtc.so", c.major, 0, c.known, c.driver, c.need)
		if (err == nil) != (c.why == "") || err != nil && !strings.Contains(err.Error(), c.why) {
			t.Errorf("NVRTC %d, driver %d, devices %v: %v, want %q", c.major, c.driver, c.need, err, c.why)
		}
	}
}
