// Package cpusim builds the CPU simulation of the CUDA libraries hpcrun
// loads: one shared library, compiled by g++ from csrc/ and the device's
// kernels.cu, that stands in for libcuda (its kernels run on CPU fibers,
// csrc/sim.cpp), cuBLAS, NVRTC, the few CUDA runtime calls tests make,
// and NCCL (collectives and transfers between processes over shared
// memory, csrc/nccl.cpp). The library is linked under the real libraries'
// names in one directory, so that a process given that directory in
// HPCRUN_CUDA_LIB_PATH finds it by the same rule as a GPU's libraries
// (package cudalib): the device, the NCCL backend and the training loop
// run their own code on it, unchanged.
//
// It is for tests: a test of the CUDA paths without a GPU, never a way to
// train.
package cpusim

import (
	"bytes"
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

//go:embed csrc
var csrc embed.FS

// DevicesEnv names how many devices the simulated machine has (1 when
// unset); CUDA_VISIBLE_DEVICES then picks among them as on a GPU node.
const DevicesEnv = "HPCRUN_CPUSIM_DEVICES"

// RequireEnv, when set, makes a test that needs the simulation fail
// instead of skipping where it cannot be built (CI sets it).
const RequireEnv = "HPCRUN_REQUIRE_CPUSIM"

// LibName is the built library's file name in its directory.
const LibName = "libcpusim.so"

// Names are the real libraries' names the directory links to the
// library: the CUDA driver, cuBLAS, NVRTC, NCCL and the CUDA runtime.
var Names = []string{"libcuda.so.1", "libcublas.so.13", "libnvrtc.so.13", "libnccl.so.2", "libcudart.so.13"}

// ErrNoCompiler is Build's error where g++ is not installed.
var ErrNoCompiler = errors.New("cpusim: no g++ on PATH to compile the simulation (apt-get install g++)")

var kernelName = regexp.MustCompile(`(?m)^extern "C" __global__ void (?:[A-Z_]+ )*(\w+)\(`)

// KernelNames are the entry points of kernels.cu source, in order.
func KernelNames(kernelsCU string) []string {
	var names []string
	for _, m := range kernelName.FindAllStringSubmatch(kernelsCU, -1) {
		names = append(names, m[1])
	}
	return names
}

// Build compiles the simulation with kernelsCU as its kernels.cu into
// dir and links Names there; it returns the library's path. extraFlags
// go to g++ (e.g. a -D selecting a mutant).
func Build(dir, kernelsCU string, extraFlags ...string) (string, error) {
	gxx, err := exec.LookPath("g++")
	if err != nil {
		return "", ErrNoCompiler
	}
	names := KernelNames(kernelsCU)
	if len(names) == 0 {
		return "", errors.New("cpusim: kernels.cu declares no kernel (extern \"C\" __global__ void name(...))")
	}
	var list strings.Builder
	for _, n := range names {
		fmt.Fprintf(&list, "HPCRUN_KERNEL(%s)\n", n)
	}
	files := map[string][]byte{"list.h": []byte(list.String()), "kernels.cu": []byte(kernelsCU)}
	ents, err := csrc.ReadDir("csrc")
	if err != nil {
		return "", err
	}
	for _, e := range ents {
		b, err := csrc.ReadFile("csrc/" + e.Name())
		if err != nil {
			return "", err
		}
		files[e.Name()] = b
	}
	for name, body := range files {
		if err := os.WriteFile(filepath.Join(dir, name), body, 0o644); err != nil {
			return "", err
		}
	}
	lib := filepath.Join(dir, LibName)
	// TLS descriptors (gnu2): every thread index, barrier and shuffle
	// reads the running block and fiber from thread-local storage, which
	// the default dialect reaches through a call of __tls_get_addr each
	// time in a shared library (a tenth of a simulated training step).
	args := append([]string{"-std=c++20", "-O2", "-fPIC", "-shared", "-mtls-dialect=gnu2", "-Wall", "-Wno-sign-compare", "-Wno-unused-function",
		"-pthread", `-DKERNEL_LIST="list.h"`, "-I", dir}, extraFlags...)
	args = append(args, "-o", lib, filepath.Join(dir, "sim.cpp"), filepath.Join(dir, "nccl.cpp"))
	if out, err := exec.Command(gxx, args...).CombinedOutput(); err != nil {
		return "", fmt.Errorf("cpusim: g++: %v\n%s", err, out)
	} else if len(bytes.TrimSpace(out)) > 0 {
		return "", fmt.Errorf("cpusim: g++ warns (the simulation must compile cleanly):\n%s", out)
	}
	for _, n := range Names {
		link := filepath.Join(dir, n)
		os.Remove(link)
		if err := os.Symlink(LibName, link); err != nil {
			return "", err
		}
	}
	return lib, nil
}

// Shared builds the simulation of kernelsCU once for every test process
// of this user on the machine (a directory under os.TempDir named by a
// hash of the sources, built under a lock) and returns the directory to
// put in HPCRUN_CUDA_LIB_PATH.
func Shared(kernelsCU string) (string, error) {
	h := sha256.New()
	h.Write([]byte(kernelsCU))
	ents, err := csrc.ReadDir("csrc")
	if err != nil {
		return "", err
	}
	for _, e := range ents {
		b, _ := csrc.ReadFile("csrc/" + e.Name())
		fmt.Fprintf(h, "%s %d\n", e.Name(), len(b))
		h.Write(b)
	}
	dir := filepath.Join(os.TempDir(), "hpcrun-cpusim-"+strconv.Itoa(os.Getuid())+"-"+hex.EncodeToString(h.Sum(nil))[:16])
	done := filepath.Join(dir, "built")
	if _, err := os.Stat(done); err == nil {
		return dir, nil
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", err
	}
	lock, err := os.OpenFile(filepath.Join(dir, ".lock"), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return "", err
	}
	defer lock.Close()
	if err := unix.Flock(int(lock.Fd()), unix.LOCK_EX); err != nil {
		return "", err
	}
	defer unix.Flock(int(lock.Fd()), unix.LOCK_UN)
	if _, err := os.Stat(done); err == nil { // another process built it while we waited
		return dir, nil
	}
	if _, err := Build(dir, kernelsCU); err != nil {
		return "", err
	}
	return dir, os.WriteFile(done, nil, 0o644)
}

// SharedForTest is Shared for a test: it skips t where g++ is missing
// (fails it where RequireEnv is set) and fails it on any other error.
func SharedForTest(t testing.TB, kernelsCU string) string {
	t.Helper()
	dir, err := Shared(kernelsCU)
	if errors.Is(err, ErrNoCompiler) && os.Getenv(RequireEnv) == "" {
		t.Skip(err)
	}
	if err != nil {
		t.Fatal(err)
	}
	return dir
}

// Env is the environment a process needs to run on the simulation built
// in dir with devices devices.
func Env(dir string, devices int) []string {
	return []string{"HPCRUN_CUDA_LIB_PATH=" + dir, DevicesEnv + "=" + strconv.Itoa(devices)}
}
