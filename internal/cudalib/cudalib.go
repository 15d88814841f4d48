// Package cudalib finds and opens the CUDA libraries (the driver libcuda,
// cuBLAS and cuBLASLt, NVRTC, NCCL) by one rule, for every package that
// loads one at run time (tensor/cuda, nccl) and for `hpcrun env`, which
// prints what it finds.
//
// The rule: a library is looked for, by each of its names in order, in
//
//  1. the directories of HPCRUN_CUDA_LIB_PATH (colon-separated), in order;
//  2. the directories of LD_LIBRARY_PATH, in order;
//  3. the lib directories of the NVIDIA wheels of the job's python3
//     (site-packages/nvidia/*/lib: pip's nvidia-cublas-cu12,
//     nvidia-cuda-nvrtc, nvidia-nccl-cu12, ...);
//  4. $CUDA_HOME/lib64 and $CUDA_HOME/lib (set by the module system's cuda
//     module);
//  5. the dynamic linker's own search (ld.so.cache, the system's
//     directories), by name alone.
//
// A library opened by full path has its companion (libcublasLt for cuBLAS,
// libnvrtc-builtins for NVRTC) opened from the same directory first, so
// that its own dlopen by name finds it loaded.
package cudalib

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/ebitengine/purego"
)

// PathEnv names directories (colon-separated) searched first.
const PathEnv = "HPCRUN_CUDA_LIB_PATH"

// Dir is a directory searched for the libraries and the rule that put it
// there.
type Dir struct {
	Path   string
	Source string // "HPCRUN_CUDA_LIB_PATH", "LD_LIBRARY_PATH", "python3 wheel nvidia/cublas", "CUDA_HOME"
}

// Linker is the Source of a library the dynamic linker found by name.
const Linker = "the dynamic linker"

var (
	wheelOnce sync.Once
	wheelVal  []Dir
)

// SearchDirs are the directories of the rule, in order, each once.
func SearchDirs() []Dir {
	wheelOnce.Do(func() { wheelVal = wheelDirs(pythonPath()) })
	return searchDirs(os.Getenv, wheelVal)
}

// searchDirs is SearchDirs from getenv and the wheels' directories.
func searchDirs(getenv func(string) string, wheels []Dir) []Dir {
	var dirs []Dir
	seen := map[string]bool{}
	add := func(path, source string) {
		if path == "" || seen[filepath.Clean(path)] {
			return
		}
		seen[filepath.Clean(path)] = true
		dirs = append(dirs, Dir{path, source})
	}
	for _, env := range []string{PathEnv, "LD_LIBRARY_PATH"} {
		for _, d := range strings.Split(getenv(env), ":") {
			add(d, env)
		}
	}
	for _, d := range wheels {
		add(d.Path, d.Source)
	}
	if home := getenv("CUDA_HOME"); home != "" {
		add(filepath.Join(home, "lib64"), "CUDA_HOME")
		add(filepath.Join(home, "lib"), "CUDA_HOME")
	}
	return dirs
}

// pythonPath is sys.path of the python3 on PATH (nil without one; it is
// given 10 seconds).
func pythonPath() []string {
	py, err := exec.LookPath("python3")
	if err != nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, py, "-c", "import sys; print('\\n'.join(sys.path))").Output()
	if err != nil {
		return nil
	}
	return strings.Split(strings.TrimSpace(string(out)), "\n")
}

// wheelDirs are the nvidia/*/lib directories under the entries of a
// python's sys.path, where pip's nvidia-* wheels put their libraries.
func wheelDirs(sysPath []string) []Dir {
	var dirs []Dir
	for _, p := range sysPath {
		if p == "" {
			continue
		}
		libs, _ := filepath.Glob(filepath.Join(p, "nvidia", "*", "lib"))
		sort.Strings(libs)
		for _, l := range libs {
			dirs = append(dirs, Dir{l, "python3 wheel nvidia/" + filepath.Base(filepath.Dir(l))})
		}
	}
	return dirs
}

// Found is where the rule finds a library.
type Found struct {
	Path   string // the file, or the name the dynamic linker found
	Source string // the Dir's Source, or Linker
}

// Find is where the rule finds the first of names without loading it (a
// file in a search directory), else where the dynamic linker finds it
// (this loads it); ok is false when neither does.
func Find(names []string) (f Found, ok bool) {
	dirs := SearchDirs()
	for _, name := range names {
		for _, d := range dirs {
			if p := filepath.Join(d.Path, name); fileExists(p) {
				return Found{p, d.Source}, true
			}
		}
	}
	for _, name := range names {
		if h, err := purego.Dlopen(name, purego.RTLD_NOW|purego.RTLD_GLOBAL); err == nil {
			purego.Dlclose(h)
			return Found{name, Linker}, true
		}
	}
	return Found{}, false
}

