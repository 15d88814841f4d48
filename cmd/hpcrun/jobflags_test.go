package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/BurntSushi/toml"
)

func TestJobFlagsOverrideProfile(t *testing.T) {
	e := newEnv(t)
	out := e.mustRun("submit", "--dry-run", "--executor", "local", "-t", "00:05:00", "-p", "gpu_p2",
		"-A", "abc@v100", "--qos", "qos_gpu-dev", "-C", "v100-32g", "--gpus-per-node", "4", "-c", "10",
		"--exclusive", "--ntasks", "8", "--tp", "2")
	for _, want := range []string{
		"#SBATCH --time=00:05:00", "#SBATCH --partition=gpu_p2", "#SBATCH --account=abc@v100",
		"#SBATCH --qos=qos_gpu-dev", "#SBATCH --constraint=v100-32g", "#SBATCH --gres=gpu:4",
		"#SBATCH --cpus-per-task=10", "#SBATCH --exclusive", "#SBATCH --nodes=2", "#SBATCH --ntasks-per-node=4",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("script lacks %q:\n%s", want, out)
		}
	}
	for _, bad := range [][]string{{"--time", "soon"}, {"--account", "a;rm -rf /"}, {"--gpus-per-node", "4", "--ntasks", "6", "--tp", "2"}} {
		if _, errOut, code := e.run(append([]string{"submit", "--dry-run", "--executor", "local"}, bad...)...); code == 0 || strings.Count(strings.TrimSpace(errOut), "\n") != 0 {
			t.Errorf("submit %v: exit %d, want one error line, got %q", bad, code, errOut)
		}
	}
}

// TestExampleProfilesSubmit renders a dry-run script for every profile of
// every example file: what the config accepts, the job spec must accept.
func TestExampleProfilesSubmit(t *testing.T) {
	files, _ := filepath.Glob("../../examples/*.toml")
	if len(files) == 0 {
		t.Fatal("no example files")
	}
	for _, f := range files {
		abs, _ := filepath.Abs(f)
		data, err := os.ReadFile(abs)
		if err != nil {
			t.Fatal(err)
		}
		var file struct {
			Profiles map[string]any `toml:"profiles"`
		}
		if _, err := toml.Decode(string(data), &file); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		for name := range file.Profiles {
			e := newEnv(t)
			out, errOut, code := e.run("submit", "--dry-run", "--executor", "local", "--config", abs, "--profile", name,
				"--device", "cpu", "--precision", "fp32")
			if code != 0 || !strings.Contains(out, "#SBATCH --job-name=") {
				t.Errorf("%s profile %s: exit %d\n%s%s", filepath.Base(f), name, code, out, errOut)
			}
		}
	}
}
