package slurm

import (
	"bytes"
	"flag"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite the golden files under testdata/")

func TestScriptGolden(t *testing.T) {
	jz := validSpec()
	jz.NTasks, jz.GPUsPerNode, jz.CPUsPerTask = 16, 8, 8
	jz.QOS, jz.Account, jz.Constraint = "qos_gpu-t3", "abc@a100", "a100"
	jz.Account = "abc"
	jz.Exclusive, jz.Checkpoint = true, true
	jz.Modules = []string{"cpuarch/amd", "cuda/12.2.0", "nccl/2.18.5-1-cuda"}
	jz.Env = map[string]string{"NCCL_DEBUG": "WARN", "OMP_NUM_THREADS": "8", "TRICKY": "a b $(c) `d` 'e' \"f\"; g\nh"}
	jz.Extra = []string{"--mail-type=END", "--comment=tp-run"}

	cpu := validSpec()
	cpu.GPUsPerNode, cpu.CPUsPerTask, cpu.Hint, cpu.Time = 0, 2, "", ""
	cpu.Partition = "debug"

	small := validSpec()
	small.NTasks = 2

	for name, s := range map[string]JobSpec{"jeanzay": jz, "cpu": cpu, "gpu-small": small} {
		t.Run(name, func(t *testing.T) {
			got, err := Script(s, "", "v1.2.3", "20261121-143005-a3f9")
			if err != nil {
				t.Fatal(err)
			}
			golden := filepath.Join("testdata", "script-"+name+".sbatch")
			if *update {
				if err := os.WriteFile(golden, got, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(golden)
			if err != nil {
				t.Fatalf("%v (run go test ./slurm -run TestScriptGolden -update)", err)
			}
			if !bytes.Equal(got, want) {
				t.Errorf("script differs from %s (rerun with -update if intended):\n%s", golden, got)
			}
			bashN(t, got)
		})
	}
}

func TestScriptUserTemplate(t *testing.T) {
	tmpl := "#!/bin/bash\n#SBATCH --job-name={{.Name}}\necho {{quote .Name}} {{.TasksPerNode}}\nsrun {{.Command}}\n"
	got, err := Script(validSpec(), tmpl, "dev", "x")
	if err != nil {
		t.Fatal(err)
	}
	want := "#!/bin/bash\n#SBATCH --job-name=bert-tp2\necho bert-tp2 4\nsrun /home/u/bin/hpcrun train --run-dir /scratch/u/runs/20261121-143005-a3f9\n"
	if string(got) != want {
		t.Errorf("got\n%s\nwant\n%s", got, want)
	}
	if _, err := Script(validSpec(), "{{.NoSuchField}}", "dev", "x"); err == nil || !strings.Contains(err.Error(), "sbatch template") {
		t.Errorf("unknown field: err = %v", err)
	}
	if _, err := Script(validSpec(), "{{if}}", "dev", "x"); err == nil {
		t.Errorf("bad template: no error")
	}
}

func bashN(t testing.TB, script []byte) {
	t.Helper()
	cmd := exec.Command("bash", "-n")
	cmd.Stdin = bytes.NewReader(script)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("bash -n: %v: %s\n%s", err, out, script)
	}
}

func TestQuote(t *testing.T) {
	for in, want := range map[string]string{
		"plain":   "plain",
		"a b":     "'a b'",
		"":        "''",
		"it's":    `'it'\''s'`,
		"$(x)":    "'$(x)'",
		"--x=1,2": "--x=1,2",
		"~":       "'~'",
	} {
		if got := Quote(in); got != want {
			t.Errorf("Quote(%q) = %s, want %s", in, got, want)
		}
	}
}

// FuzzScript renders scripts whose free-form values come from the fuzzer and
// runs them with stand-ins for srun and module that print what they were
// given: each value must come back byte for byte, and nothing inside may run.
func FuzzScript(f *testing.F) {
	for _, s := range []string{
		"$(touch pwned)", "`touch pwned`", "'; touch pwned; '", "\"$(touch pwned)\"",
		"a\nb", "x;y", "$HOME", "a\\b", "'", "\"", "!", "*", "{a,b}", "~", "-n", "%j", " ", "",
		"\t\r", "é\xff", "$'\\n'",
	} {
		f.Add(s)
	}
	bin := f.TempDir()
	stub := "#!/bin/bash\nfor a in \"$@\"; do printf '%s\\0' \"$a\"; done >>\"$OUT\"\n"
	for _, name := range []string{"srun", "module"} {
		if err := os.WriteFile(filepath.Join(bin, name), []byte(stub), 0o755); err != nil {
			f.Fatal(err)
		}
	}
	f.Fuzz(func(t *testing.T, v string) {
		dir, err := os.MkdirTemp("", "hpcrun-fuzz")
		if err != nil {
			t.Fatal(err)
		}
		defer os.RemoveAll(dir)
		s := validSpec()
		s.RunDir = dir
		s.Program = "/opt/" + v
		s.Args = []string{"train", v, "--run-dir", dir}
		want := []string{"purge", "load", v}
		s.Modules = []string{v}
		if v == "" {
			s.Modules, want = nil, nil
		}
		s.Env = map[string]string{"HPCRUN_FUZZ": v}
		s.Name = v
		s.Extra = []string{"--comment=" + v}
		s.Account = v
		script, err := Script(s, "", v, v)
		if err != nil {
			// Rejected values must be rejected on validation alone.
			s.Name, s.Extra, s.Account = "fuzz", nil, ""
			if script, err = Script(s, "", v, v); err != nil {
				if strings.ContainsRune(v, 0) {
					return
				}
				t.Fatalf("free-form value %q rejected: %v", v, err)
			}
		}
		bashN(t, script)
		path := filepath.Join(dir, "job.sbatch")
		os.WriteFile(path, append(script, "\nprintf '%s\\0' \"$HPCRUN_FUZZ\" >>\"$OUT\"\n"...), 0o644)
		out := filepath.Join(dir, "out")
		cmd := exec.Command("bash", path)
		cmd.Dir = dir
		cmd.Env = []string{"PATH=" + bin + ":/usr/bin:/bin", "OUT=" + out}
		if b, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("script failed: %v\n%s\n%s", err, b, script)
		}
		got, _ := os.ReadFile(out)
		want = append(want, "/opt/"+v, "train", v, "--run-dir", dir, v)
		wants := strings.Join(want, "\x00") + "\x00"
		if string(got) != wants {
			t.Fatalf("value %q did not round-trip:\ngot  %q\nwant %q\n%s", v, got, wants, script)
		}
		ents, _ := os.ReadDir(dir)
		for _, e := range ents {
			if e.Name() != "job.sbatch" && e.Name() != "out" {
				t.Fatalf("value %q created %s: it was run", v, e.Name())
			}
		}
	})
}

// TestScriptArray checks that a job array gets its --array line and
// per-task logs (%A_%a), and that a bad array is refused.
func TestScriptArray(t *testing.T) {
	s := JobSpec{Name: "sweep", RunDir: "/runs/sweeps/x", NTasks: 2, Resources: Resources{CPUsPerTask: 1}, Program: "/bin/hpcrun", Args: []string{"sweep", "task"}, Array: "0-5%2"}
	out, err := Script(s, "", "dev", "x")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"#SBATCH --array=0-5%2\n", "#SBATCH --output=/runs/sweeps/x/slurm-%A_%a.out\n", "#SBATCH --error=/runs/sweeps/x/slurm-%A_%a.err\n"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("array script lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(string(out), "%j") {
		t.Errorf("array script names logs by %%j:\n%s", out)
	}
	s.Array = "0-5;rm"
	if _, err := Script(s, "", "dev", "x"); err == nil || !strings.Contains(err.Error(), "array") {
		t.Errorf("bad array: %v", err)
	}
}