// Open opens the first of names that loads, trying each name in every
// search directory and then by name alone; accept, when not nil, may
// refuse a library that loaded (with the reason). The error names what
// (e.g. "NVRTC"), what was tried and why, and ends with hint.
func Open(what, hint string, names []string, accept func(h uintptr, path string) error) (uintptr, Found, error) {
	dirs := SearchDirs()
	var tried, refused []string
	var lastErr error
	for _, name := range names {
		cands := make([]Found, 0, len(dirs)+1)
		for _, d := range dirs {
			if p := filepath.Join(d.Path, name); fileExists(p) {
				cands = append(cands, Found{p, d.Source})
			}
		}
		cands = append(cands, Found{name, Linker})
		for _, c := range cands {
			h, err := dlopenWithCompanions(c.Path)
			if err != nil {
				tried = append(tried, c.Path)
				lastErr = err
				continue
			}
			if accept != nil {
				if err := accept(h, c.Path); err != nil {
					purego.Dlclose(h)
					refused = append(refused, err.Error())
					continue
				}
			}
			return h, c, nil
		}
	}
	if len(refused) > 0 {
		return 0, Found{}, fmt.Errorf("cannot use %s: %s", what, strings.Join(refused, "; "))
	}
	return 0, Found{}, fmt.Errorf("cannot load %s (tried %s; %v; searched %s): %s", what, strings.Join(tried, ", "), lastErr, describe(dirs), hint)
}

// describe lists dirs with their sources.
func describe(dirs []Dir) string {
	if len(dirs) == 0 {
		return "no directory: " + PathEnv + ", LD_LIBRARY_PATH and CUDA_HOME are unset and python3 has no nvidia wheel"
	}
	s := make([]string, len(dirs))
	for i, d := range dirs {
		s[i] = d.Path + " (" + d.Source + ")"
	}
	return strings.Join(s, ", ")
}

// dlopenWithCompanions opens path with RTLD_GLOBAL, the companion of a
// library in a directory first (see companions).
func dlopenWithCompanions(path string) (uintptr, error) {
	if dir, name := filepath.Split(path); dir != "" {
		for _, c := range companions(dir, name) {
			if _, err := purego.Dlopen(c, purego.RTLD_NOW|purego.RTLD_GLOBAL); err != nil {
				return 0, fmt.Errorf("%s needs %s: %w", path, c, err)
			}
		}
	}
	return purego.Dlopen(path, purego.RTLD_NOW|purego.RTLD_GLOBAL)
}

// companionPrefix maps a library's name prefix to the library it loads at
// run time from its own directory.
var companionPrefix = map[string]string{
	"libcublas.so": "libcublasLt.so",
	"libnvrtc.so":  "libnvrtc-builtins.so",
}

// companions lists the files of dir that library name (e.g.
// "libnvrtc.so.12") needs opened first: those of its companion with the
// same major version (libnvrtc-builtins.so.12.4, libcublasLt.so.12), the
// exact version first, newest first otherwise. A library without one in
// dir needs none (its companion is elsewhere on the linker's path).
func companions(dir, name string) []string {
	for prefix, comp := range companionPrefix {
		ver, ok := strings.CutPrefix(name, prefix)
		if !ok || (ver != "" && ver[0] != '.') {
			continue
		}
		major, _, _ := strings.Cut(strings.TrimPrefix(ver, "."), ".")
		if major != "" {
			major = "." + major
		}
		if exact := filepath.Join(dir, comp+ver); ver != "" && fileExists(exact) {
			return []string{exact}
		}
		matches, _ := filepath.Glob(filepath.Join(dir, comp+major+"*"))
		var found []string
		for _, m := range matches {
			rest := strings.TrimPrefix(filepath.Base(m), comp+major)
			if rest == "" || rest[0] == '.' {
				found = append(found, m)
			}
		}
		sort.Slice(found, func(i, j int) bool { return versionLess(found[j], found[i]) })
		if len(found) > 0 {
			return found[:1]
		}
	}
	return nil
}

func fileExists(p string) bool {
	st, err := os.Stat(p)
	return err == nil && !st.IsDir()
}

// versionLess orders library file names by their numeric version suffix
// (libx.so.12.4 < libx.so.12.10).
func versionLess(a, b string) bool {
	va, vb := soVersion(a), soVersion(b)
	for i := 0; i < min(len(va), len(vb)); i++ {
		if va[i] != vb[i] {
			return va[i] < vb[i]
		}
	}
	return len(va) < len(vb)
}

func soVersion(path string) []int {
	_, ver, _ := strings.Cut(filepath.Base(path), ".so")
	var v []int
	for _, f := range strings.Split(strings.TrimPrefix(ver, "."), ".") {
		n, err := strconv.Atoi(f)
		if err != nil {
			break
		}
		v = append(v, n)
	}
	return v
}

// Library is one CUDA library the project loads: what it is and its
// names, newest first.
type Library struct {
	What  string
	Names []string
}

// Libraries are every CUDA library the project loads, in the order
// `hpcrun env` prints them.
var Libraries = []Library{
	{"CUDA driver", []string{"libcuda.so.1", "libcuda.so"}},
	{"cuBLAS", []string{"libcublas.so.13", "libcublas.so.12", "libcublas.so.11", "libcublas.so"}},
	{"cuBLASLt", []string{"libcublasLt.so.13", "libcublasLt.so.12", "libcublasLt.so.11", "libcublasLt.so"}},
	{"NVRTC", []string{"libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so.11.2", "libnvrtc.so.11.1", "libnvrtc.so"}},
	{"NCCL", []string{"libnccl.so.2", "libnccl.so"}},
}

// Names are the names of library what in Libraries (nil for another).
func Names(what string) []string {
	for _, l := range Libraries {
		if l.What == what {
			return l.Names
		}
	}
	return nil
}
