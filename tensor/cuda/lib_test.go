package cuda

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// NVRTC found only through HPCRUN_CUDA_LIB_PATH loads by full path with its
// builtins; an NVRTC newer than the driver is refused with the versions and
// the fix.
func TestNVRTCChoice(t *testing.T) {
	probe := &nvrtcAPI{}
	if err := probe.open(0, nil); err != nil {
		t.Skipf("no NVRTC here: %v", err)
	}
	real, err := filepath.EvalSymlinks(findOnLinkerPath(t, probe.name))
	if err != nil {
		t.Skip(err)
	}
	dir := t.TempDir()
	for _, f := range []string{real, filepath.Join(filepath.Dir(real), "libnvrtc-builtins.so."+strings.Split(strings.TrimPrefix(filepath.Base(real), "libnvrtc.so."), ".")[0])} {
		if m, _ := filepath.Glob(f + "*"); len(m) > 0 {
			for _, x := range m {
				os.Symlink(x, filepath.Join(dir, filepath.Base(x)))
			}
		}
	}
	os.Symlink(real, filepath.Join(dir, probe.name))
	t.Setenv(LibPathEnv, dir)
	n := &nvrtcAPI{}
	if err := n.open(0, nil); err != nil || !strings.HasPrefix(n.name, dir) {
		t.Fatalf("NVRTC from %s: %q, %v", dir, n.name, err)
	}
	old := (probe.major - 1) * 1000
	err = (&nvrtcAPI{}).open(old, nil)
	if err == nil || !strings.Contains(err.Error(), "but the driver supports CUDA") {
		t.Fatalf("NVRTC %d.%d with a CUDA %d driver: %v, want the reason", probe.major, probe.minor, old/1000, err)
	}
	t.Log(err)
}

// findOnLinkerPath returns the file the dynamic linker would open for name.
func findOnLinkerPath(t *testing.T, name string) string {
	for _, d := range []string{"/usr/lib/x86_64-linux-gnu", "/usr/lib64", "/usr/local/cuda/lib64", "/usr/lib"} {
		if p := filepath.Join(d, name); fileExists(p) {
			return p
		}
	}
	t.Skipf("%s is not in a standard directory", name)
	return ""
}

func fileExists(p string) bool {
	st, err := os.Stat(p)
	return err == nil && !st.IsDir()
}
