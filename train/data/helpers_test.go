package data

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/hpcrun/hpcrun/train/config"
)

// smallConfig is train's small test model of the given kind (its
// loop_test.go), whose data these tests prepare.
func smallConfig(model string) config.Config {
	cfg := config.DefaultConfig()
	cfg.Model = model
	cfg.Layers, cfg.Dim, cfg.Heads, cfg.Seq = 2, 32, 4, 16
	cfg.BatchSize, cfg.Steps, cfg.Warmup, cfg.EvalEvery, cfg.EvalSamples = 8, 20, 5, 0, 32
	cfg.Samples = 2048
	return cfg
}

// textFile writes train's test text (its loop_test.go), about 20 KB of
// five words and digits, and returns its path.
func textFile(t *testing.T) string {
	t.Helper()
	var sb strings.Builder
	words := []string{"alpha", "beta", "gamma", "delta", "epsilon"}
	for i := 0; sb.Len() < 20000; i++ {
		fmt.Fprintf(&sb, "%s %s %d. ", words[i%5], words[(i*3+1)%5], i%7)
	}
	p := filepath.Join(t.TempDir(), "text.txt")
	if err := os.WriteFile(p, []byte(sb.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// numpyPython is a python3 that imports NumPy (Debian's python3-numpy):
// the one on PATH, else the system's.
func numpyPython(t *testing.T) string {
	t.Helper()
	for _, py := range []string{"python3", "/usr/bin/python3"} {
		if exec.Command(py, "-c", "import numpy").Run() == nil {
			return py
		}
	}
	t.Fatal("no python3 with NumPy: install python3-numpy (.ci/run does)")
	return ""
}
