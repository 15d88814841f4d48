package cudalib

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

// A library opened by full path from HPCRUN_CUDA_LIB_PATH has its run-time
// companion (same major version, the exact one first) opened first from
// the same directory.
func TestCompanions(t *testing.T) {
	dir := t.TempDir()
	for _, f := range []string{"libnvrtc.so.12", "libnvrtc-builtins.so.12.4", "libnvrtc-builtins.so.12.10",
		"libnvrtc-builtins.so.11.8", "libcublas.so.12", "libcublasLt.so.12", "libcublasLt.so.11",
		"libnvrtc-builtins.so.13.0", "libnvrtc-builtins.so.130"} {
		if err := os.WriteFile(filepath.Join(dir, f), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range []struct{ name, want string }{
		{"libnvrtc.so.12", "libnvrtc-builtins.so.12.10"},
		{"libnvrtc.so.11.2", "libnvrtc-builtins.so.11.8"},
		{"libnvrtc.so.13", "libnvrtc-builtins.so.13.0"},
		{"libcublas.so.12", "libcublasLt.so.12"},
		{"libcublas.so.11", "libcublasLt.so.11"},
		{"libcublas.so.13", ""},
		{"libcuda.so.1", ""},
	} {
		got := companions(dir, c.name)
		var want []string
		if c.want != "" {
			want = []string{filepath.Join(dir, c.want)}
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("companions(%s) = %v, want %v", c.name, got, want)
		}
	}
}

// The rule's order: HPCRUN_CUDA_LIB_PATH, LD_LIBRARY_PATH, the python3
// wheels, CUDA_HOME; each directory once, at its first place.
func TestSearchDirs(t *testing.T) {
	env := map[string]string{
		PathEnv:           "/opt/a:/opt/b",
		"LD_LIBRARY_PATH": "/usr/local/nccl/lib::/opt/a",
		"CUDA_HOME":       "/apps/cuda/12.4",
	}
	wheels := []Dir{{"/venv/site-packages/nvidia/cublas/lib", "python3 wheel nvidia/cublas"}, {"/opt/b", "python3 wheel nvidia/x"}}
	got := searchDirs(func(k string) string { return env[k] }, wheels)
	want := []Dir{
		{"/opt/a", PathEnv}, {"/opt/b", PathEnv}, {"/usr/local/nccl/lib", "LD_LIBRARY_PATH"},
		{"/venv/site-packages/nvidia/cublas/lib", "python3 wheel nvidia/cublas"},
		{"/apps/cuda/12.4/lib64", "CUDA_HOME"}, {"/apps/cuda/12.4/lib", "CUDA_HOME"},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("searchDirs:\n got %v\nwant %v", got, want)
	}
}

// A site-packages with pip's nvidia wheels gives their lib directories,
// named after the wheel.
func TestWheelDirs(t *testing.T) {
	sp := t.TempDir()
	for _, w := range []string{"nccl", "cublas", "cuda_nvrtc"} {
		os.MkdirAll(filepath.Join(sp, "nvidia", w, "lib"), 0o755)
	}
	os.MkdirAll(filepath.Join(sp, "nvidia", "headers_only", "include"), 0o755)
	got := wheelDirs([]string{"", filepath.Join(sp, "missing"), sp})
	var s []string
	for _, d := range got {
		s = append(s, strings.TrimPrefix(d.Path, sp)+" "+d.Source)
	}
	want := []string{"/nvidia/cublas/lib python3 wheel nvidia/cublas", "/nvidia/cuda_nvrtc/lib python3 wheel nvidia/cuda_nvrtc", "/nvidia/nccl/lib python3 wheel nvidia/nccl"}
	if !reflect.DeepEqual(s, want) {
		t.Errorf("wheelDirs = %q, want %q", s, want)
	}
}

// A library present only in an LD_LIBRARY_PATH directory is found there
// (not by the linker's name alone), and one present nowhere says where the
// rule looked.
func TestFindAndOpen(t *testing.T) {
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "libnccl.so.2"), []byte("not an ELF file"), 0o644)
	t.Setenv(PathEnv, "")
	t.Setenv("LD_LIBRARY_PATH", dir)
	t.Setenv("CUDA_HOME", "")
	f, ok := Find([]string{"libnccl.so.2"})
	if !ok || f.Path != filepath.Join(dir, "libnccl.so.2") || f.Source != "LD_LIBRARY_PATH" {
		t.Errorf("Find = %+v, %v", f, ok)
	}
	_, _, err := Open("NCCL", "install NCCL", []string{"libhpcrun-none.so.9"}, nil)
	if err == nil || !strings.Contains(err.Error(), dir+" (LD_LIBRARY_PATH)") || !strings.Contains(err.Error(), "install NCCL") {
		t.Errorf("Open of a missing library: %v", err)
	}
}
