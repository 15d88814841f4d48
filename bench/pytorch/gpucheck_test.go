// Tests of gpu-check.sh, the GPU check run on a machine without Go: what
// it gives the binaries it runs, and when it fails.
package pytorch_test

import (
	"debug/elf"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// fakeGPUMachine lays out a GPU machine's view for gpu-check.sh run: test
// binaries in bin (each logs its LD_LIBRARY_PATH, and cuda.test prints
// skipLine), nvidia-smi (working when gpu) and a python3 whose nvidia
// wheels hold cuBLAS, NVRTC, NCCL and the CUDA runtime, on PATH.
func fakeGPUMachine(t *testing.T, gpu bool, skipLine string) (env []string, bin, log string) {
	t.Helper()
	root := t.TempDir()
	bin, path, site := filepath.Join(root, "devbin"), filepath.Join(root, "path"), filepath.Join(root, "site")
	log = filepath.Join(root, "log")
	for _, d := range []string{bin, path} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, lib := range []string{"cublas/lib/libcublas.so.12", "cublas/lib/libcublasLt.so.12",
		"cuda_nvrtc/lib/libnvrtc.so.12", "nccl/lib/libnccl.so.2", "cuda_runtime/lib/libcudart.so.12"} {
		p := filepath.Join(site, "nvidia", lib)
		os.MkdirAll(filepath.Dir(p), 0o755)
		if err := os.WriteFile(p, nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	script := func(dir, name, body string) {
		if err := os.WriteFile(filepath.Join(dir, name), []byte("#!/bin/sh\n"+body+"\n"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	logEnv := `echo "$(basename "$0") LD_LIBRARY_PATH=${LD_LIBRARY_PATH-unset} HPCRUN_CUDA_LIB_PATH=${HPCRUN_CUDA_LIB_PATH-unset}" >> ` + log
	script(bin, "cuda.test", logEnv+"\necho '=== RUN   TestGPUBlocks'\necho '"+skipLine+"'\necho PASS")
	script(bin, "train.test", logEnv+"\necho '--- PASS: TestGPUBenchStepMatchesCPU (1.00s)'\necho PASS")
	script(bin, "nccl.test", logEnv+"\necho '--- PASS: TestGPUNCCLOneRank (1.00s)'\necho PASS")
	script(bin, "hpcrun", logEnv+"\necho '{}'")
	smi := "exit 9"
	if gpu {
		smi = "echo 'NVIDIA H100, 550.54, 81559 MiB'"
	}
	script(path, "nvidia-smi", smi)
	script(path, "python3", `case "$*" in *"import nvidia"*) echo `+site+`; exit 0;; esac
`+logEnv)
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "LD_LIBRARY_PATH=") && !strings.HasPrefix(kv, "HPCRUN_CUDA_LIB_PATH=") && !strings.HasPrefix(kv, "PATH=") {
			env = append(env, kv)
		}
	}
	env = append(env, "PATH="+path+":"+os.Getenv("PATH"), "GPU_CHECK_BIN="+bin, "OUT="+root)
	return env, bin, log
}

func runCheck(t *testing.T, env []string) (string, int) {
	t.Helper()
	cmd := exec.Command("bash", "gpu-check.sh", "run")
	cmd.Env = env
	out, err := cmd.CombinedOutput()
	if ee, ok := err.(*exec.ExitError); ok {
		return string(out), ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return string(out), 0
}

// On a machine with a GPU, a GPU test that skips fails the check; without
// one it does not. A test of more ranks than the machine has GPUs may
// skip, and the check says so.
func TestScriptSkipFailsWithGPU(t *testing.T) {
	skip := "--- SKIP: TestGPUBlocks (0.00s)"
	for _, c := range []struct {
		gpu  bool
		skip string
		rc   int
		want string
	}{
		{true, skip, 1, "GPU tests skipped on a machine with a GPU"},
		{true, "--- PASS: TestGPUBlocks (0.10s)", 0, "all passed"},
		{false, skip, 0, "all passed"},
		{true, "--- SKIP: TestGPUNCCLCollectivesFourRanks (0.00s)", 0,
			"the tests of more ranks than GPUs skip on the real NCCL (TestGPUNCCLCollectivesFourRanks); make test runs them on simulated GPUs"},
	} {
		env, _, _ := fakeGPUMachine(t, c.gpu, c.skip)
		out, rc := runCheck(t, env)
		if rc != c.rc || !strings.Contains(out, c.want) {
			t.Errorf("gpu %v, %q: exit %d, want %d and %q:\n%s", c.gpu, c.skip, rc, c.rc, c.want, out)
		}
	}
}

// The Go binaries get a library path with NCCL's and the CUDA runtime's
// directories and no empty element; python3 gets the caller's environment.
func TestScriptLibraryPath(t *testing.T) {
	for _, inherited := range []string{"", "/opt/site/lib"} {
		env, _, log := fakeGPUMachine(t, true, "--- PASS: TestGPUBlocks (0.10s)")
		if inherited != "" {
			env = append(env, "LD_LIBRARY_PATH="+inherited)
		}
		if out, rc := runCheck(t, env); rc != 0 {
			t.Fatalf("exit %d:\n%s", rc, out)
		}
		b, err := os.ReadFile(log)
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
			f := strings.Fields(line)
			name, ld := f[0], strings.TrimPrefix(f[1], "LD_LIBRARY_PATH=")
			if name == "python3" {
				want := inherited
				if want == "" {
					want = "unset"
				}
				if ld != want {
					t.Errorf("python3 ran with LD_LIBRARY_PATH=%s, want the caller's (%s)", ld, want)
				}
				continue
			}
			for _, lib := range []string{"nvidia/nccl/lib", "nvidia/cuda_runtime/lib", "nvidia/cublas/lib", "nvidia/cuda_nvrtc/lib"} {
				if !strings.Contains(ld, lib) {
					t.Errorf("%s: LD_LIBRARY_PATH=%s lacks %s", name, ld, lib)
				}
			}
			for _, el := range strings.Split(ld, ":") {
				if el == "" {
					t.Errorf("%s: LD_LIBRARY_PATH=%q has an empty element (the current directory)", name, ld)
				}
			}
			if inherited != "" && !strings.HasSuffix(ld, ":"+inherited) {
				t.Errorf("%s: LD_LIBRARY_PATH=%s drops the caller's %s", name, ld, inherited)
			}
		}
	}
}

// gpu-check.sh build makes binaries without cgo that need no versioned
// glibc symbol (so they start on RHEL 8 and Ubuntu 20.04), under 64 MiB
// together, in a folder git ignores.
func TestScriptBuild(t *testing.T) {
	if testing.Short() {
		t.Skip("builds four binaries")
	}
	if _, err := exec.LookPath("go"); err != nil {
		t.Skip("no go command")
	}
	dir := t.TempDir()
	cmd := exec.Command("bash", "gpu-check.sh", "build")
	cmd.Env = append(os.Environ(), "GPU_CHECK_BIN="+dir)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("gpu-check.sh build: %v\n%s", err, out)
	}
	var total int64
	for _, name := range []string{"cuda.test", "nccl.test", "train.test", "hpcrun"} {
		p := filepath.Join(dir, name)
		st, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		total += st.Size()
		f, err := elf.Open(p)
		if err != nil {
			t.Fatal(err)
		}
		syms, err := f.ImportedSymbols()
		f.Close()
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		for _, s := range syms {
			if v, ok := strings.CutPrefix(s.Version, "GLIBC_"); ok && glibcNewer(v, "2.17") {
				t.Errorf("%s needs %s@%s: built with cgo?", name, s.Name, s.Version)
			}
		}
	}
	if total >= 64<<20 {
		t.Errorf("the binaries hold %d bytes, more than 64 MiB", total)
	}
	t.Logf("devbin: %d bytes", total)
	if err := exec.Command("git", "-C", "../..", "check-ignore", "-q", "devbin/hpcrun").Run(); err != nil {
		t.Errorf("git does not ignore devbin/: %v", err)
	}
}

// glibcNewer reports whether version a (like "2.34") is newer than b.
func glibcNewer(a, b string) bool {
	pa, pb := strings.Split(a, "."), strings.Split(b, ".")
	for i := 0; i < max(len(pa), len(pb)); i++ {
		var x, y int
		if i < len(pa) {
			x, _ = strconv.Atoi(pa[i])
		}
		if i < len(pb) {
			y, _ = strconv.Atoi(pb[i])
		}
		if x != y {
			return x > y
		}
	}
	return false
}

// stageMachine is fakeGPUMachine with a GPU whose tests pass, the stages'
// results under out (OUT) and the extra environment more.
func stageMachine(t *testing.T, more ...string) (env []string, bin, log, out string) {
	t.Helper()
	env, bin, log = fakeGPUMachine(t, true, "--- PASS: TestGPUBlocks (0.10s)")
	out = filepath.Join(filepath.Dir(bin), "out")
	return append(append(env, "OUT="+out), more...), bin, log, out
}

// runStages runs gpu-check.sh run with the given stages and extra
// environment.
func runStages(t *testing.T, env []string, stages ...string) (string, int) {
	t.Helper()
	cmd := exec.Command("bash", append([]string{"gpu-check.sh", "run"}, stages...)...)
	cmd.Env = env
	out, err := cmd.CombinedOutput()
	if ee, ok := err.(*exec.ExitError); ok {
		return string(out), ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return string(out), 0
}

// Stages run apart: a failed `bench step` leaves no result and PyTorch
// runs alone (before, it read the missing file and crashed); each stage
// writes its log and verdict under $OUT/<stage>/; a command that hangs is
// cut at STAGE_LIMIT and the next stage still runs.
func TestScriptStages(t *testing.T) {
	env, bin, _, out := stageMachine(t, "STAGE_LIMIT=3")
	root := filepath.Dir(bin)
	pyArgs := filepath.Join(root, "python3-args")
	write := func(p, body string) {
		if err := os.WriteFile(p, []byte("#!/bin/sh\n"+body+"\n"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	write(filepath.Join(bin, "hpcrun"), "echo 'bench step: CUDA_ERROR_OUT_OF_MEMORY' >&2; exit 1")
	write(filepath.Join(root, "path", "python3"), `case "$*" in *"import nvidia"*) exit 1;; esac
echo "$*" >> `+pyArgs)
	write(filepath.Join(bin, "cuda.test"), "sleep 30")

	got, rc := runStages(t, env, "kernels", "step", "pytorch", "nccl")
	if rc != 1 || !strings.Contains(got, "FAILURES in kernels step") || !strings.Contains(got, "TIMED OUT at the stage's 3s") {
		t.Errorf("exit %d, want 1 naming kernels and step, the kernels timed out:\n%s", rc, got)
	}
	for stage, want := range map[string]string{"kernels": "failed", "step": "failed", "pytorch": "passed", "nccl": "passed"} {
		b, err := os.ReadFile(filepath.Join(out, stage, "status"))
		if err != nil || strings.TrimSpace(string(b)) != want {
			t.Errorf("%s/status: %q, %v; want %s", stage, b, err, want)
		}
		if st, err := os.Stat(filepath.Join(out, stage, "log")); err != nil || st.Size() == 0 {
			t.Errorf("%s/log: %v", stage, err)
		}
	}
	b, _ := os.ReadFile(filepath.Join(out, "step", "log"))
	if !strings.Contains(string(b), "CUDA_ERROR_OUT_OF_MEMORY") {
		t.Errorf("the step stage's log lacks the failure:\n%s", b)
	}
	b, _ = os.ReadFile(pyArgs)
	if n := strings.Count(string(b), "gpt2_step.py"); n != 5 || strings.Contains(string(b), "--hpcrun-json") {
		t.Errorf("PyTorch ran %d times, want 5 (GPT-2 fp32 and bf16, naive and sdpa; the Llama) without hpcrun's result:\n%s", n, b)
	}
	if n := strings.Count(string(b), "--model llama"); n != 1 {
		t.Errorf("the Llama peer ran %d times, want 1:\n%s", n, b)
	}

	// A step that succeeds is read beside PyTorch.
	write(filepath.Join(bin, "hpcrun"), `echo '{"tokens_per_s": 1, "peak_bytes": 1, "loss": 1}'`)
	os.Remove(pyArgs)
	if got, rc := runStages(t, env, "step", "pytorch"); rc != 0 {
		t.Fatalf("exit %d:\n%s", rc, got)
	}
	b, _ = os.ReadFile(pyArgs)
	if n := strings.Count(string(b), "--hpcrun-json "+filepath.Join(out, "step", "hpcrun-")); n != 5 {
		t.Errorf("PyTorch got hpcrun's result %d times, want 5:\n%s", n, b)
	}
	if !strings.Contains(string(b), "--hpcrun-json "+filepath.Join(out, "step", "hpcrun-llama-bf16.json")) {
		t.Errorf("the Llama peer did not get hpcrun's Llama result:\n%s", b)
	}

	if got, rc := runStages(t, env, "gemm"); rc != 2 || !strings.Contains(got, "unknown stage gemm") {
		t.Errorf("an unknown stage: exit %d:\n%s", rc, got)
	}
}

// The ncu stage profiles one bf16 and one tf32 step of hpcrun under ncu
// (NCU, else ncu on PATH), which gets the CUDA library path through the
// env it runs and leaves a per-kernel summary for each; without ncu, or
// when ncu's log holds no summary (an error alone), the stage fails and
// says why.
func TestScriptNCU(t *testing.T) {
	env, bin, log, out := stageMachine(t, "BSZ=16")
	root := filepath.Dir(bin)
	ncu := filepath.Join(root, "ncu")
	// A fake ncu: logs its arguments, writes the --log-file, runs the rest.
	body := `echo "ncu $*" >> ` + log + `
while [ $# -gt 0 ]; do
	case $1 in
	--log-file) echo '"Kernel Name","Invocations","Metric Name"' > "$2"; echo '"k","1","gpu__time_duration.sum"' >> "$2"; shift 2;;
	--csv) shift;;
	--*) shift 2;;
	*) break;;
	esac
done
exec "$@"`
	if err := os.WriteFile(ncu, []byte("#!/bin/bash\n"+body+"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	got, rc := runStages(t, append(env, "NCU="+ncu), "ncu")
	if rc != 0 {
		t.Fatalf("exit %d:\n%s", rc, got)
	}
	for _, prec := range []string{"bf16", "tf32"} {
		if b, err := os.ReadFile(filepath.Join(out, "ncu", "ncu-"+prec+".csv")); err != nil || !strings.Contains(string(b), "Kernel Name") {
			t.Errorf("ncu-%s.csv: %q, %v", prec, b, err)
		}
	}
	b, _ := os.ReadFile(log)
	for _, want := range []string{"--precision bf16", "--precision tf32", "--bsz 16", "--steps 1 --warmup 0", "--metrics gpu__time_duration.sum --clock-control none --print-summary per-kernel"} {
		if !strings.Contains(string(b), want) {
			t.Errorf("ncu's arguments lack %q:\n%s", want, b)
		}
	}
	if !strings.Contains(string(b), "hpcrun LD_LIBRARY_PATH="+filepath.Join(root, "site")) {
		t.Errorf("hpcrun under ncu did not get the CUDA library path:\n%s", b)
	}

	got, rc = runStages(t, append(env, "NCU="+filepath.Join(root, "none")), "ncu")
	if rc != 1 || !strings.Contains(got, "no ncu at") {
		t.Errorf("without ncu: exit %d:\n%s", rc, got)
	}
	// An ncu that cannot read the counters: its log holds the error alone.
	if err := os.WriteFile(ncu, []byte("#!/bin/sh\nwhile [ \"$1\" != --log-file ]; do shift; done\necho '==ERROR== ERR_NVGPUCTRPERM' > \"$2\"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	got, rc = runStages(t, append(env, "NCU="+ncu), "ncu")
	if rc != 1 || !strings.Contains(got, "ncu wrote no summary for bf16") {
		t.Errorf("an ncu that writes nothing: exit %d:\n%s", rc, got)
	}
}
